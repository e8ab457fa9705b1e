"""Rewritten ONNX files for the alignment tests: exports run through onnxslim, ONNX Runtime's
offline optimizer and the float16 converter, plus planted weight faults and their owners."""
from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import onnx
import torch
from onnx import numpy_helper


def export(model, inputs, exporter: str) -> onnx.ModelProto:
    """``model`` exported by the dynamo or the TorchScript exporter (opset 17)."""
    if exporter == "dynamo":
        return torch.onnx.export(model, inputs, dynamo=True, verbose=False).model_proto
    buf = io.BytesIO()
    torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17)
    return onnx.load_from_string(buf.getvalue())


def slim(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model simplified by onnxslim (constants folded, scales folded into MatMuls, metadata dropped)."""
    import onnxslim

    return onnxslim.slim(proto)


def ort_optimized(proto: onnx.ModelProto, level: str = "extended") -> onnx.ModelProto:
    """The model as ONNX Runtime saves it after offline optimization (``optimized_model_filepath``)."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
        onnx.save(proto, src)
        so = ort.SessionOptions()
        so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED}[level]
        so.optimized_model_filepath = dst
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        return onnx.load(dst)


def to_float16(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model converted to float16 by onnxconverter-common, float32 inputs and outputs kept."""
    from onnxconverter_common import float16

    return float16.convert_float_to_float16(proto, keep_io_types=True)


def rewrite(proto: onnx.ModelProto, kind: str) -> onnx.ModelProto:
    """``kind`` is ``slim``, ``ort-basic``, ``ort-extended`` or ``fp16``."""
    if kind == "slim":
        return slim(proto)
    if kind.startswith("ort-"):
        return ort_optimized(proto, kind[4:])
    if kind == "fp16":
        return to_float16(proto)
    raise ValueError(kind)


def weights(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """``(initializer, first consumer node)`` for every float weight matrix or kernel (float16 included)."""
    inits = {i.name: i for i in proto.graph.initializer}
    found: dict[str, str] = {}
    for node in proto.graph.node:
        for name in node.input:
            init = inits.get(name)
            if init is not None and init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) \
                    and len(init.dims) >= 2 and name not in found:
                found[name] = node.name
    return list(found.items())


def perturb(proto: onnx.ModelProto, name: str, rel: float, seed: int = 0) -> onnx.ModelProto:
    """A copy with Gaussian noise of ``rel`` times the spread of initializer ``name`` added to it."""
    planted = onnx.ModelProto()
    planted.CopyFrom(proto)
    for init in planted.graph.initializer:
        if init.name == name:
            w = numpy_helper.to_array(init)
            noise = np.random.default_rng(seed).normal(0, rel * (float(w.astype(np.float32).std()) + 1e-3), w.shape)
            init.CopyFrom(numpy_helper.from_array((w.astype(np.float32) + noise).astype(w.dtype), name))
    return planted


def owner(model: torch.nn.Module, proto: onnx.ModelProto, name: str) -> str | None:
    """The module whose parameter initializer ``name`` holds (as is or transposed); None when it
    holds no single parameter (a BatchNorm folded into a Conv's kernel)."""
    w = numpy_helper.to_array(next(i for i in proto.graph.initializer if i.name == name)).astype(np.float32)
    for pname, p in model.named_parameters():
        p = p.detach().numpy()
        for candidate in (p, p.T) if p.ndim == 2 else (p,):
            if candidate.shape == w.shape and np.allclose(candidate, w, atol=1e-3, rtol=1e-2):
                return pname.rpartition(".")[0]
    return None
