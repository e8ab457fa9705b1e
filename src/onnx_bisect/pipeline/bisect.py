"""The single bisection: load, capture, export or open the file, prepare, then one case through the stages.

load → export → capture → expose/run → align → compare → localize → diagnose → report
"""
from __future__ import annotations

from typing import Any

import onnx

from ..records import Exporter, LoadedModel, ModelInputs, OptLevel, Report, RuntimeSettings, Tolerance
from ..report.progress import Progress
from ..run.backend import make_backend
from ..source import load
from .case import bisect_case
from .config import CasePolicy, Config
from .prepare import capture_case, loaded_from_module, obtain_onnx, prepare, with_program_ops
from .runner import Runner
from .workspace import workspace


def run(config: Config, progress: Progress | None = None) -> Report:
    """Load the model and inputs named in ``config`` and bisect."""
    progress = progress or Progress(enabled=False)
    with progress.step("load", "loading the model"):
        loaded, file_module = load.load_model(config.model)
        inputs = load.load_inputs(config.inputs, loaded, file_module)
    return bisect_loaded(
        loaded, inputs, onnx_path=config.onnx, exporter=config.exporter, opset=config.opset,
        runtime=config.runtime, tolerance=config.tolerance, save_onnx=config.save_onnx, progress=progress,
    )


def bisect(
    model: Any,
    inputs: Any,
    onnx: str | onnx.ModelProto | None = None,
    *,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    exporter: str | None = None,
    opset: int | None = None,
    provider: str = "CPUExecutionProvider",
    save_onnx: str | None = None,
    ort_config: dict[str, str] | None = None,
    ort_opt_level: str | OptLevel = OptLevel.ALL,
) -> Report:
    """Bisect a PyTorch ``model`` against its ONNX export (or the given ONNX model).

    ``inputs`` is a tensor, an array, a tuple of them (positional arguments) or
    a dict (keyword arguments).  Returns a :class:`Report`; ``report.ok`` tells
    whether the final outputs agree within ``atol``/``rtol``.
    """
    loaded = loaded_from_module(model)
    model_inputs = load.to_model_inputs(inputs, loaded)
    from .specs import parse_provider

    name, options = parse_provider(provider)
    return bisect_loaded(
        loaded, model_inputs, onnx_path=onnx, exporter=Exporter(exporter) if exporter else None, opset=opset,
        runtime=RuntimeSettings(name, options, ort_opt_level, tuple((ort_config or {}).items())),
        tolerance=Tolerance(atol, rtol), save_onnx=save_onnx,
    )


def bisect_loaded(
    loaded: LoadedModel,
    inputs: ModelInputs,
    *,
    onnx_path: str | onnx.ModelProto | None,
    exporter: Exporter | None,
    opset: int | None,
    runtime: RuntimeSettings | None = None,
    tolerance: Tolerance,
    save_onnx: str | None = None,
    progress: Progress | None = None,
) -> Report:
    """Run every stage on an already loaded model and inputs."""
    progress = progress or Progress(enabled=False)
    backend = make_backend(runtime)
    with workspace() as folder:
        with progress.step("capture", "running PyTorch with forward hooks"):
            captured = capture_case(loaded, inputs)
        exported = obtain_onnx(loaded, inputs, onnx_path, exporter, opset, progress, folder=folder)
        captured = with_program_ops(captured, exported, inputs, progress)
        prepared = prepare(loaded, inputs, captured, exported, backend=backend, save_onnx=save_onnx, progress=progress)
        return bisect_case(prepared, Runner(prepared, backend), inputs, captured, policy=CasePolicy(tolerance),
                           progress=progress).report


__all__ = ["Config", "bisect", "bisect_loaded", "loaded_from_module", "run"]
