"""Open the user's ONNX file (read-only, weights memory-mapped), validate it, and pin shapes for indexing."""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import onnx

from ..errors import OnnxLoadError
from ..records import Exporter, ExportedModel
from ..records.graph import checkable_view
from .weights import split_weights_from_file


def opset_of(proto: onnx.ModelProto) -> int:
    """The default-domain opset a model imports (0 when none)."""
    for entry in proto.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return 0


def load_onnx(path: str, check: str = "the --onnx path") -> ExportedModel:
    """Load the user's ONNX file read-only, its weights memory-mapped (see ``weights``); ``check`` is what the
    error tells the user to check when the file is missing."""
    p = Path(path)
    if not p.is_file():
        raise OnnxLoadError(f"ONNX file '{p}' does not exist. Check {check}.")
    try:
        skeleton, store = split_weights_from_file(str(p))
    except OnnxLoadError as exc:
        raise OnnxLoadError(f"'{p}': {exc}") from exc
    except Exception as exc:
        raise OnnxLoadError(
            f"'{p}' is not a loadable ONNX model ({type(exc).__name__}: {str(exc).strip()[:200]}). "
            "Check that the file is complete and that its external data files sit beside it."
        ) from exc
    if not skeleton.graph.node:
        raise OnnxLoadError(f"'{p}' loads but its graph has no nodes. Pass the exported model file.")
    check_types(skeleton, f"'{p}'")
    refuse_endless_loops(skeleton.graph, f"'{p}'")
    return ExportedModel(proto=skeleton, exporter=Exporter.GIVEN, opset=opset_of(skeleton), path=str(p),
                         weights=store, file=str(p))


