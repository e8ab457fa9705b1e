"""Reference ONNX: bisect one ONNX model against another (an fp32 file against its fp16 or int8 version).

The reference model plays PyTorch's part.  It runs once with every tensor it
computes exposed (graph optimizations off, so it is the file's plain
semantics), and each floating-point tensor becomes an *activation* named after
the tensor and typed by its op.  The candidate's tensors are paired with them by
name (converters, quantizers and simplifiers keep the names of the tensors they
do not remove), looking through a QuantizeLinear → DequantizeLinear pair, else
by value among the same-sized tensors after the pair's inputs.  From there the
candidate is cut and fed reference values exactly as a PyTorch bisection is.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import onnx
import onnx.numpy_helper
import torch

from .. import align
from ..errors import BackendError, InputError, RuntimeFailure, UsageError
from ..records.graph import GraphIndex
from ..report.progress import Progress
from ..records.store import ArrayStore
from ..run import expose, windows
from ..run.backend import Backend, make_backend
from ..source import feeds, graph, load, onnx_file, weights
from .case import bisect_case, paired_tensors
from .config import CasePolicy, Config
from .prepare import Prepared
from . import memory
from .runner import Runner, tensor_bytes
from .workspace import workspace
from ..records import (Activation, Capture, Exporter, ExportedModel, LoadedModel, MatchMethod, ModelInputs, Report,
                      RuntimeSettings, TensorPair, Tolerance)

#: ops whose outputs are not worth pairing: constants and shape arithmetic
SKIPPED_OPS = {"Constant", "ConstantOfShape", "Shape", "Size"}
#: a value pair must be this close (relative L2): float16 rounding passes, a different tensor does not
VALUE_MAX_REL = 2e-2
VALUE_MARGIN = 2.0  # and this many times closer than the next candidate
VALUE_CANDIDATES = 8  # same-sized tensors after the inputs' pairs that a value pair may take


def run(config: Config, progress: Progress | None = None) -> Report:
    """Bisect ``config.model`` (an ONNX file) against ``config.reference``."""
    return bisect_onnx(config.reference, config.model, config.inputs, tolerance=config.tolerance,
                       runtime=config.runtime, progress=progress, extractable=config.keep_repro,
                       low_memory=config.low_memory, window_mb=config.window_mb)


def bisect_onnx(
    reference: str | onnx.ModelProto,
    candidate: str | onnx.ModelProto,
    inputs: Sequence[str] | Any = (),
    *,
    tolerance: Tolerance = Tolerance(),
    runtime: RuntimeSettings | None = None,
    progress: Progress | None = None,
    extractable: bool = True,
    low_memory: bool | None = None,
    window_mb: float | None = None,
) -> Report:
    """Bisect ONNX model ``candidate`` against ONNX model ``reference`` on ``inputs``.

    ``inputs`` are ``--input`` paths (one per graph input, or an ``.npz`` by input
    name), arrays/tensors (a tuple in graph-input order, or a dict by name), or
    empty: seeded random inputs are then made from the reference's input types.
    ``extractable`` keeps the divergent segment for ``report.extract(folder)``.

    The two files never run at once (the reference first, then the candidate).  Each is exposed in windows of
    at most ``window_mb`` MiB of tensors, the values kept in memory-mapped files; without ``window_mb``,
    windows are automatic (``low_memory`` None) when the reference's weights take more than a quarter of the
    available memory, or forced by ``low_memory=True`` (sized as in a PyTorch low-memory run).
    """
    progress = progress or Progress(enabled=False)
    backend = make_backend(runtime)
    with progress.step("load", "loading both ONNX models"):
        ref = _load(reference, "--reference")
        cand = _load(candidate, "the ONNX model to check")
        loaded = LoadedModel(module=None, name=f"{_name(cand)} against {_name(ref)}", source=_name(ref),
                             was_training=False, forward_params=_graph_inputs(ref.proto))
        model_inputs, generated = _inputs(inputs, loaded, ref.proto)
    budget = _window_budget(ref, low_memory, window_mb)
    with workspace() as folder:
        store = ArrayStore(folder) if budget is not None else None
        with progress.step("capture", "running the reference with every tensor exposed"):
            captured = capture_reference(ref, model_inputs, loaded, backend, budget, store, progress)
        with progress.step("prepare", "indexing the ONNX graph"):
            prepared = dataclasses.replace(_prepare(loaded, cand, model_inputs, generated),
                                           reference_weights=_initializers(ref))
        runner = Runner(prepared, backend, window_bytes=budget, store=store, progress=progress)
        model_feeds, _ = feeds.make_feeds(model_inputs, prepared.skeleton, loaded.forward_params)
        with progress.step("probe", "running the candidate with every tensor exposed"):
            try:
                probed = runner.probe(model_feeds)
            except RuntimeFailure:
                runner.final(model_feeds)  # raises when the file itself does not run: the input's problem
                raise
        with progress.step("align", "pairing the two models' tensors"):
            pairs = pair_tensors(captured, prepared.index, probed)
            runner.narrow(paired_tensors(pairs, prepared.index))
        policy = CasePolicy(tolerance, template=pairs, keep_repro=extractable)
        report = bisect_case(prepared, runner, model_inputs, captured, policy=policy, progress=progress).report
    return dataclasses.replace(report, reference=f"the reference {_name(ref)}")


def _window_budget(ref: ExportedModel, low_memory: bool | None, window_mb: float | None) -> int | None:
    """The bytes one window of exposed tensors may take (None: no windows): ``window_mb``, else sized from the
    reference's weights when they are large (or ``low_memory`` says so)."""
    size = sum(a.nbytes for a in ref.weights.arrays.values()) if ref.weights is not None else 0
    low = low_memory if low_memory is not None else memory.too_large(size)
    return memory.window_budget(window_mb, low, size)


