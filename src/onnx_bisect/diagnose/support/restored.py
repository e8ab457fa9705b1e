"""What an Identity of the divergent segment may stand for, where a converter dropped an op it did not know or a
pruning step dropped an Add with its branch: the activation module next to it, the one-input ops PyTorch models
use most, a norm of the model, an Add of an earlier tensor of its shape — or of PyTorch's value, where the
branch's computation went from the file with it.  Each is an alternative the attribute rule keeps only when the
segment then reproduces PyTorch (:func:`.kind_alternatives._not_applied` asks for them)."""
from __future__ import annotations

from typing import Iterator

import numpy as np
from onnx import helper

from . import edits
from .alternative_edits import retyped
from .rewirings import FLOATS, fits, op_inputs
from .value_alternatives import base_name
from ...records.nest import to_numpy

#: same-shape tensors before an Identity tried as the operand a dropped Add read (the residual)
MAX_OPERANDS = 6


def restored(ctx, proto, make) -> Iterator:
    """What an Identity may stand for: the op of the activation module next to it (with its configuration), the
    one-input ops PyTorch models use most (default attributes), or an Add of its input and an earlier tensor of
    its shape (a residual or a branch a converter dropped) — each kept only when it reproduces PyTorch."""
    tried = set()
    opset = ctx.opset
    gelus = [("Gelu", {}), ("Gelu", {"approximate": "tanh"})] if opset >= 20 else []
    for op_type, attrs in [*module_ops(ctx, opset), *_ran(ctx), *RESTORABLE, *gelus]:
        key = (op_type, tuple(sorted(attrs.items())))
        if key in tried:
            continue
        tried.add(key)
        yield make(proto.name, "op", "Identity", op_type if not attrs else f"{op_type} {attrs}", "the PyTorch output",
                   retyped(proto.name, op_type, attrs, drop=None))
    for other in _earlier_operands(ctx, proto):
        yield make(proto.name, "op", "Identity", f"Add with {other}", "the PyTorch output",
                   _as_add(proto.name, other))
    yield from _norms_restored(ctx, proto, make)
    for op, value in _fed_operands(ctx, proto):  # the operand's computation gone from the file: PyTorch's fed
        fed = f"{proto.name}_operand_as_pytorch"
        yield make(proto.name, "op", "Identity", f"Add with PyTorch's {op.name} value (no tensor of the file holds "
                   "it: its computation was dropped with the Add)", "the PyTorch output", _as_add(proto.name, fed),
                   feeds={fed: value})


def _fed_operands(ctx, proto) -> list:
    """``(op, value)`` of PyTorch's ops around the divergence with the Identity's shape that no tensor the segment
    is fed or computes holds, nearest the divergent op first: the operand an Add a converter or a pruning step
    dropped would have read, where its computation went with it (an expert's share of a sum, a residual
    branch)."""
    shape = ctx.shape_of(proto.input[0])
    if not shape or not ctx.ops:
        return []
    read = [np.asarray(v) for v in ctx.computed([proto.input[0]]).values()]
    activation, size = ctx.layer.pair.activation, int(np.prod(shape))
    by_index = {a.index: a for a in (*ctx.baseline.capture.activations, *ctx.ops)}
    ops = op_inputs(activation, by_index, size, ctx.ops)  # what the divergent op is computed from, then the others
    read_by_op = {a.index for a in ops}
    found = []
    for op in ops + sorted((a for a in ctx.ops if a.index not in read_by_op),
                           key=lambda a: abs(a.index - activation.index)):
        value = np.asarray(op.value)
        if value.dtype.kind != "f" or value.size != int(np.prod(shape)) or not np.any(value):
            continue
        value = value.reshape(shape).astype(np.float32)
        # not the value the Identity passes on, nor (unless the divergent op reads it: a sum whose other terms are
        # zero) the divergent value itself
        held = read + ([] if op.index in read_by_op else [np.asarray(ctx.reference)])
        if any(h.size == value.size and ctx.compare(h.reshape(shape).astype(np.float32), value).ok for h in held):
            continue
        found.append((op, value))
        if len(found) >= MAX_OPERANDS:
            break
    return found


#: norm modules of the model tried in an Identity's place, at most (those nearest the divergent layer first)
MAX_RESTORED_NORMS = 4


def _norms_restored(ctx, proto, make) -> Iterator:
    """A norm of the model over the last axis (a LayerNorm, an RMSNorm: its weight, bias and epsilon) put in an
    Identity's place: a converter that dropped a norm it could not map, a port that forgot ``ln_f`` — the norm's
    modules near the segment first, then those whose width fits nearest the divergent layer."""
    width = (ctx.shape_of(proto.input[0]) or (None,))[-1] if proto.input else None
    if not width:
        return
    here = ctx.layer.pair.activation.index
    by_place = {a.module: abs(a.index - here) for a in ctx.baseline.capture.activations if a.module}
    near = [name for name, _ in ctx.modules_near()]
    norms = [(name, m) for name, m in ctx.torch_modules() if _last_axis_norm(m, width) is not None]
    norms.sort(key=lambda nm: (nm[0] not in near, by_place.get(nm[0], 1 << 30)))
    for name, module in norms[:MAX_RESTORED_NORMS]:
        op_type, weight, bias, eps = _last_axis_norm(module, width)
        yield make(proto.name, "op", "Identity", f"{op_type} (epsilon {eps:g}, the weight{'' if bias is None else ' and bias'}"
                   f" of {name})", "the PyTorch output",
                   _norm_put_back(proto.name, op_type, weight, bias, eps))