def validate_onnx(proto: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """Run ``onnx.checker`` and shape inference; return a copy carrying the inferred types.

    Dimensions the graph leaves free stay symbolic, so the copy runs at any
    size the graph allows (see :func:`pin_shapes` for concrete shapes).
    Pass a model whose large initializers were split off (see ``weights``): the
    checker and shape inference then run in milliseconds instead of seconds.
    """
    check_types(proto, where)
    refuse_endless_loops(proto.graph, where)
    view = checkable_view(proto)
    try:
        onnx.checker.check_model(view)
    except (UnicodeError, RecursionError) as exc:  # names that are not text, nesting beyond protobuf's limits
        raise OnnxLoadError(f"{where} cannot be checked ({type(exc).__name__}: {str(exc)[:200]}): the file is "
                            "corrupt. Re-export the model.") from exc
    except onnx.checker.ValidationError as exc:
        # An op the onnx package has no schema for is the runtime's business: ONNX Runtime
        # writes its own fused ops (SimplifiedLayerNormalization, in the default domain) into
        # the files it optimizes offline.  The session decides whether it loads; preflight
        # reports the checker's complaint as a warning.
        if not _unknown_op(exc):
            raise OnnxLoadError(
                f"{where} does not pass onnx.checker: {str(exc).strip().splitlines()[0][:300].rstrip('.')}. "
                "Re-export the model or repair the reported node."
            ) from exc
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.graph.ClearField("value_info")
    out.graph.value_info.extend(_infer(view, where).graph.value_info)
    return out


#: the element types ONNX defines
KNOWN_TYPES = frozenset(onnx.TensorProto.DataType.values())


def check_types(model: onnx.ModelProto, where: str) -> None:
    """OnnxLoadError when a graph input, output, value or initializer has an element type ONNX does not define,
    or an initializer is stored in a form onnx-bisect does not read (the ``segment`` field)."""
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type not in KNOWN_TYPES:
            raise OnnxLoadError(f"{where}: tensor '{vi.name}' has element type {vi.type.tensor_type.elem_type}, "
                                "which ONNX does not define. The file is corrupt; re-export the model.")
    for init in g.initializer:
        if init.data_type not in KNOWN_TYPES or init.data_type == onnx.TensorProto.UNDEFINED:
            raise OnnxLoadError(f"{where}: initializer '{init.name}' has element type {init.data_type}, which ONNX "
                                "does not define. The file is corrupt; re-export the model.")
        if init.HasField("segment"):
            raise OnnxLoadError(f"{where}: initializer '{init.name}' is stored in segments, which onnx-bisect (like "
                                "ONNX Runtime) does not read. Save the model with whole tensors.")


#: a Loop asked for more iterations than this is refused: ONNX Runtime spends microseconds per iteration and
#: onnx-bisect runs the model several times, so 10^7 iterations already take minutes; exported models loop
#: over sequence steps or detections, thousands of times
MAX_TRIPS = 10 ** 6


def refuse_endless_loops(graph: onnx.GraphProto, where: str, outer: dict | None = None) -> None:
    """OnnxLoadError for a Loop that provably never ends (no trip count and a condition the body passes through
    unchanged from a true start, or neither) or whose constant trip count is absurd: ONNX Runtime would run it
    for ever. A loop that depends on data is left to run."""
    consts = dict(outer or {})
    consts.update({i.name: i for i in graph.initializer})
    consts.update({n.output[0]: a.t for n in graph.node if n.op_type == "Constant" and n.output
                   for a in n.attribute if a.name == "value"})
    for node in graph.node:
        if node.op_type == "Loop" and node.domain in ("", "ai.onnx"):
            _check_loop(node, consts, where)
        for attr in node.attribute:
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                refuse_endless_loops(sub, where, consts)


def _check_loop(node: onnx.NodeProto, consts: dict, where: str) -> None:
    trip = node.input[0] if node.input else ""
    cond = node.input[1] if len(node.input) > 1 else ""
    count = _scalar(consts.get(trip)) if trip else None
    if count is not None and count > MAX_TRIPS:
        raise OnnxLoadError(f"{where}: Loop '{node.name}' runs {count} times (its trip count is a constant), more than "
                            f"onnx-bisect runs ({MAX_TRIPS}): each run of the model would take minutes or never "
                            "finish. The file is corrupt or the trip count was set by hand; re-export the model.")
    if trip:
        return
    body = next((a.g for a in node.attribute if a.name == "body"), None)
    start = _scalar(consts.get(cond)) if cond else True
    if body is None or len(body.input) < 2 or not body.output or not start:
        return
    if not cond or _passes_through(body, body.input[1].name, body.output[0].name):
        raise OnnxLoadError(f"{where}: Loop '{node.name}' has no trip count and a condition that stays true, so it "
                            "never ends; ONNX Runtime would run it for ever. Re-export the model.")


def _passes_through(body: onnx.GraphProto, start: str, end: str) -> bool:
    """Whether ``end`` is ``start`` itself or ``start`` through Identity nodes only."""
    producers = {o: n for n in body.node for o in n.output}
    seen = set()
    while end != start:
        node = producers.get(end)
        if node is None or node.op_type != "Identity" or end in seen:
            return False
        seen.add(end)
        end = node.input[0]
    return True


def _scalar(tensor: onnx.TensorProto | None):
    if tensor is None or tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        value = onnx.numpy_helper.to_array(tensor)
    except Exception:  # noqa: BLE001 - unreadable: not a constant we can judge
        return None
    return value.item() if value.size == 1 else None


def _unknown_op(exc: Exception) -> bool:
    """Whether a checker error only says that some node's op has no schema in the onnx package."""
    return str(exc).strip().startswith("No Op registered for")


def pin_shapes(skeleton: onnx.ModelProto, input_shapes: dict, where: str) -> onnx.ModelProto:
    """A copy of ``skeleton`` whose value infos are inferred with the inputs' free dimensions
    pinned to ``input_shapes``, so intermediate shapes are concrete (for indexing, not for running).
    A tensor that would not fit in memory is refused here, before anything runs."""
    view = checkable_view(skeleton)
    for inp in view.graph.input:
        shape = input_shapes.get(inp.name)
        if shape is not None and len(shape) == len(inp.type.tensor_type.shape.dim):
            for dim, size in zip(inp.type.tensor_type.shape.dim, shape):
                dim.Clear()
                dim.dim_value = int(size)
    out = onnx.ModelProto()
    out.CopyFrom(skeleton)
    out.graph.ClearField("value_info")
    out.graph.value_info.extend(_infer(view, where).graph.value_info)
    refuse_absurd_sizes(out, where)
    return out


def refuse_absurd_sizes(model: onnx.ModelProto, where: str, limit: int | None = None) -> None:
    """OnnxLoadError when a tensor whose shape inference gave a concrete shape would hold more bytes than this
    machine can hold three times (ONNX Runtime's buffer, the exposed copy and the comparison's: a corrupt or
    hostile file asking for 10^12 elements): said before anything runs."""
    limit = limit or machine_memory() // 3
    for vi in list(model.graph.value_info) + list(model.graph.output):
        tt = vi.type.tensor_type
        if not tt.HasField("shape") or not all(d.HasField("dim_value") for d in tt.shape.dim):
            continue
        try:
            itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            continue
        dims = [d.dim_value for d in tt.shape.dim]
        size = math.prod(dims) * itemsize
        if size > limit:
            raise OnnxLoadError(f"{where} computes tensor '{vi.name}' of shape {dims} ({size / 2**30:.3g} GiB), more "
                                f"than a third of this machine's memory ({limit / 2**30:.3g} GiB; onnx-bisect holds an "
                                "exposed tensor about three times). The file is corrupt, or made "
                                "for other input sizes: check its shapes (onnx-bisect coverage shows them).")


def machine_memory() -> int:
    """Bytes of physical memory (a generous 1 TiB when the platform does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 2 ** 40


def _infer(view: onnx.ModelProto, where: str) -> onnx.ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(view, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        raise OnnxLoadError(f"Shape inference failed on {where}: {str(exc)[:300]}.") from exc


