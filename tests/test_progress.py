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


def test_a_phase_restarts_the_estimate_and_names_itself_and_an_unknown_total_gives_no_estimate(monkeypatch):
    from onnx_bisect.report import progress as module

    clock = iter([20.0, 21.0, 30.0, 31.0, 32.0, 40.0])
    monkeypatch.setattr(module.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    progress = Progress(enabled=True, stream=out)
    progress._current = ("exporting", 0.0)
    progress.advance(1, 0, "translating")  # 20.0: the phase starts; its total is not known yet
    progress.advance(2, 10, "tracing")  # 21.0: a new phase, its clock starts here
    progress.advance(10, 10, "tracing")  # 30.0: 9 s for 10 calls from 21.0
    progress.advance(11, 10, "tracing")  # past the total: nothing new
    progress.advance(0, 0, "optimizing")  # 31.0: a phase without counts is named at once
    lines = out.getvalue().split("\r")[1:]
    assert lines[0].startswith("[onnx-bisect] exporting… translating: 1 ") and "left" not in lines[0]
    assert lines[1].startswith("[onnx-bisect] exporting… tracing: 2/10, about 0 s left")
    assert lines[2].startswith("[onnx-bisect] exporting… tracing: 10/10, about 0 s left")
    assert lines[3].startswith("[onnx-bisect] exporting… optimizing…") and len(lines) == 4
    assert len(lines[3]) >= len(lines[2])  # a shorter line pads over the longer one before it


def test_an_export_tells_its_module_calls_its_translated_nodes_and_its_phases_and_leaves_logging_as_it_was(
        tmp_path, caplog):
    import logging

    import torch

    from onnx_bisect.records import Exporter, LoadedModel, ModelInputs
    from onnx_bisect.source import export_progress as ep
    from onnx_bisect.source.export import export_model

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Sequential(torch.nn.Linear(8, 2)))
    loaded = LoadedModel(module=model, name="m", source="inline", was_training=False, forward_params=("x",))
    heard: list[tuple[str, int, int]] = []
    logger = logging.getLogger(ep.TRANSLATION_LOGGER)
    level, filters = logger.level, list(logger.filters)
    with caplog.at_level(logging.INFO):
        export_model(loaded, ModelInputs((torch.randn(3, 4),), {}, ("x",)), Exporter.DYNAMO, folder=tmp_path,
                     on_progress=lambda *event: heard.append(event))
    phases = list(dict.fromkeys(p for p, _, _ in heard))
    assert phases == [ep.TRACING, ep.TRANSLATING, ep.OPTIMIZING, ep.WRITING]
    traced = [(d, t) for p, d, t in heard if p == ep.TRACING]
    assert traced[-1] == (5, 5)  # the root, the two Linears, the GELU, the inner Sequential
    translated = [(d, t) for p, d, t in heard if p == ep.TRANSLATING and t]
    assert translated and translated[-1][0] == translated[-1][1] >= 4  # every FX node, out of the graph's
    assert logger.level == level and logger.filters == filters
    assert not [r for r in caplog.records if r.name == ep.TRANSLATION_LOGGER]  # none of its records leaked


def test_progress_reaches_the_terminal_while_the_exporters_silence_descriptor_2():
    """The exporters point descriptor 2 at /dev/null while they run; progress writes to its own copy of the
    descriptor it was given, so the export's phases still show."""
    import os

    from onnx_bisect.report.progress import _own_copy

    read, write = os.pipe()
    with os.fdopen(write, "w") as original:
        copy = _own_copy(original)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, original.fileno())  # what the exporters do to descriptor 2
        os.close(devnull)
        copy.write("tracing the model: 3/5\n")
        copy.close()
    with os.fdopen(read) as pipe:
        assert pipe.read() == "tracing the model: 3/5\n"
