"""ONNX Runtime backend."""
from __future__ import annotations

import ctypes

import functools
import os
from typing import Mapping, Sequence

import numpy as np
import onnx
import onnxruntime as ort

from ..errors import BackendError, UsageError
from ..records import OptLevel, RuntimeSettings
from ..records.weights import Weights, file_region


#: ONNX Runtime's constant for each optimization level
OPT_LEVELS = {
    OptLevel.DISABLE: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    OptLevel.BASIC: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    OptLevel.EXTENDED: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    OptLevel.ALL: ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def available_providers() -> list[str]:
    """Execution providers compiled into the installed onnxruntime."""
    return list(ort.get_available_providers())


def _thread_budget() -> int:
    """The threads ``OMP_NUM_THREADS`` gives a process (PyTorch's forward honours it; ONNX Runtime's own pool does
    not), 0 when unset or not a positive integer: ONNX Runtime then takes one thread per core."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else 0


class OnnxRuntimeSession:
    """One ``InferenceSession``, run as often as needed."""

    def __init__(self, session: ort.InferenceSession):
        self._session = session
        self._inputs = {i.name for i in session.get_inputs()}
        self.output_names = [o.name for o in session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run once; ONNX Runtime failures become a :class:`BackendError` naming what failed.

        Tensor outputs come back as numpy views of ONNX Runtime's own buffers
        (each keeps its buffer alive): ``InferenceSession.run`` copies every
        output, which costs more than the run itself when hundreds of
        intermediate tensors are exposed.
        """
        names = list(outputs) if outputs is not None else self.output_names
        inputs = {k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()
                  if k in self._inputs}
        try:
            values = self._session.run_with_ort_values(names, inputs)
        except Exception as exc:
            raise BackendError(
                f"ONNX Runtime failed while running the model ({type(exc).__name__}: {str(exc).strip()[:400]}). "
                "Check that the inputs' shapes and dtypes match the model's inputs."
            ) from exc
        if not all(v.is_tensor() for v in values):  # sequences and maps: let ONNX Runtime convert them
            return dict(zip(names, self._session.run(names, {k: v for k, v in feeds.items() if k in self._inputs})))
        return {name: _as_numpy(value) for name, value in zip(names, values)}


def _as_numpy(value: ort.OrtValue) -> np.ndarray:
    """The tensor as numpy; a bfloat16 one (numpy has no such type, and ``OrtValue.numpy`` refuses it) as the
    float32 numbers it holds exactly (its 16 bits are a float32's upper half)."""
    if value.data_type() != "tensor(bfloat16)" or value.device_name().lower() != "cpu":
        return value.numpy()  # (a bfloat16 tensor on a device: numpy() says it cannot, as before)
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    raw = (np.ctypeslib.as_array((ctypes.c_uint16 * count).from_address(value.data_ptr())).copy() if count
           else np.zeros(0, np.uint16))
    return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)


#: weights at least this large are read by ONNX Runtime from their file; smaller ones (shapes, axes: ONNX
#: Runtime's shape inference cannot read those from a file) are handed over in memory
FROM_FILE_BYTES = 1 << 16


