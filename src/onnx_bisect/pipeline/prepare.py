"""What every input case shares: the PyTorch capture, the ONNX model (exported or loaded), its graph index,
scope map and preflight warnings."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .. import align
from ..align import ops as op_pairs
from ..capture import modules as capture
from ..capture import ops
from ..diagnose import preflight
from ..coverage.export_problems import format_problem
from ..coverage.records import ProblemKind
from ..errors import FAILURE, BisectError, ExportError, InputError, UsageError
from ..records import Capture, Exporter, ExportedModel, LoadedModel, ModelInputs
from ..records.graph import GraphIndex
from ..records.store import ArrayStore
from ..records.weights import Weights
from ..report.files import copy_atomic, write_atomic
from ..report.progress import Progress
from ..run.backend import Backend
from ..source import caches, export, external, feeds, graph, load, onnx_file, weights


@dataclass(frozen=True)
class Prepared:
    """What every input case shares: the model, its ONNX graph, the scope map and preflight warnings."""

    loaded: LoadedModel
    exported: ExportedModel
    skeleton: onnx.ModelProto  # shape-inferred (free dimensions stay symbolic), large weights split off
    weights: Weights
    index: GraphIndex  # shapes pinned to the sample's
    scopes: align.ScopeMap
    candidates: tuple[str, ...]  # the tensors the probe exposes
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # facts about the file that are no problem in themselves (a fixed batch size)
    weight_differences: tuple = ()  # preflight.WeightDifference: initializers unlike the parameters they pair with
    reference_weights: dict[str, np.ndarray] | None = field(default=None, repr=False)  # --reference's initializers
    low_memory: bool = False  # the PyTorch weights are memory-mapped from disk (see pipeline.memory)


def loaded_from_module(model: Any) -> LoadedModel:
    """A :class:`LoadedModel` for an ``nn.Module`` handed over from Python."""
    caches.register_caches(model)
    return LoadedModel(module=model, name=type(model).__name__, source="<python>", was_training=bool(model.training),
                       forward_params=load.forward_params(model))


def capture_case(loaded: LoadedModel, inputs: ModelInputs, outputs_only: bool = False,
                 store: ArrayStore | None = None, progress: Progress | None = None) -> Capture:
    """The PyTorch reference run (every activation, or ``outputs_only``; into ``store`` when given; module
    calls told to ``progress``); a failure is the user's input problem, said in one paragraph."""
    try:
        if outputs_only:
            return capture.capture_outputs(loaded.module, inputs)
        return capture.capture_activations(loaded.module, inputs, store, progress.advance if progress else None)
    except Exception as exc:
        shapes = ", ".join(
            f"{n}: {getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', []))}"
            for n, v in zip(inputs.names, inputs.args)
        )
        raise InputError(
            f"Running the PyTorch model on the given inputs failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}). Given: "
            f"{shapes or 'no positional inputs'}. Check the number, order, shapes and dtypes of the --input files."
        ) from exc


def with_program_ops(captured: Capture, exported: ExportedModel, inputs: ModelInputs, progress: Progress,
                     store: ArrayStore | None = None) -> Capture:
    """``captured`` plus every op of the exported program that kept its value in the ONNX graph (dynamo
    exports made here; their values into ``store`` when given); unchanged for a given file."""
    if exported.program is None:
        return captured
    with progress.step("capture", "running the exported program op by op"):
        values = frozenset(t for n in exported.proto.graph.node for t in n.output)
        return ops.with_ops(captured, ops.capture_ops(exported.program, inputs, len(captured.activations), values,
                                                      store))


def obtain_onnx(loaded: LoadedModel, inputs: ModelInputs, onnx_path: str | onnx.ModelProto | None,
                exporter: Exporter | None, opset: int | None, progress: Progress,
                dynamic_axes: dict[str, dict[int, str]] | None = None, folder=None) -> ExportedModel:
    """Export the model (``onnx_path`` None) into ``folder`` (a private one: the run's workspace), or load
    the given file or proto."""
    if onnx_path is None:
        with progress.step("export", f"exporting to ONNX ({(exporter or Exporter.DYNAMO).value})"):
            try:
                return export.export_model(loaded, inputs, exporter, opset, dynamic_axes, folder,
                                           on_progress=lambda phase, done, total: progress.advance(done, total, phase))
            except ExportError as exc:
                raise _triaged(exc, loaded, inputs) from exc.__cause__
    if isinstance(onnx_path, str):
        return onnx_file.load_onnx(onnx_path)
    return ExportedModel(proto=onnx_path, exporter=Exporter.GIVEN, opset=onnx_file.opset_of(onnx_path))


#: export problems the user can act on (rewrite the operator, the control flow, the Python op)
ACTIONABLE = frozenset({ProblemKind.NO_LOWERING, ProblemKind.DATA_DEPENDENT, ProblemKind.PYTHON_OP})


