"""Split an ONNX model into a light graph skeleton and its large initializers.

Every rewrite and every extra ONNX Runtime session then works on a graph of a
few hundred KB: the weights are handed to the runtime as shared buffers
instead of being copied and serialised again for each session (serialising
bert-base costs seconds; the skeleton costs milliseconds).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

#: initializers at least this large (bytes) are split off; small ones stay inline
#: so shape inference still sees constant shapes and axes.
SPLIT_BYTES = 1024
PLACEHOLDER_LOCATION = "onnx-bisect-shared-weights"


@dataclass(frozen=True)
class Weights:
    """Large initializers by name, as read-only numpy arrays."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __contains__(self, name: str) -> bool:
        return name in self.arrays


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
        arrays[init.name] = _to_array(init)
        for name in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
            init.ClearField(name)
        init.data_location = onnx.TensorProto.EXTERNAL
        del init.external_data[:]
        init.external_data.add(key="location", value=PLACEHOLDER_LOCATION)
    return skeleton, Weights(arrays)


def _nbytes(init: onnx.TensorProto) -> int:
    count = int(np.prod(init.dims)) if init.dims else 1
    return count * np.dtype(helper.tensor_dtype_to_np_dtype(init.data_type)).itemsize if init.data_type not in (
        onnx.TensorProto.STRING, onnx.TensorProto.UNDEFINED) else 0


def _to_array(init: onnx.TensorProto) -> np.ndarray:
    if init.raw_data and init.data_type not in (onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT8E4M3FN):
        dtype = helper.tensor_dtype_to_np_dtype(init.data_type)
        return np.frombuffer(init.raw_data, dtype=dtype).reshape(tuple(init.dims))
    return numpy_helper.to_array(init)


def join_weights(skeleton: onnx.ModelProto, weights: Weights) -> onnx.ModelProto:
    """A self-contained copy of ``skeleton`` with the weights written back inline."""
    model = onnx.ModelProto()
    model.CopyFrom(skeleton)
    for init in model.graph.initializer:
        if init.name in weights and init.data_location == onnx.TensorProto.EXTERNAL:
            init.CopyFrom(numpy_helper.from_array(weights.arrays[init.name], init.name))
    return model
