"""Epsilon: a normalization's epsilon in the ONNX segment differs from the PyTorch module's ``eps``."""
from __future__ import annotations

import math

import numpy as np

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

#: normalization ops carrying an ``epsilon`` attribute (ONNX default 1e-5)
NORM_OPS = {"LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
            "RMSNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
            "SkipSimplifiedLayerNormalization"}
#: ops that take the square root of (variance + eps) in a decomposed normalization
ROOT_OPS = {"Sqrt", "Reciprocal", "Pow", "Rsqrt"}
EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "layer_norm_eps")
#: PyTorch's normalization ops (ATen), whose last float argument is the eps, by the ONNX op they export as
NORM_ATEN = {"LayerNormalization": ("aten.native_layer_norm", "aten.layer_norm"),
             "GroupNormalization": ("aten.native_group_norm", "aten.group_norm"),
             "BatchNormalization": ("aten.native_batch_norm", "aten._native_batch_norm_legit", "aten.batch_norm"),
             "InstanceNormalization": ("aten.native_batch_norm", "aten._native_batch_norm_legit",
                                       "aten.instance_norm")}
ANY_NORM_ATEN = tuple(dict.fromkeys(op for ops in NORM_ATEN.values() for op in ops))


class EpsilonMismatch(Rule):
    """Compare every epsilon in the segment (attribute, or the constant added before a square root) with ``eps``."""

    cause = Cause.EPSILON_MISMATCH

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        wrong = [site for site in _sites(ctx) if not math.isclose(site[2], site[3], rel_tol=1e-3, abs_tol=1e-30)]
        if not wrong:
            return None
        listed = "; ".join(f"{node} ({kind}) uses {onnx_eps:g} where {module} has eps={torch_eps:g}"
                           for node, kind, onnx_eps, torch_eps, module, _ in wrong)
        evidence = {"mismatches": [{"onnx_node": node, "where": kind, "onnx_epsilon": onnx_eps,
                                    "pytorch_eps": torch_eps, "module": module}
                                   for node, kind, onnx_eps, torch_eps, module, _ in wrong]}
        summary = (f"Normalization epsilon differs: {listed}. With small variances this shifts every normalized "
                   f"value (local max abs {ctx.layer.local.max_abs:.2g}).")
        fix = ("Restore the module's eps in the ONNX graph (the epsilon attribute, or the constant added before the "
               "square root) and check whatever tool rewrote it; re-exporting from the module gives the right value.")
        return Finding(self.cause, 0.9, summary, fix, evidence, changes=tuple(dict.fromkeys(w[0] for w in wrong)),
                       counterfactual=lambda c: _restore(c, wrong))


def _sites(ctx: DiagnosisContext):
    """``(node, where, onnx eps, torch eps, module, constant tensor or None)`` for every epsilon in the segment."""
    infos = {n.name: n for n in ctx.segment_nodes}
    for proto in ctx.segment_protos:
        torch_eps, module = _torch_eps(ctx, infos[proto.name], NORM_ATEN.get(proto.op_type, ANY_NORM_ATEN))
        if torch_eps is None and proto.op_type == "Add" and _feeds_root(ctx, proto):
            torch_eps, module = _added_eps(ctx) or (None, "")
        if torch_eps is None:
            continue
        if proto.op_type in NORM_OPS:
            yield proto.name, "epsilon attribute", float(attribute(proto, "epsilon", 1e-5)), torch_eps, module, None
        elif proto.op_type == "Add" and _feeds_root(ctx, proto):
            for tensor in proto.input:
                value = ctx.constant(tensor)
                # any finite scalar added right before the square root inside a module that has an eps is its
                # epsilon, however far off (a rewritten 0.9 as much as 1e-6)
                if value is not None and value.size == 1 and np.isfinite(float(value.reshape(-1)[0])):
                    yield proto.name, f"constant '{tensor}' added before the square root", \
                        float(value.reshape(-1)[0]), torch_eps, module, tensor


def _feeds_root(ctx: DiagnosisContext, add) -> bool:
    consumers = ctx.onnx.graph.consumers.get(add.output[0], ())
    return any(ctx.onnx.graph.nodes[i].op_type in ROOT_OPS for i in consumers)


def _torch_eps(ctx: DiagnosisContext, info, aten_ops: tuple[str, ...]) -> tuple[float | None, str]:
    """The eps of the module that emitted the node, else of the nearest normalization PyTorch ran (its ATen op's
    argument: a scope lost or renamed, a norm module of another class), else of the nearest module that has
    one."""
    name, module = ctx.module_of(info)
    own = _module_eps(module) if module is not None else None
    if own is not None:
        return own, name or "<model>"
    found = _op_eps(ctx, aten_ops)
    if found is not None:
        return found
    for qualname, m in ctx.modules_near():
        value = _module_eps(m)
        if value is not None:
            return value, qualname or "<model>"
    return None, ""


#: a float PyTorch adds before a square root is an epsilon when it is this small
SMALL_EPS = 1e-2


def _added_eps(ctx: DiagnosisContext) -> tuple[float, str] | None:
    """``(eps, where)``: the small float an ``aten.add`` PyTorch ran nearest the divergence adds, when a square
    root reads its result (statistics written by hand: ``(x.var(...) + 1e-5).sqrt()`` in no norm module)."""
    at = ctx.layer.pair.activation.index
    roots = ("aten.sqrt", "aten.rsqrt", "aten.pow")
    ops = sorted(ctx.ops, key=lambda o: o.index)
    for i, op in sorted(enumerate(ops), key=lambda p: abs(p[1].index - at)):
        floats = [v for _, v in op.args if isinstance(v, float) and 0 < v <= SMALL_EPS]
        if op.module_type.startswith("aten.add") and floats and any(
                o.module_type.startswith(roots) and (op.index in o.inputs or not o.inputs) for o in ops[i + 1:i + 4]):
            return floats[-1], f"PyTorch's {op.module_type} in {op.module or 'the model'}"
    return None


def _module_eps(module) -> float | None:
    for attr in EPS_NAMES:
        value = getattr(module, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def _op_eps(ctx: DiagnosisContext, aten_ops: tuple[str, ...]) -> tuple[float, str] | None:
    """``(eps, module)`` of the normalization op among PyTorch's ops around the divergence nearest its op."""
    at = ctx.layer.pair.activation.index
    for op in sorted((o for o in ctx.ops if o.module_type.startswith(aten_ops)), key=lambda o: abs(o.index - at)):
        floats = [v for _, v in op.args if isinstance(v, float)]
        if floats:
            return floats[-1], op.module or "<model>"
    return None


def _restore(ctx: DiagnosisContext, wrong) -> FixedSegment:
    model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
    for node, _, _, torch_eps, _, tensor in wrong:
        if tensor is None:
            edits.set_attribute(model, node, "epsilon", torch_eps)
        else:
            old = ctx.constant(tensor)
            model, weights = edits.replace_array(model, weights, tensor, np.full(old.shape, torch_eps, old.dtype))
    return FixedSegment(model, weights)
