"""Progress lines: steps timed, their peak memory recorded, windows advancing with an estimate of the time left."""
from __future__ import annotations

import io

from onnx_bisect.report.progress import Progress, peak_rss_mb


def test_a_step_records_its_time_and_the_peak_memory_and_windows_say_what_is_left():
    out = io.StringIO()
    progress = Progress(enabled=True, stream=out)
    with progress.step("probe", "running ONNX Runtime"):
        progress.advance(1, 4)
        progress.advance(4, 4)
    text = out.getvalue()
    assert text.startswith("[onnx-bisect] running ONNX Runtime…")
    assert "\r[onnx-bisect] running ONNX Runtime… 1/4, about " in text and "s left" in text
    assert "4/4, about 0 s left" in text and text.endswith(" s\n")
    assert progress.timings["probe"] >= 0 and 0 < progress.peaks["probe"] <= peak_rss_mb()


def test_a_quiet_progress_still_keeps_the_numbers():
    progress = Progress(enabled=False, stream=io.StringIO())
    with progress.step("final", "x"):
        progress.advance(1, 2)
    assert progress.stream.getvalue() == "" and set(progress.timings) == set(progress.peaks) == {"final"}


def test_the_time_left_is_the_mean_time_of_a_part_times_the_parts_left_at_most_twice_a_second(monkeypatch):
    from onnx_bisect.report import progress as module

    clock = iter([12.0, 12.1, 14.0])  # part 1 done 2 s into the step, part 2 too soon after, part 3
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    progress = Progress(enabled=True, stream=out)
    progress._current = ("probe", 10.0)  # inside a step that started at 10.0
    progress.advance(1, 4)  # 2 s for one part, 3 left
    progress.advance(2, 4)  # 0.1 s later: not shown
    progress.advance(3, 4)  # 4 s for three parts, 1 left
    text = out.getvalue()
    assert "1/4, about 6 s left" in text and "2/4" not in text and "3/4, about 1 s left" in text
