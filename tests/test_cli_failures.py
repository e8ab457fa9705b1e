"""Runs that end for reasons other than the input: a tool or runtime failure (exit 3), Ctrl-C (130), SIGTERM (143).

Each ends with one line on stderr and no traceback (``--debug`` shows it), and leaves no partial output and no
temporary file behind.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BERT = [FIXTURES / "models" / "bert.py", "--input", FIXTURES / "inputs" / "bert.npy"]
MLP = [FIXTURES / "models" / "mlp.py", "--onnx", FIXTURES / "onnx" / "mlp.dynamo.onnx", "--input",
       FIXTURES / "inputs" / "mlp.npy"]


def _run_patched(patch: str, argv: list, tmp_path: Path) -> subprocess.CompletedProcess:
    """The command line in a fresh process after ``patch`` (Python source) has changed the tool's internals."""
    script = textwrap.dedent(f"""
        import sys
        {textwrap.indent(textwrap.dedent(patch), "        ").strip()}
        from onnx_bisect.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    return subprocess.run([sys.executable, "-c", script, *map(str, argv)], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)})


def test_onnx_runtime_failing_on_the_instrumented_graph_is_a_failure_not_bad_input(tmp_path):
    patch = """
        from onnx_bisect.errors import BackendError
        from onnx_bisect.pipeline import runner
        real = runner.Runner._session
        def broken(self, role, build):
            if role == "probe":
                raise BackendError("ONNX Runtime failed while running the model (RuntimeException: boom)")
            return real(self, role, build)
        runner.Runner._session = broken
    """
    result = _run_patched(patch, MLP + ["--json", tmp_path / "r.json"], tmp_path)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("onnx-bisect: failure:")
    assert "not of your model" in lines[0] and "--debug" in lines[0] and "boom" in lines[0]
    assert not (tmp_path / "r.json").exists()


def test_an_unexpected_exception_is_a_failure_in_one_line_and_a_traceback_with_debug(tmp_path):
    patch = """
        from onnx_bisect import align
        def broken(*a, **k):
            raise ZeroDivisionError("a bug")
        align.align_activations = broken
    """
    argv = MLP
    result = _run_patched(patch, argv, tmp_path)
    assert result.returncode == 3
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "unexpected ZeroDivisionError: a bug" in result.stderr and "not a problem with your input" in result.stderr
    assert "Traceback" not in result.stderr
    debug = _run_patched(patch, argv + ["--debug"], tmp_path)
    assert "Traceback" in debug.stderr and "ZeroDivisionError" in debug.stderr


CNN_FAULT = [FIXTURES / "models" / "cnn.py", "--onnx", FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx"]
#: where the signal arrives: the function is patched to mark the moment, then to stall inside that step
STAGES = {
    "export": ("onnx_bisect.source.export", "export_model", BERT),
    "onnx-runtime-session": ("onnx_bisect.pipeline.runner.Runner", "_session", CNN_FAULT),
    "diagnosis": ("onnx_bisect.pipeline.explain", "diagnose", CNN_FAULT),
}


def _interrupt(sig: int, stage: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """Run the CLI, send ``sig`` while it is inside ``stage`` (after a temporary folder and the report's
    directory exist), and return the finished process and its TMPDIR."""
    report = tmp_path / "out" / "report.json"
    report.parent.mkdir()
    scratch, marker = tmp_path / "tmp", tmp_path / "inside"
    scratch.mkdir()
    owner, name, argv = STAGES[stage]
    script = textwrap.dedent(f"""
        import importlib, pathlib, sys, time
        owner = "{owner}"
        if owner.endswith(".Runner"):
            holder = importlib.import_module(owner.rsplit(".", 1)[0]).Runner
        else:
            holder = importlib.import_module(owner)
        real = getattr(holder, "{name}")
        def stalled(*a, **k):
            pathlib.Path({str(marker)!r}).write_text("in")
            time.sleep(120)
            return real(*a, **k)
        setattr(holder, "{name}", stalled)
        from onnx_bisect.cli import main
        sys.exit(main(sys.argv[1:]))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script, *map(str, argv), "--json", str(report)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(scratch)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), f"the run never reached {stage} (exit {proc.poll()})"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), scratch


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("sig, status, word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_an_interrupted_run_leaves_nothing_behind(sig, status, word, stage, tmp_path):
    result, scratch = _interrupt(sig, stage, tmp_path)
    assert result.returncode == status, result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert word in result.stderr and "Traceback" not in result.stderr
    assert not list((tmp_path / "out").iterdir()), "no report, no half-written temporary report"
    assert not list(scratch.iterdir()), "no temporary file left in TMPDIR"


def test_a_run_writes_nothing_but_its_outputs(tmp_path):
    home, scratch = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    env_before = {k: os.environ.get(k) for k in ("HOME", "TMPDIR")}
    os.environ.update(HOME=str(home), TMPDIR=str(scratch))
    try:
        result = run_cli(*MLP, "--json", tmp_path / "r.json")
    finally:
        for k, v in env_before.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert result.exit_status == 0, result.stderr
    # ONNX Runtime's usage telemetry would write ~/.cache/Microsoft/DeveloperTools and $TMPDIR/.ses
    assert not [str(p) for p in home.rglob("*")] and not [str(p) for p in scratch.rglob("*")]


def test_outputs_written_atomically_get_ordinary_permissions(tmp_path):
    """The temporary file an output is written through is private (mkstemp); the output itself is not."""
    old = os.umask(0o022)
    try:
        result = run_cli(*MLP, "--json", tmp_path / "r.json", "--html", tmp_path / "r.html")
    finally:
        os.umask(old)
    assert result.exit_status == 0, result.stderr
    assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in ("r.json", "r.html")} == {oct(0o644)}


def test_an_output_interrupted_while_written_leaves_nothing(tmp_path):
    from onnx_bisect.report import files

    with pytest.raises(KeyboardInterrupt):
        with files._replacing(tmp_path / "r.json") as f:
            f.write(b"half a report")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_a_file_keeping_initializers_no_node_reads_is_debugged_like_any_other(tmp_path):
    """A hand-edited file keeps weights it no longer uses (ONNX allows it; ONNX Runtime drops them when it
    loads the file): handing those arrays to a session made ONNX Runtime fail on their names (exit 3)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(FIXTURES / "onnx" / "mlp.dynamo.onnx")
    model.graph.initializer.append(numpy_helper.from_array(np.ones((64, 64), np.float32), "stale_weight"))
    onnx.save(model, tmp_path / "stale.onnx")
    argv = [MLP[0], "--onnx", tmp_path / "stale.onnx", *MLP[3:], "--json", tmp_path / "r.json"]
    result = run_cli(*argv, cwd=tmp_path)
    assert result.exit_status == 0, result.stderr
    assert result.json["ok"] is True and result.json["first_divergence"] is None
