"""The only module that knows the order of the stages.

load → export → capture → expose/run → align → compare → localize → diagnose → report
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from . import align, capture, compare, expose, export, feeds, graph, load, localize, preflight, weights
from .diagnose import DiagnosisContext, diagnose
from .backends import make_backend
from .errors import InputError, UsageError
from .progress import Progress
from .records import Exporter, LoadedModel, ModelInputs, OutputResult, Report, Tolerance


@dataclass(frozen=True)
class Config:
    """Everything one bisection needs to know, independent of the command line."""

    model: str
    inputs: tuple[str, ...] = ()
    onnx: str | None = None
    exporter: Exporter | None = None
    opset: int | None = None
    provider: str = "CPUExecutionProvider"
    tolerance: Tolerance = field(default_factory=Tolerance)
    save_onnx: str | None = None
    ort_config: tuple[tuple[str, str], ...] = ()  # ONNX Runtime session config entries
    ort_opt_level: str = "all"


def run(config: Config, progress: Progress | None = None) -> Report:
    """Load the model and inputs named in ``config`` and bisect."""
    progress = progress or Progress(enabled=False)
    with progress.step("load", "loading the model"):
        loaded, file_module = load.load_model(config.model)
        inputs = load.load_inputs(config.inputs, loaded, file_module)
    return bisect_loaded(
        loaded, inputs, onnx_path=config.onnx, exporter=config.exporter, opset=config.opset,
        provider=config.provider, tolerance=config.tolerance, save_onnx=config.save_onnx, progress=progress,
        ort_config=dict(config.ort_config), ort_opt_level=config.ort_opt_level,
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
    ort_opt_level: str = "all",
) -> Report:
    """Bisect a PyTorch ``model`` against its ONNX export (or the given ONNX model).

    ``inputs`` is a tensor, an array, a tuple of them (positional arguments) or
    a dict (keyword arguments).  Returns a :class:`Report`; ``report.ok`` tells
    whether the final outputs agree within ``atol``/``rtol``.
    """
    loaded = LoadedModel(
        module=model, name=type(model).__name__, source="<python>", was_training=bool(model.training),
        forward_params=load._forward_params(model),
    )
    model_inputs = load.to_model_inputs(inputs, loaded)
    return bisect_loaded(
        loaded, model_inputs, onnx_path=onnx, exporter=Exporter(exporter) if exporter else None, opset=opset,
        provider=provider, tolerance=Tolerance(atol, rtol), save_onnx=save_onnx, ort_config=ort_config,
        ort_opt_level=ort_opt_level,
    )


def bisect_loaded(
    loaded: LoadedModel,
    inputs: ModelInputs,
    *,
    onnx_path: str | onnx.ModelProto | None,
    exporter: Exporter | None,
    opset: int | None,
    provider: str,
    tolerance: Tolerance,
    save_onnx: str | None = None,
    progress: Progress | None = None,
    ort_config: dict[str, str] | None = None,
    ort_opt_level: str = "all",
) -> Report:
    """Run every stage on an already loaded model and inputs."""
    progress = progress or Progress(enabled=False)
    backend = make_backend(provider, ort_config, ort_opt_level)
    with progress.step("capture", "running PyTorch with forward hooks"):
        captured = _capture(loaded, inputs)
    if onnx_path is None:
        with progress.step("export", f"exporting to ONNX ({(exporter or Exporter.DYNAMO).value})"):
            exported = export.export_model(loaded, inputs, exporter, opset)
    elif isinstance(onnx_path, str):
        exported = export.load_onnx(onnx_path)
    else:
        exported = export.ExportedModel(proto=onnx_path, exporter=Exporter.GIVEN, opset=export.opset_of(onnx_path))
    with progress.step("prepare", "indexing the ONNX graph"):
        skeleton, weight_store = (
            (exported.proto, exported.weights) if exported.weights is not None else weights.split_weights(exported.proto)
        )
        model_feeds, feed_warnings = feeds.make_feeds(inputs, skeleton, loaded.forward_params)
        where = f"ONNX model '{exported.path}'" if exported.path else "The exported ONNX model"
        skeleton = export.validate_onnx(skeleton, where, {k: v.shape for k, v in model_feeds.items()})
        index = graph.index_graph(skeleton)
        scopes = align.map_scopes(captured, index)
        candidates = align.candidate_tensors(captured, index, scopes)
    with progress.step("preflight", "checking the model before running it"):
        preflight_warnings = preflight.check_model(loaded, inputs, skeleton, weight_store, exported, backend, captured)
    if save_onnx:
        _save(weights.join_weights(skeleton, weight_store) if exported.weights is not None else exported.proto, save_onnx)
    # First, while no instrumented values are held: its session has the largest footprint.
    with progress.step("final", "running the unmodified ONNX model"):
        # The same graph and the same weight bytes as the user's file, with the
        # user's session settings: only the weights' storage differs.
        final = backend.run(skeleton, model_feeds, None, weight_store)
    with progress.step("probe", f"running ONNX Runtime with {len(candidates)} tensors exposed"):
        probed = backend.run(
            expose.expose_tensors(skeleton, candidates), model_feeds, candidates, weight_store, one_shot=True
        )
    with progress.step("align", "aligning PyTorch activations with ONNX tensors"):
        pairs = align.align_activations(captured, index, scopes, probed)
        cuts = localize.cut_points(pairs, index)
        kept = {p.tensor for p in pairs} | set(index.graph_outputs)
        probed = {t: v for t, v in probed.items() if t in kept}  # free the candidates nobody matched
    with progress.step("local", f"measuring local error at {len(cuts)} cut points"):
        references = {t: _in_onnx_layout(p.reference(), probed[t]) for t, p in cuts.items()}
        ref_feeds = dict(model_feeds)
        ref_feeds.update({expose.reference_input_name(t): v for t, v in references.items()})

        def local_run(model, store, optimize: bool = True):
            """Run ``model`` cut at the same tensors, every segment fed PyTorch values."""
            return backend.run(expose.cut_at_tensors(model, references), ref_feeds, list(cuts), store,
                               one_shot=True, optimize=optimize)

        local_values = local_run(skeleton, weight_store)
    with progress.step("report", "comparing"):
        cmp = functools.partial(_compare, tol=tolerance)
        reproduced = _reproduces(captured, index, probed, final, tolerance)
        layers = localize.localize(pairs, index, probed, local_values, cuts, cmp, accumulated_reliable=reproduced)
        outputs = _compare_outputs(captured, index, final, tolerance)
        ok = all(o.diff.ok for o in outputs)
        warnings = list(feed_warnings) + list(preflight_warnings) + _warnings(loaded, captured, index, outputs, probed, tolerance)
        first, layer, introduced = None, None, False
        if not ok:
            layer, introduced = localize.first_divergence(layers)
            if layer is None:
                warnings.append(
                    "The final outputs diverge, but no aligned tensor does: the divergence lies after the "
                    "last aligned tensor or in a part of the graph no activation maps to."
                )
    if not ok and layer is not None:
        with progress.step("diagnose", "diagnosing the first divergence"):
            first = diagnose(DiagnosisContext(
                layer=layer, introduced=introduced, layers=layers, graph=index, skeleton=skeleton,
                weights=weight_store, loaded=loaded, exported=exported, capture=captured, references=references,
                feeds=model_feeds, tolerance=tolerance, local_run=local_run, compare=cmp,
                backend=backend, inputs=inputs,
            ))
    return Report(
        ok=ok, tolerance=tolerance, exporter=exported.exporter, opset=exported.opset, provider=backend.name,
        outputs=outputs, first_divergence=first, layers=layers, warnings=tuple(warnings),
        notes=exported.notes, timings=dict(progress.timings), model_name=loaded.name,
    )


def _capture(loaded: LoadedModel, inputs: ModelInputs):
    try:
        return capture.capture_activations(loaded.module, inputs)
    except Exception as exc:
        shapes = ", ".join(
            f"{n}: {getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', []))}"
            for n, v in zip(inputs.names, inputs.args)
        )
        raise InputError(
            f"Running the PyTorch model on the given inputs failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}). Given: {shapes or 'no positional inputs'}. "
            "Check the number, order, shapes and dtypes of the --input files."
        ) from exc


def _compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance):
    return compare.compare_tensors(actual, expected, tol)


def _compare_outputs(captured, index, final, tol) -> tuple[OutputResult, ...]:
    results = []
    for name, ref in zip(index.graph_outputs, captured.outputs):
        if name in final:
            results.append(OutputResult(name, compare.compare_tensors(final[name], ref, tol)))
    return tuple(results)


def _warnings(loaded, captured, index, outputs, probed, tol) -> list[str]:
    notes = []
    if loaded.was_training:
        notes.append(
            "The model came in training mode; onnx-bisect ran and exported it in eval mode. If your "
            "deployment exported it in training mode, Dropout and BatchNorm batch statistics will differ."
        )
    if len(captured.outputs) != len(index.graph_outputs):
        notes.append(
            f"PyTorch returned {len(captured.outputs)} output tensor(s) but the ONNX graph has "
            f"{len(index.graph_outputs)}; only the first {min(len(captured.outputs), len(index.graph_outputs))} "
            "were compared, by position."
        )
    if not _reproduces(captured, index, probed, {o.name: None for o in outputs}, tol, outputs):
        notes.append(
            "The instrumented run disagrees with the unmodified model at the outputs: exposing intermediate "
            "tensors changed how ONNX Runtime optimised the graph, so the accumulated errors in the table may "
            "not be those of the shipped graph (the local errors come from a graph that keeps those fusions)."
        )
    return notes


def _reproduces(captured, index, probed, final, tol, outputs=None) -> bool:
    """Whether the instrumented run reaches the same verdict as the unmodified one at every output."""
    for i, name in enumerate(index.graph_outputs[: len(captured.outputs)]):
        inst = probed.get(name)
        if inst is None:
            continue
        shipped = next((o.diff.ok for o in outputs if o.name == name), None) if outputs is not None else (
            compare.compare_tensors(final[name], captured.outputs[i], tol).ok if name in final else None)
        if shipped is not None and shipped != compare.compare_tensors(inst, captured.outputs[i], tol).ok:
            return False
    return True


def _in_onnx_layout(reference: np.ndarray, onnx_value: np.ndarray) -> np.ndarray:
    """The reference with the ONNX tensor's dtype and shape, ready to feed."""
    return np.ascontiguousarray(reference.astype(onnx_value.dtype, copy=False).reshape(onnx_value.shape))


def _save(proto: onnx.ModelProto, path: str) -> None:
    from .report import write_atomic

    try:
        data = proto.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise UsageError(f"The model is too large for one ONNX file ({exc}); save it with external data "
                         "yourself (onnx.save_model(..., save_as_external_data=True)).") from exc
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"Cannot write --save-onnx '{path}': {exc.strerror or exc}. Choose a writable path.") from exc
