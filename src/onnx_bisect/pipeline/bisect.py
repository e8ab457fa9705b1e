"""The single bisection: load, capture, export or open the file, prepare, then one case through the stages.

load → export → capture → expose/run → align → compare → localize → diagnose → report
"""
from __future__ import annotations

import dataclasses
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
from . import memory
from ..records.store import ArrayStore


def run(config: Config, progress: Progress | None = None) -> Report:
    """Load the model and inputs named in ``config`` and bisect."""
    progress = progress or Progress(enabled=False)
    with progress.step("load", "loading the model"):
        loaded, file_module = load.load_model(config.model)
        inputs = load.load_inputs(config.inputs, loaded, file_module)
    return bisect_loaded(
        loaded, inputs, onnx_path=config.onnx, exporter=config.exporter, opset=config.opset,
        runtime=config.runtime, tolerance=config.tolerance, save_onnx=config.save_onnx, progress=progress,
        keep_repro=config.keep_repro, low_memory=config.low_memory, window_mb=config.window_mb,
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
    extractable: bool = True,
    low_memory: bool = False,
    window_mb: float | None = None,
) -> Report:
    """Bisect a PyTorch ``model`` against its ONNX export (or the given ONNX model).

    ``inputs`` is a tensor, an array, a tuple of them (positional arguments) or
    a dict (keyword arguments).  Returns a :class:`Report`; ``report.ok`` tells
    whether the final outputs agree within ``atol``/``rtol``.  ``report.to_html()``
    renders it; with ``extractable`` (the default) a diverging report keeps its
    first divergent segment, so that ``report.extract(folder)`` writes the repro
    (one segment's inputs and weights; ``extractable=False`` keeps nothing).
    ``low_memory=True`` holds one framework's weights at a time (see
    :mod:`onnx_bisect.pipeline.memory`; the command line decides by itself, from
    the model's size): the module's parameters and buffers are then replaced by
    memory-mapped tensors of equal value, which they stay after the call (an
    optimizer holding the old ones would no longer update the module).
    ``window_mb`` exposes intermediate tensors in windows of at most that many
    MiB (automatic in low-memory runs).
    """
    loaded = loaded_from_module(model)
    model_inputs = load.to_model_inputs(inputs, loaded)
    from .specs import parse_provider

    name, options = parse_provider(provider)
    return bisect_loaded(
        loaded, model_inputs, onnx_path=onnx, exporter=Exporter(exporter) if exporter else None, opset=opset,
        runtime=RuntimeSettings(name, options, ort_opt_level, tuple((ort_config or {}).items())),
        tolerance=Tolerance(atol, rtol), save_onnx=save_onnx, keep_repro=extractable, low_memory=low_memory,
        window_mb=window_mb,
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
    keep_repro: bool = False,
    low_memory: bool | None = None,
    window_mb: float | None = None,
) -> Report:
    """Run every stage on an already loaded model and inputs (``keep_repro``: keep the divergent segment
    standalone in ``Report.repro``; ``low_memory``, ``window_mb``: see :mod:`.memory`)."""
    progress = progress or Progress(enabled=False)
    backend = make_backend(runtime)
    low = memory.wants_low_memory(loaded.module, low_memory)
    with workspace() as folder:
        store = ArrayStore(folder) if low else None
        with progress.step("capture", "running PyTorch with forward hooks"):
            captured = capture_case(loaded, inputs, store=store, progress=progress)
        exported = obtain_onnx(loaded, inputs, onnx_path, exporter, opset, progress, folder=folder)
        captured = with_program_ops(captured, exported, inputs, progress, store)
        if low:
            exported = dataclasses.replace(exported, program=None)  # the exported program holds the weights
        prepared = prepare(loaded, inputs, captured, exported, backend=backend, save_onnx=save_onnx, progress=progress)
        if low:
            prepared = memory.release_pytorch(prepared, folder, progress, forced=bool(low_memory))
        budget = memory.window_budget(window_mb, low, memory.weight_bytes(loaded.module) if low else 0)
        runner = Runner(prepared, backend, window_bytes=budget, store=store, progress=progress)
        policy = CasePolicy(tolerance, keep_repro=keep_repro)
        return bisect_case(prepared, runner, inputs, captured, policy=policy, progress=progress).report


__all__ = ["Config", "bisect", "bisect_loaded", "loaded_from_module", "run"]
