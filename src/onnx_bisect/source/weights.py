"""Split an ONNX model into a light graph skeleton and its large initializers.

Every rewrite and every extra ONNX Runtime session then works on a graph of a
few hundred KB: the weights are handed to the runtime as shared buffers
instead of being copied and serialised again for each session (serialising
bert-base costs seconds; the skeleton costs milliseconds).
"""
from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import helper, numpy_helper

from ..errors import OnnxLoadError
from ..records.weights import Weights, register_mapping
from .external import NUMPY_TYPES, declared_size, ensure_resolved, load_external

#: initializers at least this large (bytes) are split off; small ones stay inline
#: so shape inference still sees constant shapes and axes.
SPLIT_BYTES = 1024
PLACEHOLDER_LOCATION = "onnx-bisect-shared-weights"




def split_weights(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Weights]:
    """Return ``(skeleton, weights)``; the caller's model is not modified.

    In the skeleton each large initializer keeps its name, type and dims but its
    data is marked external with a placeholder location, so the graph stays
    valid for ``onnx.checker`` and shape inference.
    """
    skeleton = onnx.ModelProto()
    skeleton.CopyFrom(model)
    arrays: dict[str, np.ndarray] = {}
    for init in skeleton.graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL or _nbytes(init) < SPLIT_BYTES:
            continue
        arrays[init.name] = to_array(init)
        _placeholder(init)
    lift_constants(skeleton, arrays)
    name_nodes(skeleton)
    return skeleton, Weights(arrays)


#: element types of the Constant nodes lifted into initializers
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                         onnx.TensorProto.DOUBLE})


def lift_constants(skeleton: onnx.ModelProto, arrays: dict[str, np.ndarray]) -> None:
    """Make each floating Constant node of the main graph that may hold a weight (:func:`_weight_like`: large, or
    a few elements arithmetic reads) a split-off initializer of the (tool-owned) skeleton, under its output's
    name: onnx-simplifier leaves some folded weights as Constant nodes (a Conv's kernel), TorchScript a rotary
    table's frequencies, and every stage then reads a weight wherever the file keeps it — compared with the
    parameters, fixed by an alternative, named in a finding.  The values stay the file's; the user's file is not touched."""
    graph = skeleton.graph
    taken = {i.name for i in graph.initializer} | {i.name for i in graph.input} | {o.name for o in graph.output}
    readers: dict[str, set[str]] = {}
    for node in graph.node:
        for i in node.input:
            readers.setdefault(i, set()).add(node.op_type if node.domain in ("", "ai.onnx") else "")
    kept = []
    for node in graph.node:
        value = node.attribute[0].t if node.op_type == "Constant" and node.domain in ("", "ai.onnx") \
            and len(node.attribute) == 1 and node.attribute[0].name == "value" and len(node.output) == 1 else None
        if value is None or node.output[0] in taken or value.data_type not in FLOAT_TYPES \
                or value.data_location == onnx.TensorProto.EXTERNAL \
                or not _weight_like(value, readers.get(node.output[0], set())):
            kept.append(node)
            continue
        init = graph.initializer.add()
        init.CopyFrom(value)
        init.name = node.output[0]
        arrays[init.name] = to_array(init)
        _placeholder(init)
    if len(kept) != len(graph.node):
        graph.ClearField("node")
        graph.node.extend(kept)


#: the ops that read a constant as data to compute with (not as an argument a shape depends on: a Resize's
#: scales, a Pad's value): a few-element floating Constant only they read may be a parameter or buffer
DATA_READERS = frozenset({"Mul", "Add", "Sub", "Div", "MatMul", "Gemm"})


def _weight_like(value: onnx.TensorProto, readers: set[str]) -> bool:
    """Whether a floating Constant node's value may be a parameter or buffer: large (a folded kernel), or a
    vector of a few elements that arithmetic reads (a rotary embedding's inverse frequencies the TorchScript
    exporter wrote as a Constant) — not a scalar (a scale, an epsilon), not an argument an op's output shape
    depends on (shape inference needs it inline)."""
    return _nbytes(value) >= SPLIT_BYTES or bool(readers) and readers <= DATA_READERS and len(value.dims) >= 1 \
        and declared_size(value, "Constant") >= 2


