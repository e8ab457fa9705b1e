"""Shared test helpers: run the command line in a subprocess, write tiny model files."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper


def pytest_configure(config):
    """Under pytest-xdist (the suite's default: ``addopts`` in pyproject.toml), the machine's cores shared among
    the workers: each worker's PyTorch (and the command lines it starts) computes with its share of threads."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if workers > 1:
        threads = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        import torch

        torch.set_num_threads(threads)


@dataclass(frozen=True)
class CliResult:
    """What one ``onnx-bisect`` run printed and returned; ``json`` is the ``--json`` report, if written."""

    stdout: str
    stderr: str
    exit_status: int
    json: Any = None


def run_cli(*argv: Any, cwd: str | Path | None = None) -> CliResult:
    """Run ``python -m onnx_bisect ARGV...`` and collect the result (and the --json report, if any)."""
    args = [str(a) for a in argv]
    proc = subprocess.run(
        [sys.executable, "-m", "onnx_bisect", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    report = None
    if "--json" in args and proc.returncode in (0, 1):
        path = Path(cwd or ".", args[args.index("--json") + 1])
        report = json.loads(path.read_text()) if path.is_file() else None
    return CliResult(proc.stdout, proc.stderr, proc.returncode, report)


def run_cli_in_process(*argv: Any) -> CliResult:
    """Run the command line's ``main(ARGV)`` in this process, its stdout and stderr captured: what ``run_cli``
    sees, without a subprocess's ~2 s of importing torch (no --json report is read)."""
    import contextlib
    import io

    from onnx_bisect.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main([str(a) for a in argv])
        except SystemExit as exc:  # argparse's own usage errors
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return CliResult(out.getvalue(), err.getvalue(), int(status), None)


def write_source(path: Path, source: str) -> Path:
    """Write dedented Python source to ``path``."""
    path.write_text(textwrap.dedent(source).lstrip())
    return path


MLP_SOURCE = """
    import torch

    class TinyMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(self.fc(x))

    def get_model():
        torch.manual_seed(0)
        return TinyMLP().eval()

    def get_inputs():
        torch.manual_seed(1)
        return (torch.randn(2, 4),)
"""


def tiny_onnx(node: onnx.NodeProto | None = None, shape=(2, 4)) -> onnx.ModelProto:
    """A one-node ONNX model ``y = node(x)`` (Relu by default) with a static float input."""
    node = node or helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph(
        [node], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def make_tiny_model_dir(path: Path) -> Path:
    """Fill ``path`` with ``mlp.py`` (get_model/get_inputs), ``x.npy`` (2x4 float32) and ``relu.onnx`` (x[2,4])."""
    write_source(path / "mlp.py", MLP_SOURCE)
    np.save(path / "x.npy", np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32))
    onnx.save(tiny_onnx(), path / "relu.onnx")
    return path


@pytest.fixture
def tiny_model_dir(tmp_path: Path) -> Path:
    """``tmp_path`` filled by :func:`make_tiny_model_dir`."""
    return make_tiny_model_dir(tmp_path)


def plant_module():
    """``scripts/plant.py``, the reusable fault planters, imported as a module."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "scripts" / "plant.py"
    spec = importlib.util.spec_from_file_location("plant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