def _last_axis_norm(module, width: int):
    """``(op type, weight, bias, epsilon)`` of a norm module over the last axis of ``width`` channels (a LayerNorm,
    an RMSNorm by its class name), else None."""
    weight = getattr(module, "weight", None)
    if not hasattr(weight, "detach") or weight.dim() != 1 or weight.numel() != width:
        return None
    name = type(module).__name__
    eps = getattr(module, "eps", getattr(module, "variance_epsilon", None))
    if eps is None or "Norm" not in name or any(k in name for k in ("Batch", "Group", "Instance")):
        return None
    bias = getattr(module, "bias", None)
    rms = "RMS" in name.upper()
    return ("SimplifiedLayerNormalization" if rms else "LayerNormalization", to_numpy(weight).astype(np.float32),
            None if rms or not hasattr(bias, "detach") else to_numpy(bias).astype(np.float32), float(eps))


def _norm_put_back(node: str, op_type: str, weight: np.ndarray, bias: np.ndarray | None, eps: float):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type, target.domain = op_type, ""
        del target.input[1:]
        target.input.append(edits.add_initializer(model, f"{node}_restored_weight", weight))
        if bias is not None:
            target.input.append(edits.add_initializer(model, f"{node}_restored_bias", bias))
        del target.attribute[:]
        target.attribute.extend([helper.make_attribute("axis", -1), helper.make_attribute("epsilon", eps)])
        return model, weights
    return edit


#: one-input ONNX ops (default attributes) an ATen op of the same name computes (``aten.sin`` → Sin)
UNARY_OPS = ("Sin", "Cos", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Relu", "Abs", "Neg", "Reciprocal", "Erf",
             "Floor", "Ceil", "Round", "Sign", "Softplus")


def _ran(ctx) -> list[tuple[str, dict]]:
    """The one-input ops PyTorch ran around the segment (its captured ATen ops), in the order it ran them: an
    Identity most likely stands for one of them (a rotary table's ``sin``)."""
    by_name = {op.lower(): op for op in UNARY_OPS}
    names = [by_name.get(base_name(a.module_type)) for a in ctx.ops]
    return [(n, {}) for n in dict.fromkeys(n for n in names if n)]


def module_ops(ctx, opset: int) -> list[tuple[str, dict]]:
    found = []
    for _, module in ctx.modules_near():
        name = type(module).__name__
        if opset >= 20 and name in ("GELU", "GELUActivation", "GELUTanh", "NewGELUActivation", "PytorchGELUTanh"):
            tanh = getattr(module, "approximate", "none") == "tanh" or "Tanh" in name or name.startswith("New")
            found.append(("Gelu", {"approximate": "tanh"} if tanh else {}))
            continue
        make_op = MODULE_OPS.get(name)
        op = make_op(module) if make_op is not None else None
        if op is not None:
            found.append(op)
    return found


def _earlier_operands(ctx, proto) -> list[str]:
    """Float tensors of the Identity input's shape computed before it, nearest first (the tensors paired with
    PyTorch values — module outputs, where a residual stream runs — before the others)."""
    graph = ctx.onnx.graph
    shape = ctx.shape_of(proto.input[0])
    at = graph.producer.get(proto.output[0])
    if not shape or at is None:
        return []
    paired, others = [], []
    for node in reversed(graph.nodes[:at]):
        for t in node.outputs:
            if t and t != proto.input[0] and fits(graph.shapes.get(t), shape) and graph.elem_types.get(t) in FLOATS:
                (paired if t in ctx.cut.references else others).append(t)
    return (paired + others)[:MAX_OPERANDS]


def _as_add(node: str, other: str):
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = "Add"
        del target.attribute[:]
        del target.input[1:]
        target.input.append(other)
        return model, weights
    return edit


#: what an Identity may stand for where a converter dropped an op it did not know: one-input ops with PyTorch's
#: default attributes (a module's own configuration is tried first, see :func:`module_ops`)
RESTORABLE = (("Relu", {}), ("Sigmoid", {}), ("Tanh", {}), ("Neg", {}), ("Sqrt", {}), ("Exp", {}), ("Log", {}),
              ("Abs", {}), ("Reciprocal", {}), ("Erf", {}), ("Softplus", {}), ("Elu", {"alpha": 1.0}),
              ("LeakyRelu", {"alpha": 0.01}), ("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}), ("HardSwish", {}),
              ("Softmax", {"axis": -1}), ("Sin", {}), ("Cos", {}))


#: PyTorch activation modules and the ONNX op (with the module's attributes) computing them
MODULE_OPS = {"ReLU": lambda m: ("Relu", {}), "Sigmoid": lambda m: ("Sigmoid", {}), "Tanh": lambda m: ("Tanh", {}),
              "LeakyReLU": lambda m: ("LeakyRelu", {"alpha": float(m.negative_slope)}),
              "ELU": lambda m: ("Elu", {"alpha": float(m.alpha)}), "CELU": lambda m: ("Celu", {"alpha": float(m.alpha)}),
              "SELU": lambda m: ("Selu", {}), "Softplus": lambda m: ("Softplus", {}) if m.beta == 1 else None,
              "Hardsigmoid": lambda m: ("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5}),
              "Hardswish": lambda m: ("HardSwish", {}), "Softsign": lambda m: ("Softsign", {}),
              "Softmax": lambda m: ("Softmax", {"axis": -1 if m.dim is None else int(m.dim)}),
              "LogSoftmax": lambda m: ("LogSoftmax", {"axis": -1 if m.dim is None else int(m.dim)}),
              "Mish": lambda m: ("Mish", {})}