def _load(source: str | onnx.ModelProto, what: str) -> ExportedModel:
    if isinstance(source, onnx.ModelProto):
        skeleton, store = weights.split_given(source)
        return ExportedModel(proto=skeleton, exporter=Exporter.GIVEN, opset=onnx_file.opset_of(skeleton), weights=store)
    if not str(source).endswith(".onnx") and not Path(source).is_file():
        raise UsageError(f"{what} must be an .onnx file (got '{source}').")
    return onnx_file.load_onnx(str(source))


def _name(model: ExportedModel) -> str:
    return Path(model.path).name if model.path else "<ModelProto>"


def _graph_inputs(proto: onnx.ModelProto) -> tuple[str, ...]:
    inits = {i.name for i in proto.graph.initializer}
    return tuple(i.name for i in proto.graph.input if i.name not in inits)


def _inputs(inputs, loaded: LoadedModel, proto: onnx.ModelProto) -> tuple[ModelInputs, bool]:
    """The inputs as forward arguments named after the graph inputs; True when they were generated."""
    names = loaded.forward_params
    if isinstance(inputs, ModelInputs):
        return inputs, False
    if isinstance(inputs, dict):
        return ModelInputs(args=(), kwargs={k: _tensor(v) for k, v in inputs.items()}, names=()), False
    items = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
    if not items:
        return _generated(proto, names), True
    if all(isinstance(x, (str, Path)) for x in items):
        args, kwargs = load.read_inputs(items, loaded)
    else:
        args, kwargs = [_tensor(x) for x in items], {}
    if len(args) > len(names):
        raise InputError(f"{len(args)} inputs given but the reference model takes {len(names)} "
                         f"({', '.join(names)}). Pass one --input per graph input, in order.")
    return ModelInputs(args=tuple(args), kwargs=kwargs, names=names[:len(args)]), False


def _tensor(value) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(value))


def _generated(proto: onnx.ModelProto, names: tuple[str, ...]) -> ModelInputs:
    """Seeded inputs from the reference's declared input types (free dimensions 1): floats N(0, 1), integers
    0 or 1 (valid as token ids and masks), booleans False."""
    rng = np.random.default_rng(0)
    by_name = {i.name: i for i in proto.graph.input}
    args = []
    for name in names:
        tt = by_name[name].type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else 1 for d in tt.shape.dim]
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type))
        if dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, 2, shape).astype(dtype)
        else:
            value = np.zeros(shape, dtype)
        args.append(torch.from_numpy(value))
    return ModelInputs(args=tuple(args), names=names)