def _read_by(model: onnx.ModelProto, weights: Weights | None) -> Weights | None:
    """``weights`` less those no node (nor graph output) reads: ONNX Runtime drops an unused initializer before
    the session takes the arrays handed over, and then fails on its name (a hand-edited file keeps the weights
    it stopped using)."""
    if weights is None or not weights.arrays:
        return weights
    used = {o.name for o in model.graph.output}
    stack = [model.graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            used.update(node.input)
            stack += [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]
            stack += [sub for a in node.attribute if a.type == onnx.AttributeProto.GRAPHS for sub in a.graphs]
    if all(n in used for n in weights.arrays):
        return weights
    return Weights({n: a for n, a in weights.arrays.items() if n in used})


def from_files(model: onnx.ModelProto, weights: Weights | None
               ) -> tuple[onnx.ModelProto, Weights | None, str | None]:
    """``(model, weights still to hand over in memory, folder)``: the initializers whose arrays are views of a
    memory-mapped file (all in one folder, the one holding most bytes) point at that file instead, so ONNX
    Runtime reads (or maps) them itself and onnx-bisect's own mapping of the file stays unread.

    Those files are the ones the source stage opened (the user's model and its external data, already
    confined to the model's folder) or wrote (its own export, in its private folder); nothing else is named.
    """
    if weights is None or not weights.arrays:
        return model, weights, None
    regions = {n: r for n, a in weights.arrays.items() if a.nbytes >= FROM_FILE_BYTES and (r := file_region(a))}
    by_folder: dict[str, int] = {}
    for r in regions.values():
        by_folder[os.path.dirname(r.path)] = by_folder.get(os.path.dirname(r.path), 0) + r.length
    if not by_folder:
        return model, weights, None
    folder = max(by_folder, key=by_folder.get)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    moved = set()
    for init in out.graph.initializer:
        r = regions.get(init.name)
        if r is None or os.path.dirname(r.path) != folder or init.data_location != onnx.TensorProto.EXTERNAL:
            continue
        del init.external_data[:]
        for key, value in (("location", os.path.basename(r.path)), ("offset", r.offset), ("length", r.length)):
            init.external_data.add(key=key, value=str(value))
        moved.add(init.name)
    rest = Weights({n: a for n, a in weights.arrays.items() if n not in moved})
    return out, rest, folder


def crashes_at_all(model: onnx.ModelProto) -> bool:
    """Whether ``model`` holds a pattern on which ONNX Runtime's CPU provider crashes the process (a segmentation
    fault, no exception) when it creates a session at ``ORT_ENABLE_ALL``: a float16 graph input read by a Transpose
    that a MatMul reads (ONNX Runtime 1.31; found on a segment cut out of a float16 FT-Transformer — the graphs
    onnx-bisect cuts start at arbitrary tensors).  Such a model is optimized at ``ORT_ENABLE_EXTENDED`` instead."""
    graph = model.graph
    half = {i.name for i in graph.input if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    if not half:
        return False
    transposed = {n.output[0] for n in graph.node if n.op_type == "Transpose" and n.input and n.input[0] in half}
    return any(n.op_type == "MatMul" and any(i in transposed for i in n.input) for n in graph.node)


@functools.lru_cache(maxsize=1)
def _own_ops() -> frozenset[tuple[str, str]]:
    try:
        from onnxruntime.capi import _pybind_state as ort_c
        schemas = ort_c.get_all_operator_schema()
    except Exception:  # noqa: BLE001 - a minimal build without schema introspection
        return frozenset()
    known = {(s.domain, s.name) for s in onnx.defs.get_all_schemas_with_history()}
    return frozenset((s.domain, s.name) for s in schemas if (s.domain, s.name) not in known)


class OnnxRuntimeBackend:
    """Runs models with one ONNX Runtime execution provider and the user's session settings."""

    def __init__(self, settings: RuntimeSettings | None = None):
        settings = settings or RuntimeSettings()
        available = available_providers()
        if settings.provider not in available:
            raise UsageError(
                f"Execution provider '{settings.provider}' is not available in this onnxruntime build "
                f"(available: {', '.join(available)}). Install the matching onnxruntime package "
                "or pick one of those."
            )
        self.settings = settings
        self.name = f"onnxruntime {ort.__version__} ({settings.provider})"

    def own_ops(self) -> frozenset[tuple[str, str]]:
        """``(domain, op_type)`` of the ops this runtime defines beyond the onnx package's schemas (its contrib
        ops, and the ones its graph optimizer writes in the ONNX domain: SimplifiedLayerNormalization)."""
        return _own_ops()

    def _options(self, weights: Weights | None, one_shot: bool, optimize: bool,
                 folder: str | None = None, capped: bool = False) -> ort.SessionOptions:
        so = ort.SessionOptions()
        level = OptLevel.DISABLE if not optimize else self.settings.opt_level
        if capped and level is OptLevel.ALL:
            level = OptLevel.EXTENDED  # see crashes_at_all
        so.graph_optimization_level = OPT_LEVELS[level]
        for key, value in self.settings.session_config:
            try:
                so.add_session_config_entry(key, value)
            except Exception as exc:
                raise UsageError(f"ONNX Runtime rejected session option {key}={value}: {exc}") from exc
        # A failure comes back as an exception, which onnx-bisect reports (and some runs fail on purpose: a
        # segment re-run one row at a time through a fixed Reshape): ONNX Runtime's own log lines are noise.
        so.log_severity_level = 4
        if one_shot:
            # Pre-packing weights pays off over many runs; for one run it only costs
            # time and a second copy of every MatMul weight.
            so.add_session_config_entry("session.disable_prepacking", "1")
        # Spinning worker threads keep the cores busy after a run and slow the
        # PyTorch forward that follows in the same process.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        threads = _thread_budget()
        if threads:
            so.intra_op_num_threads = threads
        if folder is not None:
            so.add_session_config_entry("session.model_external_initializers_file_folder_path", folder)
        if weights is not None and weights.arrays:
            names = list(weights.arrays)
            so.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(weights.arrays[n]) for n in names])
        return so

    def load(
        self,
        model: onnx.ModelProto | str,
        weights: Weights | None = None,
        one_shot: bool = False,
        optimize: bool = True,
    ) -> OnnxRuntimeSession:
        """Create an ``InferenceSession`` with this backend's provider and settings.

        Weights that are views of a memory-mapped file (the user's file, onnx-bisect's own export) are read by
        ONNX Runtime from that file (see :func:`from_files`); the others are handed over in memory.
        """
        folder = None
        if not isinstance(model, str):
            model, weights, folder = from_files(model, weights)
            weights = _read_by(model, weights)
        capped = not isinstance(model, str) and crashes_at_all(model)
        source = model if isinstance(model, str) else model.SerializeToString()
        provider = self.settings.provider
        providers = [(provider, dict(self.settings.provider_options))] if self.settings.provider_options else [provider]
        try:
            session = ort.InferenceSession(source, self._options(weights, one_shot, optimize, folder, capped),
                                           providers=providers)
        except UsageError:
            raise
        except Exception as exc:
            hint = self._optimizer_hint(source, weights, one_shot, providers, folder) if optimize else ""
            raise BackendError(
                f"ONNX Runtime could not load the model ({type(exc).__name__}: {str(exc).strip()[:400]}). "
                + (hint or "Check the model's opset, custom-domain operators, the execution provider and its "
                           "options.")
            ) from exc
        return OnnxRuntimeSession(session)

    def _optimizer_hint(self, source, weights, one_shot, providers, folder) -> str:
        """When the model loads with graph optimizations off, say that the optimizer is what fails."""
        if self.settings.opt_level is OptLevel.DISABLE:
            return ""
        try:
            ort.InferenceSession(source, self._options(weights, one_shot, False, folder), providers=providers)
        except Exception:  # noqa: BLE001 - it fails either way: the optimizer is not the cause
            return ""
        return (f"It loads with graph optimizations off: ONNX Runtime's optimizer fails on this model at level "
                f"'{self.settings.opt_level}', so the file will not load like this where it ships either. Debug it with "
                "--ort-opt-level disable, and report the failure to ONNX Runtime.")

    def run(
        self,
        model: onnx.ModelProto | str,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        weights: Weights | None = None,
        one_shot: bool = False,
        optimize: bool = True,
    ) -> dict[str, np.ndarray]:
        """Create a session, run once, return the outputs by name."""
        return self.load(model, weights, one_shot, optimize).run(feeds, outputs)