def _placeholder(init: onnx.TensorProto) -> None:
    """Mark ``init`` as split off: its data dropped, its location the placeholder."""
    for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        init.ClearField(name)
    init.data_location = onnx.TensorProto.EXTERNAL
    del init.external_data[:]
    init.external_data.add(key="location", value=PLACEHOLDER_LOCATION)


def _nbytes(init: onnx.TensorProto) -> int:
    if init.data_type in (onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED):
        return 0
    try:
        itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize
    except (KeyError, TypeError, ValueError):  # an element type this onnx does not know: a corrupt file
        return 0
    return declared_size(init, "Initializer") * itemsize


def to_array(init: onnx.TensorProto) -> np.ndarray:
    """An inline initializer's value, after checking that it holds as many elements as its dims declare (a
    corrupt file claiming 10^12 elements is refused before anything is allocated)."""
    count = declared_size(init, "Initializer")
    if init.raw_data and init.data_type in NUMPY_TYPES:
        dtype = np.dtype(NUMPY_TYPES[init.data_type])
        if len(init.raw_data) != count * dtype.itemsize:
            raise _size_error(init, count, dtype, len(init.raw_data))
        return np.frombuffer(init.raw_data, dtype=dtype).reshape(tuple(init.dims))
    try:
        return numpy_helper.to_array(init)
    except (ValueError, TypeError, KeyError) as exc:
        raise OnnxLoadError(f"Initializer '{init.name}' cannot be read ({type(exc).__name__}: {str(exc)[:200]}): "
                            "its data does not match its dims and type. The file is corrupt; re-export the model.") \
            from exc


def _size_error(init: onnx.TensorProto, count: int, dtype: np.dtype, have: int) -> OnnxLoadError:
    return OnnxLoadError(f"Initializer '{init.name}' declares dims {list(init.dims)} ({count} {dtype.name} elements, "
                         f"{count * dtype.itemsize} bytes) but holds {have} bytes. The file is corrupt or was edited "
                         "by hand: re-export the model.")


def join_weights(skeleton: onnx.ModelProto, weights: Weights) -> onnx.ModelProto:
    """A self-contained copy of ``skeleton`` with the weights written back inline."""
    model = onnx.ModelProto()
    model.CopyFrom(skeleton)
    for init in model.graph.initializer:
        if init.name in weights and init.data_location == onnx.TensorProto.EXTERNAL:
            init.CopyFrom(numpy_helper.from_array(weights.arrays[init.name], init.name))
    return model


# -- splitting straight from a file -------------------------------------------------
# Parsing a 400 MB model with protobuf copies every weight twice (into the message,
# then into a bytes object when read).  Walking the protobuf wire format instead
# finds each initializer's raw bytes in a memory map of the file, so the weights
# become zero-copy numpy views and only the small rest of the model is parsed.

_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_TENSOR_NAME, _TENSOR_RAW_DATA = 8, 9


def split_weights_from_file(path: str) -> tuple[onnx.ModelProto, Weights]:
    """Like :func:`split_weights` for a file, without copying the weights.

    Weights stored in external data files are memory-mapped too, from inside
    the model's folder only (see :mod:`.external`).  Falls back to a plain
    protobuf parse (external data still loaded by :mod:`.external`) for
    anything the scanner does not understand.
    """
    if Path(path).stat().st_size == 0:
        return split_weights(onnx.load(path, load_external_data=False))  # onnx's own error for an empty file
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    register_mapping(buf, path)  # ONNX Runtime then reads the weights from the file itself (see run.onnxruntime)
    try:
        skeleton_bytes, arrays = _strip_file(buf)
        skeleton = onnx.ModelProto.FromString(skeleton_bytes)
    except (ValueError, IndexError, _WireError, DecodeError):
        skeleton, arrays = split_weights(onnx.load(path, load_external_data=False))
        arrays = dict(arrays.arrays)
    arrays.update(load_external(skeleton, Path(path).parent, PLACEHOLDER_LOCATION).arrays)
    lift_constants(skeleton, arrays)
    weights = Weights(arrays)
    ensure_resolved(skeleton, weights, PLACEHOLDER_LOCATION)
    name_nodes(skeleton)
    return skeleton, weights