def capture_reference(ref: ExportedModel, inputs: ModelInputs, loaded: LoadedModel, backend: Backend,
                      window_bytes: int | None = None, store: ArrayStore | None = None,
                      progress: Progress | None = None) -> Capture:
    """Every floating-point tensor the reference computes, as activations in graph order (exposed in windows of
    at most ``window_bytes``, the values put into ``store``, when given)."""
    skeleton, weights_ = (ref.proto, ref.weights) if ref.weights is not None else weights.split_weights(ref.proto)
    model_feeds, _ = feeds.make_feeds(inputs, skeleton, loaded.forward_params)
    index = graph.index_graph(skeleton)
    wanted = [t for n in index.nodes if n.op_type not in SKIPPED_OPS for t in n.outputs if t]
    try:
        values = _windowed(skeleton, wanted, model_feeds, weights_, backend, window_bytes, store, progress)
        if values is None:
            values = backend.run(expose.expose_tensors(skeleton, wanted), model_feeds, None, weights_,
                                 one_shot=True, optimize=False)
    except BackendError as exc:
        try:
            backend.run(skeleton, model_feeds, None, weights_, one_shot=True, optimize=False)
        except BackendError as plain:  # the file itself does not run: the input's problem
            raise BackendError(f"The --reference model: {plain}") from plain
        raise RuntimeFailure(
            f"The --reference model runs in ONNX Runtime, but the copy onnx-bisect made of it with every tensor "
            f"exposed does not ({exc}). This is a failure of onnx-bisect or ONNX Runtime, not of your model: "
            "please report it with the output of --debug.") from exc
    activations: list[Activation] = []
    made_by: dict[str, int] = {}
    for node in index.nodes:
        if node.op_type in SKIPPED_OPS:
            continue
        consumed = tuple(sorted({made_by[t] for t in node.inputs if t in made_by}))
        for t in node.outputs:
            value = values.get(t)
            if value is None or value.dtype.kind != "f":
                continue
            made_by[t] = len(activations)
            activations.append(Activation(index=len(activations), module=t, module_type=node.op_type, call=0,
                                          path="", value=value, is_leaf=True, inputs=consumed))
    outputs = index.graph_outputs
    return Capture(activations=tuple(activations), outputs=tuple(values[t] for t in outputs),
                   output_names=tuple(outputs))


def _windowed(skeleton: onnx.ModelProto, wanted: list[str], model_feeds, file_weights, backend: Backend,
              window_bytes: int | None, kept: ArrayStore | None, progress: Progress | None):
    """The reference's ``wanted`` tensors run in windows (graph optimizations off, as its plain run); None when
    windows are off or one window would hold them all."""
    if window_bytes is None:
        return None
    pinned = graph.index_graph(onnx_file.pin_shapes(skeleton, {k: v.shape for k, v in model_feeds.items()},
                                                    "The --reference model"))
    plan = windows.plan_windows(pinned, wanted, tensor_bytes(pinned), window_bytes)
    if len(plan) < 2:
        return None
    return windows.run_windowed(backend, skeleton, plan, model_feeds, file_weights, kept.put if kept else (lambda a: a),
                                progress.advance if progress else None, optimize=False)


def _initializers(model: ExportedModel) -> dict[str, np.ndarray]:
    """Every initializer of ``model`` by name: split-off weights as stored, small ones decoded."""
    out = dict(model.weights.arrays) if model.weights is not None else {}
    for init in model.proto.graph.initializer:
        if init.name not in out and init.data_location != onnx.TensorProto.EXTERNAL:
            out[init.name] = weights.to_array(init)
    return out


