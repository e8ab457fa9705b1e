"""The repro of the first divergence: the segment the report blames, cut out as a model of its own with the exact
PyTorch values at its inputs, and the diagnosis' confirmed fix applied to it (built only when asked: ``--extract``
or the Python API's ``extractable``)."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from ..diagnose import DiagnosisContext, confirmed_fix, fix_reference
from ..records import Divergence, Repro, RuntimeSettings, StandaloneSegment
from ..records.graph import GraphIndex


def build_repro(ctx: DiagnosisContext, first: Divergence, runtime: RuntimeSettings) -> Repro | None:
    """The repro of ``first`` as diagnosed on ``ctx``: the segment computing the divergent tensor from the cut
    tensors (the narrowed op's region when the divergence was narrowed: ``ctx`` is cut there), or, when no
    segment introduces the error by itself, everything upstream of it from the graph inputs."""
    error = ctx.error
    if error is None or ctx.tensor not in ctx.onnx.graph.producer:
        return None
    index = ctx.onnx.graph
    sub, values, store = ctx.segment_model(from_inputs=not first.introduced)
    segment = StandaloneSegment(_typed_output(sub, index, ctx.tensor), store, _plain(values), ctx.tensor,
                                np.asarray(ctx.reference))
    fixed = None
    found = confirmed_fix(ctx, first)
    if found is not None:
        finding, fix = found
        sub, values, store = ctx.segment_model(fix.model, fix.weights, feeds=fix.feeds,
                                               from_inputs=finding.from_inputs or not first.introduced)
        fixed = StandaloneSegment(_typed_output(sub, index, ctx.tensor), store, _plain(values), ctx.tensor,
                                  np.asarray(fix_reference(ctx, finding)), optimize=finding.optimize)
    return Repro(segment, error, first.introduced, runtime, ctx.tolerance, fixed,
                 fix=f"{first.cause.value}: {first.fix}" if found is not None else "",
                 half_resolution=ctx.tensor in index.half_resolution)


def _typed_output(sub: onnx.ModelProto, index: GraphIndex, tensor: str) -> onnx.ModelProto:
    """``sub`` with its output typed as the graph types it (element type, and shape where every dimension is
    known), so that the file stands on its own; an output of an op shape inference does not know stays untyped."""
    elem = index.elem_types.get(tensor)
    if not elem:
        return sub
    shape = index.shapes.get(tensor)
    known = shape is not None and all(isinstance(d, int) for d in shape)
    del sub.graph.output[:]
    sub.graph.output.append(helper.make_tensor_value_info(tensor, elem, list(shape) if known else None))
    return sub


def _plain(values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Plain contiguous arrays (no resolution marks), as a file holds them."""
    return {name: np.ascontiguousarray(np.asarray(v)) for name, v in values.items()}