def name_nodes(skeleton: onnx.ModelProto) -> None:
    """Give every unnamed node of the (tool-owned) skeleton a name of its own, ``<op>_<position>``: every stage
    then finds a node by the name the report shows (an alternative editing an unnamed node of an optimized file
    found no node to edit)."""
    taken = {n.name for n in skeleton.graph.node if n.name}
    for i, node in enumerate(skeleton.graph.node):
        if node.name:
            continue
        name = f"{node.op_type}_{i}"
        while name in taken:
            name += "_"
        node.name = name
        taken.add(name)


def split_given(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Weights]:
    """:func:`split_weights` for a model handed over in memory: it must hold its data (no external file)."""
    skeleton, weights = split_weights(model)
    ensure_resolved(skeleton, weights, PLACEHOLDER_LOCATION)
    return skeleton, weights


class _WireError(Exception):
    pass


def _varint(buf, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise _WireError("varint too long")


def _fields(buf, start: int, end: int):
    """Yield ``(field_number, value_start, value_end, field_start)`` of one message."""
    pos = start
    while pos < end:
        field_start = pos
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            _, nxt = _varint(buf, pos)
        elif wire == 1:
            nxt = pos + 8
        elif wire == 2:
            length, pos = _varint(buf, pos)
            nxt = pos + length
        elif wire == 5:
            nxt = pos + 4
        else:
            raise _WireError(f"unsupported wire type {wire}")
        if nxt > end:
            raise _WireError("truncated field")
        yield number, pos, nxt, field_start
        pos = nxt


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def _strip_file(buf) -> tuple[bytes, dict[str, np.ndarray]]:
    arrays: dict[str, np.ndarray] = {}
    model_parts: list[bytes] = []
    for number, vstart, vend, fstart in _fields(buf, 0, len(buf)):
        if number != _MODEL_GRAPH:
            model_parts.append(buf[fstart:vend])
            continue
        graph_parts: list[bytes] = []
        for gnum, gstart, gend, gfield in _fields(buf, vstart, vend):
            if gnum == _GRAPH_INITIALIZER and gend - gstart >= SPLIT_BYTES:
                stripped = _strip_tensor(buf, gstart, gend, arrays)
                graph_parts.append(_length_field(_GRAPH_INITIALIZER, stripped) if stripped is not None
                                   else buf[gfield:gend])
            else:
                graph_parts.append(buf[gfield:gend])
        model_parts.append(_length_field(_MODEL_GRAPH, b"".join(graph_parts)))
    return b"".join(model_parts), arrays


def _strip_tensor(buf, start: int, end: int, arrays: dict) -> bytes | None:
    raw = None
    rest: list[bytes] = []
    for number, vstart, vend, fstart in _fields(buf, start, end):
        if number == _TENSOR_RAW_DATA:
            raw = (vstart, vend)
        else:
            rest.append(buf[fstart:vend])
    if raw is None:
        return None
    tensor = onnx.TensorProto.FromString(b"".join(rest))
    if tensor.data_type not in NUMPY_TYPES:
        return None
    dtype = np.dtype(NUMPY_TYPES[tensor.data_type])
    count = declared_size(tensor, "Initializer")
    if count * dtype.itemsize != raw[1] - raw[0]:
        raise _size_error(tensor, count, dtype, raw[1] - raw[0])
    array = np.frombuffer(buf, dtype=dtype, count=count, offset=raw[0]).reshape(tuple(tensor.dims))
    # Protobuf does not align raw_data; ONNX Runtime reads such buffers correctly on
    # the CPU (checked against aligned copies), so no copy is made.
    arrays[tensor.name] = array
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.external_data.add(key="location", value=PLACEHOLDER_LOCATION)
    return tensor.SerializeToString()