def _prepare(loaded: LoadedModel, cand: ExportedModel, inputs: ModelInputs, generated: bool) -> Prepared:
    skeleton, store = (cand.proto, cand.weights) if cand.weights is not None else weights.split_weights(cand.proto)
    model_feeds, _ = feeds.make_feeds(inputs, skeleton, loaded.forward_params)
    where = f"ONNX model '{cand.path}'" if cand.path else "The ONNX model"
    skeleton = onnx_file.validate_onnx(skeleton, where)
    index = graph.index_graph(onnx_file.pin_shapes(skeleton, {k: v.shape for k, v in model_feeds.items()}, where))
    candidates = tuple(t for n in index.nodes if n.op_type not in SKIPPED_OPS for t in n.outputs
                       if t and index.elem_types.get(t) in _FLOAT_TYPES | {onnx.TensorProto.UNDEFINED, None})
    notes = ("The reference model plays PyTorch's part: each 'module' is a reference tensor, typed by its op.",)
    warnings = ("No --input was given: the inputs were generated from the reference's input types (floats "
                "N(0, 1), integers 0/1, free dimensions 1). Pass real inputs for a faithful check.",) if generated else ()
    exported = ExportedModel(proto=cand.proto, exporter=Exporter.GIVEN, opset=cand.opset, path=cand.path,
                             notes=notes, weights=cand.weights)
    return Prepared(loaded, exported, skeleton, store, index, align.ScopeMap({}, {}), candidates, warnings)


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}


def pair_tensors(capture: Capture, index: GraphIndex, values: dict[str, np.ndarray]) -> tuple[TensorPair, ...]:
    """Pair each reference tensor with the candidate's: by name (through Q→DQ), else by value."""
    pairs: dict[int, TensorPair] = {}
    # A candidate tensor named after a reference tensor stands for that one, even where the pair is made after
    # its Q→DQ: it must not be value-paired with another (a Conv whose fused Relu kept the Relu's name).
    taken: set[str] = {a.module for a in capture.activations if a.module in index.producer}
    for a in capture.activations:
        tensor = _through_qdq(a.module, index)
        if tensor in index.producer and tensor in values and values[tensor].size == a.value.size:
            node = index.node_of(tensor)
            note = "" if tensor == a.module else f"compared after {node.op_type} ({tensor})"
            pairs[a.index] = TensorPair(a, tensor, node.name, node.op_type, MatchMethod.NAME, 1.0, note)
            taken.add(tensor)
    for a in capture.activations:
        if a.index not in pairs:
            pairs[a.index] = _pair_by_value(a, pairs, index, values, taken)
            if pairs[a.index].tensor:
                taken.add(pairs[a.index].tensor)
    return tuple(pairs[a.index] for a in capture.activations)


def _through_qdq(tensor: str, index: GraphIndex) -> str:
    """``tensor``, or the DequantizeLinear output its only consumer chain Q → DQ yields (what the next node reads)."""
    consumers = index.consumers.get(tensor, ())
    if len(consumers) == 1 and index.nodes[consumers[0]].op_type == "QuantizeLinear":
        q = index.nodes[consumers[0]]
        after = index.consumers.get(q.outputs[0], ())
        if len(after) == 1 and index.nodes[after[0]].op_type == "DequantizeLinear":
            return index.nodes[after[0]].outputs[0]
    return tensor


def _pair_by_value(a: Activation, pairs: dict[int, TensorPair], index: GraphIndex, values, taken) -> TensorPair:
    """The nearest same-sized tensor after the inputs' pairs, if it is close and clearly the closest."""
    after = max((index.order_of(pairs[i].tensor) for i in a.inputs
                 if i in pairs and pairs[i].tensor in index.producer), default=-1)
    candidates = [t for n in index.nodes[after + 1:] for t in n.outputs
                  if t in values and t not in taken and values[t].size == a.value.size][:VALUE_CANDIDATES]
    ref = a.value.astype(np.float64).reshape(-1)
    scale = float(np.linalg.norm(ref)) or 1.0
    scored = sorted((float(np.linalg.norm(values[t].astype(np.float64).reshape(-1) - ref)) / scale, t)
                    for t in candidates)
    if scored and scored[0][0] <= VALUE_MAX_REL and (len(scored) == 1 or scored[1][0] > VALUE_MARGIN * scored[0][0]):
        distance, tensor = scored[0]
        node = index.node_of(tensor)
        return TensorPair(a, tensor, node.name, node.op_type, MatchMethod.STRUCTURE, 0.9,
                          f"no tensor of this name; the values agree (relative L2 {distance:.2g})")
    reason = ("no tensor of this name and none of the same size after its inputs agrees in value"
              if candidates else "no tensor of this name (removed or fused by the conversion)")
    return TensorPair(a, None, None, None, MatchMethod.NONE, 0.0, reason)
