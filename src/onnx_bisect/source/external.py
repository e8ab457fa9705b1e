"""External data, confined: an initializer whose bytes live in another file is read only from inside the
model's folder, and only after every reference has been checked.

ONNX files travel (model hubs, bug reports, CI artefacts), and an external-data
location is a path the file's author chose.  The ``onnx`` package refuses
locations that leave the model's folder when it loads external data; onnx-bisect
memory-maps the data itself, so it applies the same rules, and more, before
reading a byte: a relative location without ``..``, resolving (symbolic links
included) to a regular file inside the model's folder, an offset and a length
inside that file, and a length equal to what the tensor's dims and dtype need.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterator

import numpy as np
import onnx

from ..errors import OnnxLoadError
from ..records.weights import Weights, register_mapping

#: the ONNX element types whose bytes can be mapped as numpy arrays of the same type
NUMPY_TYPES = {
    t: onnx.helper.tensor_dtype_to_np_dtype(t)
    for t in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.INT8,
              onnx.TensorProto.UINT8, onnx.TensorProto.INT16, onnx.TensorProto.UINT16, onnx.TensorProto.INT32,
              onnx.TensorProto.UINT32, onnx.TensorProto.INT64, onnx.TensorProto.UINT64, onnx.TensorProto.BOOL)
}


@dataclass(frozen=True)
class ExternalRef:
    """One checked external-data reference: which bytes of which file hold which tensor."""

    tensor: str
    file: Path  # resolved, inside the model's folder
    offset: int
    nbytes: int
    dtype: np.dtype
    shape: tuple[int, ...]


def declared_size(tensor: onnx.TensorProto, what: str) -> int:
    """The number of elements ``tensor``'s dims declare (never negative; Python integers, no overflow)."""
    dims = list(tensor.dims)
    if any(d < 0 for d in dims):
        raise OnnxLoadError(f"{what} '{tensor.name}' declares negative dims {dims}. The file is corrupt or was edited "
                            "by hand: re-export the model.")
    return math.prod(dims)


def check_external(tensor: onnx.TensorProto, folder: Path) -> ExternalRef:
    """The checked reference of one tensor stored as external data; OnnxLoadError before reading anything."""
    info = {e.key: e.value for e in tensor.external_data}
    where = f"Initializer '{tensor.name}' keeps its data in"
    location = info.get("location", "")
    if not location or "\x00" in location:
        raise OnnxLoadError(f"Initializer '{tensor.name}' is marked as external data but names no file. The file is "
                            "incomplete: re-save it with onnx.save_model(..., save_as_external_data=True).")
    _check_location(location, where)
    root = folder.resolve()
    file = (root / location).resolve()
    if not file.is_relative_to(root):
        raise OnnxLoadError(f"{where} '{location}', which leads outside the model's folder ({root}) through a symbolic "
                            "link. onnx-bisect reads external data only from inside the model's folder: copy the data "
                            "file there.")
    if not file.is_file():
        raise OnnxLoadError(f"{where} '{location}', which is {'not a regular file' if file.exists() else 'missing'} "
                            f"in {root}. Put the model's external data files beside it.")
    if tensor.data_type not in NUMPY_TYPES:
        name = onnx.TensorProto.DataType.Name(tensor.data_type) if tensor.data_type in \
            onnx.TensorProto.DataType.values() else str(tensor.data_type)
        raise OnnxLoadError(f"{where} '{location}' as {name}, a type onnx-bisect cannot read from external data. "
                            "Save this initializer inside the model file (size_threshold above its size).")
    dtype = np.dtype(NUMPY_TYPES[tensor.data_type])
    nbytes = declared_size(tensor, "Initializer") * dtype.itemsize
    offset, length = _integer(info, "offset", 0, where, location), _integer(info, "length", None, where, location)
    size = file.stat().st_size
    if length is not None and length != nbytes:
        raise OnnxLoadError(f"{where} '{location}' with length {length}, but its dims {list(tensor.dims)} of "
                            f"{dtype.name} need {nbytes} bytes. The file is corrupt or was edited by hand.")
    if offset + nbytes > size:
        raise OnnxLoadError(f"{where} '{location}' at bytes {offset}..{offset + nbytes}, beyond the end of that file "
                            f"({size} bytes). The data file is truncated or belongs to another model.")
    return ExternalRef(tensor.name, file, offset, nbytes, dtype, tuple(tensor.dims))


