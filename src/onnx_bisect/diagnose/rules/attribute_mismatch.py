"""Attributes: an ONNX node's configuration (Softmax axis, Transpose perm, Conv strides/pads/dilations/groups,
Pad mode, pooling windows …) contradicts the PyTorch module's, or another value reproduces PyTorch exactly."""
from __future__ import annotations

import itertools

from ..support import edits, layout
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

PAD_MODES = {"ReflectionPad1d": "reflect", "ReflectionPad2d": "reflect", "ReflectionPad3d": "reflect",
             "ReplicationPad1d": "edge", "ReplicationPad2d": "edge", "ReplicationPad3d": "edge",
             "ZeroPad1d": "constant", "ZeroPad2d": "constant", "ConstantPad1d": "constant",
             "ConstantPad2d": "constant", "ConstantPad3d": "constant", "CircularPad2d": "wrap"}


class AttributeMismatch(Rule):
    """Check node attributes against the module's configuration, then try the plausible alternatives."""

    cause = Cause.ATTRIBUTE_MISMATCH

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        wrong = [w for p in ctx.segment_protos for w in _expected(ctx, p) if _norm(w[3], w[4]) != _norm(w[2], w[4])]
        confirmed_by_search = False
        if not wrong:
            wrong = _search(ctx)
            confirmed_by_search = bool(wrong)
        if not wrong:
            return None
        rows = [{"onnx_node": node, "attribute": attr, "onnx_value": _plain(have), "expected": _plain(want),
                 "source": source} for node, attr, have, want, _, source in wrong]
        listed = "; ".join(f"{node}.{attr} = {_plain(have)} where {source} implies {_plain(want)}"
                           for node, attr, have, want, _, source in wrong)
        summary = f"Node attributes disagree with PyTorch: {listed}."
        if confirmed_by_search:
            summary += " With that value the segment reproduces PyTorch's output."
        fix = ("Set the attribute(s) to the values above, or re-export: the tool or hand edit that produced this "
               "graph changed the node's configuration.")
        return Finding(self.cause, 0.9 if confirmed_by_search else 0.85, summary, fix, {"attributes": rows},
                       counterfactual=lambda c: _apply(c, wrong))


def _expected(ctx: DiagnosisContext, proto):
    """``(node, attribute, onnx value, expected value, rank, source)`` from the emitting module's configuration."""
    info = next(n for n in ctx.segment_nodes if n.name == proto.name)
    qualname, module = ctx.module_of(info)
    if module is None:
        return
    kind = type(module).__name__
    if proto.op_type == "Conv" and kind in layout.BN_TYPES:  # dynamo scopes a folded Conv to its BatchNorm
        pair = layout.conv_bn_pair(ctx)
        qualname, module = (pair[0], pair[1]) if pair is not None else (qualname, module)
        kind = type(module).__name__
    source = f"{qualname} ({kind})"
    rank = len(ctx.onnx.graph.shapes.get(proto.input[0], ()) or ()) if proto.input else 0
    if proto.op_type in ("Softmax", "LogSoftmax") and kind in ("Softmax", "LogSoftmax") and module.dim is not None:
        default = -1 if _opset(ctx) >= 13 else 1
        yield proto.name, "axis", attribute(proto, "axis", default), module.dim, rank, f"{source} dim"
    elif proto.op_type == "Conv" and kind in ("Conv1d", "Conv2d", "Conv3d"):
        yield proto.name, "strides", list(attribute(proto, "strides", [1] * len(module.stride))), list(module.stride), 0, source
        yield proto.name, "dilations", list(attribute(proto, "dilations", [1] * len(module.dilation))), list(module.dilation), 0, source
        yield proto.name, "group", attribute(proto, "group", 1), module.groups, 0, source
        if isinstance(module.padding, tuple) and module.padding_mode == "zeros" and attribute(proto, "auto_pad", "NOTSET") == "NOTSET":
            yield proto.name, "pads", list(attribute(proto, "pads", [0] * 2 * len(module.padding))), list(module.padding) * 2, 0, source
    elif proto.op_type == "Pad" and kind in PAD_MODES:
        yield proto.name, "mode", attribute(proto, "mode", "constant"), PAD_MODES[kind], 0, source
    elif proto.op_type in ("MaxPool", "AveragePool") and kind in ("MaxPool2d", "AvgPool2d", "MaxPool1d", "AvgPool1d"):
        n = len(attribute(proto, "kernel_shape", []))
        as_list = (lambda v: [v] * n if isinstance(v, int) else list(v))
        yield proto.name, "kernel_shape", list(attribute(proto, "kernel_shape", [])), as_list(module.kernel_size), 0, source
        yield proto.name, "strides", list(attribute(proto, "strides", [1] * n)), as_list(module.stride or module.kernel_size), 0, source
        yield proto.name, "ceil_mode", attribute(proto, "ceil_mode", 0), int(module.ceil_mode), 0, source
    elif proto.op_type == "LeakyRelu" and kind == "LeakyReLU":
        yield proto.name, "alpha", round(attribute(proto, "alpha", 0.01), 6), round(module.negative_slope, 6), 0, source
    elif proto.op_type == "Elu" and kind == "ELU":
        yield proto.name, "alpha", round(attribute(proto, "alpha", 1.0), 6), round(module.alpha, 6), 0, source


