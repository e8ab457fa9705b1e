"""The repro of the first divergence: the segment the report blames, cut out as a model of its own with the exact
PyTorch values at its inputs, and the diagnosis' confirmed fix applied to it (built only when asked: ``--extract``
or the Python API's ``extractable``)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..diagnose import DiagnosisContext, confirmed_fix, fix_reference
from ..records import Divergence, Repro, RuntimeSettings, StandaloneSegment
from ..records.graph import HALF_TYPES, GraphIndex


def build_repro(ctx: DiagnosisContext, first: Divergence, runtime: RuntimeSettings) -> Repro | None:
    """The repro of ``first`` as diagnosed on ``ctx``: the segment computing the divergent tensor from the cut
    tensors (the narrowed op's region when the divergence was narrowed: ``ctx`` is cut there), or, when no
    segment introduces the error by itself, everything upstream of it from the graph inputs."""
    error = ctx.error
    if error is None or ctx.tensor not in ctx.onnx.graph.producer:
        return None
    sub, values, store = ctx.segment_model(from_inputs=not first.introduced)
    random = _seed_random_ops(sub)
    segment = StandaloneSegment(_typed_output(sub, ctx.tensor, ctx.onnx.graph), store, _plain(values), ctx.tensor,
                                np.asarray(ctx.reference))
    fixed = None
    found = confirmed_fix(ctx, first)
    if found is not None:
        finding, fix = found
        sub, values, store = ctx.segment_model(fix.model, fix.weights, feeds=fix.feeds,
                                               from_inputs=finding.from_inputs or not first.introduced)
        _seed_random_ops(sub)
        fixed = StandaloneSegment(_typed_output(sub, ctx.tensor), store, _plain(values), ctx.tensor,
                                  np.asarray(fix_reference(ctx, finding)), optimize=finding.optimize)
    return Repro(segment, error, first.introduced, runtime, ctx.tolerance, fixed,
                 fix=f"{first.cause.value}: {first.fix}" if found is not None else "",
                 half_resolution=ctx.tensor in ctx.onnx.graph.half_resolution,
                 low_precision=_low_precision(ctx.onnx.graph, ctx.tensor, None if first.introduced else segment.model),
                 random_ops=random)


#: ops that draw random numbers (Dropout only when its training_mode input is given)
RANDOM_OPS = {"Dropout": onnx.AttributeProto.INT, "RandomNormal": onnx.AttributeProto.FLOAT,
              "RandomNormalLike": onnx.AttributeProto.FLOAT, "RandomUniform": onnx.AttributeProto.FLOAT,
              "RandomUniformLike": onnx.AttributeProto.FLOAT, "Multinomial": onnx.AttributeProto.FLOAT,
              "Bernoulli": onnx.AttributeProto.FLOAT}


def _seed_random_ops(sub: onnx.ModelProto) -> tuple[str, ...]:
    """Give every random op of ``sub`` without a seed the seed 0 (so that the repro draws the same numbers at each
    run); return their names.  Their error still differs from the report's run, which drew its own."""
    found = []
    for node in sub.graph.node:
        kind = RANDOM_OPS.get(node.op_type) if node.domain in ("", "ai.onnx") else None
        if kind is None or (node.op_type == "Dropout" and len([i for i in node.input if i]) < 3):
            continue
        found.append(node.name or node.op_type)
        if not any(a.name == "seed" for a in node.attribute):
            node.attribute.append(helper.make_attribute("seed", 0 if kind == onnx.AttributeProto.INT else 0.0))
    return tuple(found)


def _typed_output(sub: onnx.ModelProto, tensor: str, index: GraphIndex | None = None) -> onnx.ModelProto:
    """``sub`` with its output typed, so that the file stands on its own: as the graph types it (``index``: the
    unmodified segment), else as shape inference on ``sub`` finds it (a fix may change the dtype); an output of an
    op neither knows stays untyped."""
    elem, shape = (index.elem_types.get(tensor), index.shapes.get(tensor)) if index is not None else (None, None)
    if not elem:
        try:
            inferred = onnx.shape_inference.infer_shapes(sub)
        except Exception:  # noqa: BLE001 - an op shape inference does not know: leave the output untyped
            return sub
        info = next((v for v in [*inferred.graph.value_info, *inferred.graph.output] if v.name == tensor), None)
        if info is None or not info.type.tensor_type.elem_type:
            return sub
        elem = info.type.tensor_type.elem_type
        dims = info.type.tensor_type.shape.dim if info.type.tensor_type.HasField("shape") else None
        shape = None if dims is None else tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
    known = shape is not None and all(isinstance(d, int) and d > 0 for d in shape)
    del sub.graph.output[:]
    sub.graph.output.append(helper.make_tensor_value_info(tensor, elem, list(shape) if known else None))
    return sub


def _low_precision(index: GraphIndex, tensor: str, path: onnx.ModelProto | None = None) -> bool:
    """Whether ``tensor`` carries half-precision rounding: a float16/bfloat16 tensor, float32 holding float16 data,
    a Cast up from a half-precision tensor, or (``path``: an error built up from the graph inputs) a value computed
    through half-precision tensors."""
    half = HALF_TYPES
    node = index.node_of(tensor)
    cast_up = node is not None and node.op_type == "Cast" and bool(node.inputs) and \
        index.elem_types.get(node.inputs[0]) in half
    through = path is not None and any(index.elem_types.get(t) in half for n in path.graph.node for t in n.output)
    return tensor in index.half_resolution or index.elem_types.get(tensor) in half or cast_up or through


def _plain(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Plain contiguous arrays (no resolution marks), as a file holds them."""
    return {name: np.ascontiguousarray(np.asarray(v)) for name, v in values.items()}