def _check_location(location: str, where: str) -> None:
    """A location must be a relative path that does not climb out of the folder."""
    posix, windows = PurePosixPath(location), PureWindowsPath(location)
    if posix.is_absolute() or windows.is_absolute() or windows.drive or location.startswith(("/", "\\")):
        raise OnnxLoadError(f"{where} '{location}', an absolute path. onnx-bisect reads external data only from "
                            "inside the model's folder: save the data beside the model with a relative location.")
    if ".." in posix.parts or ".." in windows.parts:
        raise OnnxLoadError(f"{where} '{location}', a path that climbs out of the model's folder ('..'). onnx-bisect "
                            "reads external data only from inside the model's folder.")


def _integer(info: dict[str, str], key: str, default, where: str, location: str):
    """An external-data offset or length: a non-negative integer."""
    if key not in info:
        return default
    try:
        value = int(info[key])
    except ValueError:
        value = -1
    if value < 0:
        raise OnnxLoadError(f"{where} '{location}' with {key} '{info[key]}', which is not a byte count. The file "
                            "is corrupt or was edited by hand.")
    return value


def external_tensors(graph: onnx.GraphProto, top: bool = True) -> Iterator[tuple[onnx.TensorProto, bool]]:
    """Every tensor of ``graph`` stored as external data, and whether it is a top-level initializer (not one of
    a subgraph, nor a Constant's attribute)."""
    for init in graph.initializer:
        if init.data_location == onnx.TensorProto.EXTERNAL:
            yield init, top
    for node in graph.node:
        for attr in node.attribute:
            tensors = ([attr.t] if attr.HasField("t") else []) + list(attr.tensors)
            for t in tensors:
                if t.data_location == onnx.TensorProto.EXTERNAL:
                    yield t, False
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from external_tensors(sub, top=False)


#: external tensors smaller than this are read into the model (shapes and axes: ONNX Runtime's shape
#: inference needs their values in the graph), as :data:`.weights.SPLIT_BYTES` keeps them inline
INLINE_BYTES = 1024


def load_external(skeleton: onnx.ModelProto, folder: Path, placeholder: str) -> Weights:
    """Memory-map the external data of ``skeleton``'s top-level initializers (their locations become
    ``placeholder``); the few stored externally elsewhere (a subgraph, a Constant) or smaller than
    :data:`INLINE_BYTES` are read into the model.

    Every reference is checked before any file is opened (see :func:`check_external`).
    """
    found = [(t, top, check_external(t, folder)) for t, top in external_tensors(skeleton.graph)
             if not _is_placeholder(t, placeholder)]
    maps: dict[Path, mmap.mmap] = {}
    arrays: dict[str, np.ndarray] = {}
    for tensor, top, ref in found:
        if ref.file not in maps:
            with open(ref.file, "rb") as f:
                maps[ref.file] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if ref.file.stat().st_size else b""
            if maps[ref.file]:
                register_mapping(maps[ref.file], ref.file)
        count = ref.nbytes // ref.dtype.itemsize if ref.dtype.itemsize else 0
        array = np.frombuffer(maps[ref.file], dtype=ref.dtype, count=count, offset=ref.offset).reshape(ref.shape)
        del tensor.external_data[:]
        if top and ref.nbytes >= INLINE_BYTES:
            arrays[tensor.name] = array
            tensor.external_data.add(key="location", value=placeholder)
        else:
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = array.tobytes()
    return Weights(arrays)


def _is_placeholder(tensor: onnx.TensorProto, placeholder: str) -> bool:
    return any(e.key == "location" and e.value == placeholder for e in tensor.external_data)


def ensure_resolved(skeleton: onnx.ModelProto, weights: Weights, placeholder: str) -> None:
    """Refuse a model that still points at external data onnx-bisect did not load itself: ONNX Runtime would
    otherwise read that file on its own, from wherever the location says."""
    for tensor, top in external_tensors(skeleton.graph):
        if top and _is_placeholder(tensor, placeholder) and tensor.name in weights:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        raise OnnxLoadError(f"Initializer '{tensor.name}' keeps its data in external file '{location}', which "
                            "onnx-bisect has not read: pass the model as a file path (its external data beside it), "
                            "or load it with onnx.load(path) before handing it over.")