def _search(ctx: DiagnosisContext):
    """Try each plausible alternative value of each searchable attribute; keep one that makes the segment agree."""
    for proto in ctx.segment_protos:
        for attr, have, value in _alternatives(ctx, proto):
            model = edits.set_attribute(edits.copy_model(ctx.onnx.skeleton), proto.name, attr, value)
            try:
                values = ctx.run_segment(model, ctx.onnx.weights)
            except Exception:  # noqa: BLE001 - an alternative the runtime rejects is simply not the answer
                continue
            if ctx.compare(values[ctx.tensor], ctx.reference).ok:
                return [(proto.name, attr, have, value, 0, "the PyTorch output")]
    return []


def _alternatives(ctx: DiagnosisContext, proto):
    shape = ctx.onnx.graph.shapes.get(proto.input[0]) if proto.input else None
    rank = len(shape) if shape else 0
    if proto.op_type in ("Softmax", "LogSoftmax", "Hardmax") and rank:
        have = attribute(proto, "axis", -1 if _opset(ctx) >= 13 else 1) % rank
        yield from (("axis", have, a) for a in range(rank) if a != have)
    elif proto.op_type == "Transpose" and shape and None not in shape:
        have = list(attribute(proto, "perm", list(range(rank))[::-1]))
        out = [shape[i] for i in have]
        for i, j in itertools.combinations(range(rank), 2):
            perm = list(have)
            perm[i], perm[j] = perm[j], perm[i]
            if [shape[k] for k in perm] == out:
                yield "perm", have, perm
    elif proto.op_type == "Pad":
        have = attribute(proto, "mode", "constant")
        yield from (("mode", have, m) for m in ("constant", "reflect", "edge") if m != have)
    elif proto.op_type == "Gemm":
        for attr in ("transA", "transB"):
            operand = ctx.onnx.graph.shapes.get(proto.input[0 if attr == "transA" else 1])
            if operand and len(operand) == 2 and operand[0] == operand[1]:
                yield attr, attribute(proto, attr, 0), 1 - attribute(proto, attr, 0)


def _apply(ctx: DiagnosisContext, wrong) -> FixedSegment:
    model = edits.copy_model(ctx.onnx.skeleton)
    for node, attr, _, want, _, _ in wrong:
        edits.set_attribute(model, node, attr, want)
    return FixedSegment(model, ctx.onnx.weights)


def _norm(value, rank: int):
    return value % rank if rank and isinstance(value, int) else value


def _plain(value):
    return list(value) if isinstance(value, (list, tuple)) else value


def _opset(ctx: DiagnosisContext) -> int:
    return next((o.version for o in ctx.onnx.skeleton.opset_import if o.domain in ("", "ai.onnx")), 0)