def _triaged(exc: ExportError, loaded: LoadedModel, inputs: ModelInputs) -> ExportError:
    """``exc`` with the coverage triage of its failures (operator, source line, exporter message) appended, and
    its exit status: bad input when every failure is one the user can act on, else an exporter failure."""
    if all(isinstance(e, BisectError) for _, e in exc.failures):
        return ExportError(str(exc), exc.failures)  # our own refusal (dynamic axes the exporter cannot mark)
    try:
        from .coverage import explain_export_failures

        problems = explain_export_failures(loaded.module, inputs, exc.failures, loaded.source)
    except Exception:  # noqa: BLE001 - the triage must never hide the export error itself
        problems = []
    if not problems or not all(p.kind in ACTIONABLE for p in problems):
        return ExportError(str(exc) + _listed(problems, loaded) + " If the model runs in PyTorch, this is an exporter "
                           "failure: report it to PyTorch with the output of --debug.", exc.failures, FAILURE)
    return ExportError(str(exc) + _listed(problems, loaded), exc.failures)


def _listed(problems, loaded: LoadedModel) -> str:
    if not problems:
        return ""
    return (f" What could not be exported: {'; '.join(format_problem(p) for p in problems)}. Run `onnx-bisect "
            f"coverage {loaded.source}` for the full triage.")


def prepare(loaded: LoadedModel, inputs: ModelInputs, captured: Capture, exported: ExportedModel, *,
            backend: Backend, save_onnx: str | None = None, progress: Progress) -> Prepared:
    """Index the graph against the sample's capture and run the preflight checks."""
    with progress.step("prepare", "indexing the ONNX graph"):
        skeleton, weight_store = (
            (exported.proto, exported.weights) if exported.weights is not None else weights.split_given(exported.proto)
        )
        where = f"ONNX model '{exported.path}'" if exported.path else "The exported ONNX model"
        onnx_file.check_types(skeleton, where)
        model_feeds, _ = feeds.make_feeds(inputs, skeleton, loaded.forward_params)
        skeleton = onnx_file.validate_onnx(skeleton, where)
        index = graph.index_graph(onnx_file.pin_shapes(skeleton, {k: v.shape for k, v in model_feeds.items()}, where))
        modules, op_acts = ops.split(captured)
        scopes = align.map_scopes(modules, index)
        candidates = tuple(dict.fromkeys(align.candidate_tensors(modules, index, scopes)
                                         + op_pairs.op_tensors(op_acts, index)))
    with progress.step("preflight", "checking the model before running it"):
        checked = preflight.check_model(loaded, inputs, skeleton, weight_store, backend, modules)
        notes = list(checked.notes)
        notes += preflight.static_batch(skeleton) if exported.exporter is Exporter.GIVEN else []
        notes += feeds.nested_inputs(inputs, skeleton, loaded.forward_params)
        notes += feeds.cast_notes(inputs, skeleton, loaded.forward_params)
    if save_onnx:
        with progress.step("save", f"writing the exported model to {save_onnx}"):
            if exported.file is not None:
                save_files(exported.file, save_onnx)
            else:
                save_model(weights.join_weights(skeleton, weight_store) if exported.weights is not None
                           else exported.proto, save_onnx)
    return Prepared(loaded, exported, skeleton, weight_store, index, scopes, candidates, checked.warnings,
                    tuple(notes), weight_differences=checked.weight_differences)


def weight_warnings(p: Prepared, layers) -> list[str]:
    """The stale-weight warnings worth a claim: initializers unlike their parameters that a layer computing
    differently from PyTorch reads (or that no measured layer reads). An initializer every reading layer
    agrees with is a transformed copy — a folded BatchNorm, a standardised or re-parameterised weight."""
    rows: dict[str, list] = {}
    for r in layers:
        for node in r.segment:
            rows.setdefault(node, []).append(r)
    kept = []
    for d in p.weight_differences:
        readers = [p.index.nodes[i].name for i in p.index.consumers.get(d.initializer, ())]
        measured = [r for n in readers for r in rows.get(n, ()) if r.diff is not None]
        if not measured or any(not r.diff.ok for r in measured):
            kept.append(d)
    return preflight.stale_weight_warnings(kept)


def save_files(written: str, path: str) -> None:
    """``--save-onnx`` of a model written with external data (onnx-bisect's own export): ``path`` and
    ``path.data`` beside it, each written atomically, the data first (the graph names its new location)."""
    data_name = Path(path).name + ".data"
    proto = onnx.load(written, load_external_data=False)
    sources = set()
    for tensor, _ in external.external_tensors(proto.graph):
        ref = external.check_external(tensor, Path(written).parent)
        sources.add(ref.file)
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = data_name
    if len(sources) > 1:
        raise UsageError(f"The exported model keeps its weights in {len(sources)} files; onnx-bisect saves one.")
    try:
        for source in sources:
            copy_atomic(str(source), str(Path(path).with_name(data_name)))
        write_atomic(path, proto.SerializeToString())
    except OSError as exc:
        raise UsageError(f"Cannot write --save-onnx '{path}': {exc.strerror or exc}. Choose a writable path.") from exc


def save_model(proto: onnx.ModelProto, path: str) -> None:
    """Write ``proto`` to ``path`` (``--save-onnx``) atomically."""
    try:
        data = proto.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise UsageError(f"The model is too large for one ONNX file ({exc}); save it with external data "
                         "yourself (onnx.save_model(..., save_as_external_data=True)).") from exc
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"Cannot write --save-onnx '{path}': {exc.strerror or exc}. Choose a writable path.") from exc
