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
