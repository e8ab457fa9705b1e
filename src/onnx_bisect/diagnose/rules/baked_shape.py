"""Baked shape: the ONNX segment computes a tensor of another size than PyTorch — a dimension became a constant.

The classic: the model code turns a size into a Python int (``int(x.shape[0])``,
``b = x.size(0)`` used in arithmetic), the TorchScript tracer or ``torch.export``
records it as a constant, and the graph only works at the size it was exported
with.  At any other batch size or sequence length a Reshape/Expand/Tile with that
constant either fails or silently mixes rows.
"""
from __future__ import annotations

import numpy as np

from ...records import Cause
from ..context import DiagnosisContext, Finding, Rule

#: ops whose constant shape-like input fixes the size of their output
SHAPED_OPS = {"Reshape": 1, "Expand": 1, "Tile": 1, "ConstantOfShape": 0, "Resize": 3, "Slice": 2}


class BakedShape(Rule):
    """The divergent tensor's size differs from PyTorch's; name the segment nodes whose shape is a constant."""

    cause = Cause.BAKED_SHAPE

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        diff = ctx.layer.local if ctx.layer.local is not None and ctx.layer.local.actual_shape else ctx.layer.diff
        if diff is None or diff.actual_shape is None:
            return None
        expected = tuple(ctx.layer.pair.activation.value.shape)
        constants = _constant_shapes(ctx)
        nodes = ", ".join(f"{name} ({op} to {list(values)})" for name, (op, values) in constants.items())
        summary = (f"ONNX computes {ctx.layer.pair.activation.name} with shape {list(diff.actual_shape)} where "
                   f"PyTorch has {list(expected)}: the graph does not follow the input's size. "
                   + (f"The segment sizes its output from constants: {nodes}." if constants else
                      "No node of the segment has a constant shape input; the constant lies upstream "
                      "(a Shape/Gather chain folded at export)."))
        fix = ("A dimension was baked into the graph at export. In the model code, do not turn tensor sizes into "
               "Python ints before reshaping (int(x.shape[0]), x.size(0) in arithmetic, numpy on shapes); use -1 or "
               "the tensor's own shape, then re-export with this dimension dynamic (dynamic_shapes / dynamic_axes) "
               "— or only deploy at the size the file was exported with.")
        evidence = {"onnx_shape": list(diff.actual_shape), "pytorch_shape": list(expected),
                    "constant_shapes": {name: {"op": op, "shape": list(values)} for name, (op, values) in
                                        constants.items()}}
        return Finding(self.cause, 0.9 if constants else 0.7, summary, fix, evidence)


def _constant_shapes(ctx: DiagnosisContext) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Segment nodes of a shape-setting op whose shape input is an initializer or a Constant."""
    out = {}
    for node in ctx.segment_protos:
        position = SHAPED_OPS.get(node.op_type)
        if position is None or len(node.input) <= position:
            continue
        value = ctx.constant(node.input[position])
        if value is not None and value.dtype.kind in "iu":
            out[node.name] = (node.op_type, tuple(int(v) for v in np.asarray(value).reshape(-1)))
    return out
