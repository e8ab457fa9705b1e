"""Epsilon: a normalization's epsilon in the ONNX segment differs from the PyTorch module's ``eps``."""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import onnx

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
        wrong = [site for site in _sites(ctx) if site.placed_after is not None
                 or not math.isclose(site.onnx_eps, site.torch_eps, rel_tol=1e-3, abs_tol=1e-30)]
        if not wrong:
            return None
        listed = "; ".join(_said(site) for site in wrong)
        evidence = {"mismatches": [{"onnx_node": s.node, "where": s.where, "onnx_epsilon": s.onnx_eps,
                                    "pytorch_eps": s.torch_eps, "module": s.module}
                                   | ({} if s.placed_after is None else
                                      {"onnx_adds_after_root": s.placed_after, "pytorch_adds_after_root":
                                       not s.placed_after}) for s in wrong]}
        summary = (f"Normalization epsilon differs: {listed}. With small variances this shifts every normalized "
                   f"value (local max abs {ctx.layer.local.max_abs:.2g}).")
        fix = ("Restore the module's eps in the ONNX graph (the epsilon attribute, or the constant added before the "
               "square root) and check whatever tool rewrote it; re-exporting from the module gives the right value.")
        if any(s.placed_after is not None for s in wrong):
            fix = ("Add the epsilon where the module adds it (PyTorch computes sqrt(var + eps) or std + eps; the "
                   "ONNX graph does the other) with the module's value; re-exporting from the module gives both.")
        # a placement's fix moves the Add across the root: both nodes are the fault's place
        changed = (n for w in wrong for n in (w.node, w.root if w.placed_after is not None else "") if n)
        return Finding(self.cause, 0.9, summary, fix, evidence, changes=tuple(dict.fromkeys(changed)),
                       counterfactual=lambda c: _restore(c, wrong))


class EpsSite(NamedTuple):
    """One epsilon of the segment against PyTorch's: ``placed_after`` is set (True: the ONNX graph adds it after
    the square root) when the two add it on different sides of the root."""

    node: str
    where: str
    onnx_eps: float
    torch_eps: float
    module: str
    tensor: str | None
    placed_after: bool | None = None
    root: str = ""  # the square root's node, for a placement


def _said(site: EpsSite) -> str:
    text = f"{site.node} ({site.where}) uses {site.onnx_eps:g} where {site.module} has eps={site.torch_eps:g}"
    if site.placed_after is None:
        return text
    side = ("after the square root, where PyTorch's ops add it before (sqrt(var + eps))" if site.placed_after else
            "before the square root, where PyTorch's ops add it after (std + eps)")
    return f"{site.node} adds the epsilon {site.onnx_eps:g} {side}; {site.module} has eps={site.torch_eps:g}"


def _sites(ctx: DiagnosisContext):
    """Every epsilon in the segment (an attribute, or a scalar added next to a square root) with PyTorch's."""
    infos = {n.name: n for n in ctx.segment_nodes}
    order = None
    for proto in ctx.segment_protos:
        torch_eps, module = _torch_eps(ctx, infos[proto.name], NORM_ATEN.get(proto.op_type, ANY_NORM_ATEN))
        after = _root_before(ctx, proto)  # between a Sqrt and its Reciprocal (rsqrt) the Add is after the root
        before = proto.op_type == "Add" and not after and _feeds_root(ctx, proto)
        if torch_eps is None and (before or after):
            torch_eps, module = _added_eps(ctx) or (None, "")
        if torch_eps is None:
            continue
        if proto.op_type in NORM_OPS:
            yield EpsSite(proto.name, "epsilon attribute", float(attribute(proto, "epsilon", 1e-5)), torch_eps,
                          module, None)
            continue
        if not (before or after):
            continue
        order = _pytorch_side(ctx) if order is None else order
        for tensor in proto.input:
            value = ctx.constant(tensor)
            # any finite scalar added right next to the square root inside a module that has an eps is its
            # epsilon, however far off (a rewritten 0.9 as much as 1e-6)
            if value is None or value.size != 1 or not np.isfinite(float(value.reshape(-1)[0])):
                continue
            eps = float(value.reshape(-1)[0])
            if float(np.asarray(torch_eps, value.dtype)) == eps:  # PyTorch's eps as stored (a float16 file's)
                eps = torch_eps
            if before:
                moved = order == "after" and len(ctx.onnx.graph.consumers.get(proto.output[0], ())) == 1
                yield EpsSite(proto.name, f"constant '{tensor}' added before the square root", eps, torch_eps,
                              module, tensor, False if moved else None, _root_after(ctx, proto))
            elif 0 < eps <= SMALL_EPS:  # a small positive scalar after a root: an epsilon, PyTorch's side or not
                yield EpsSite(proto.name, f"constant '{tensor}' added after the square root {after}", eps,
                              torch_eps, module, tensor, True if order == "before" else None, after)


def _root_before(ctx: DiagnosisContext, add) -> str:
    """The square root (Sqrt, or Pow by 0.5) whose result an Add reads, through Casts: its node name, else ''."""
    if add.op_type != "Add":
        return ""
    graph = ctx.onnx.graph
    for tensor in add.input:
        node = graph.node_of(tensor)
        while node is not None and node.op_type == "Cast":
            node = graph.node_of(node.inputs[0])
        if node is not None and (node.op_type == "Sqrt" or node.op_type == "Pow" and _is_half(ctx, node)):
            return node.name
    return ""


def _root_after(ctx: DiagnosisContext, add) -> str:
    graph = ctx.onnx.graph
    return next((graph.nodes[i].name for i in graph.consumers.get(add.output[0], ())
                 if graph.nodes[i].op_type in ROOT_OPS), "")


def _is_half(ctx: DiagnosisContext, pow_node) -> bool:
    value = ctx.constant(pow_node.inputs[1]) if len(pow_node.inputs) > 1 else None
    return value is not None and value.size == 1 and float(value.reshape(-1)[0]) == 0.5


#: PyTorch's square roots (and reciprocal ones); a pow counts with the exponent ±0.5
ROOT_ATEN = ("aten.sqrt", "aten.rsqrt", "aten.pow")


def _pytorch_side(ctx: DiagnosisContext) -> str:
    """On which side of its square root PyTorch adds a small float, by the ops nearest the divergence:
    ``"before"`` (``sqrt(var + eps)``), ``"after"`` (``std + eps``), else ``""`` (no such ops recorded)."""
    at = ctx.layer.pair.activation.index
    by_index = {o.index: o for o in ctx.ops}
    for op in sorted(ctx.ops, key=lambda o: abs(o.index - at)):
        if not op.module_type.startswith(ROOT_ATEN) or op.module_type.startswith("aten.pow") and not any(
                isinstance(v, float) and abs(v) == 0.5 for _, v in op.args):
            continue
        if any(_small_add(by_index.get(i)) for i in op.inputs):
            return "before"
        if any(_small_add(o) and op.index in o.inputs for o in ctx.ops):
            return "after"
    return ""


def _small_add(op) -> bool:
    return op is not None and op.module_type.startswith("aten.add") and any(
        isinstance(v, float) and 0 < v <= SMALL_EPS for _, v in op.args)


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
    for site in wrong:
        if site.tensor is None:
            edits.set_attribute(model, site.node, "epsilon", site.torch_eps)
        elif site.placed_after:
            _move_before_root(ctx, model, site)
        elif site.placed_after is False:
            _move_after_root(ctx, model, site)
        else:
            old = ctx.constant(site.tensor)
            model, weights = edits.replace_array(model, weights, site.tensor,
                                                 np.full(old.shape, site.torch_eps, old.dtype))
    return FixedSegment(model, weights)


def _move_before_root(ctx: DiagnosisContext, model, site: EpsSite) -> None:
    """``root(v) + eps`` made ``root(v + eps)`` with PyTorch's eps (in place): the Add reads the root's input and
    writes a new tensor the root reads; the Add's output is now an Identity of what the Add read (the root's
    result, after any Casts), so every tensor name the segment is compared by stays."""
    add, root = edits.node(model, site.node), edits.node(model, site.root)
    k = list(add.input).index(site.tensor)
    rooted, value, result = add.input[1 - k], root.input[0], add.output[0]
    dtype = helper_dtype(ctx.onnx.graph.elem_types.get(value), ctx.constant(site.tensor).dtype)
    eps = edits.add_initializer(model, f"{site.node}_eps_before_root", np.array(site.torch_eps, dtype))
    summed = f"{site.node}_before_root"
    add.input[:] = [value, eps] if k else [eps, value]
    add.output[0] = summed
    root.input[0] = summed
    handed = onnx.helper.make_node("Identity", [rooted], [result], name=f"{site.node}_after_root")
    nodes = [n for n in model.graph.node if n.name != add.name]
    at = next(i for i, n in enumerate(nodes) if n.name == root.name)
    made = next(i for i, n in enumerate(nodes) if rooted in n.output)
    moved = onnx.NodeProto()
    moved.CopyFrom(add)
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:at] + [moved] + nodes[at:made + 1] + [handed] + nodes[made + 1:])


def _move_after_root(ctx: DiagnosisContext, model, site: EpsSite) -> None:
    """``root(v + eps)`` made ``root(v) + eps`` with PyTorch's eps (in place)."""
    add, root = edits.node(model, site.node), edits.node(model, site.root)
    k = list(add.input).index(site.tensor)
    value, result = add.input[1 - k], root.output[0]
    eps = edits.add_initializer(model, f"{site.node}_eps_after_root", np.array(site.torch_eps, ctx.constant(site.tensor).dtype))
    rooted = f"{site.root}_before_eps"
    root.input[0], root.output[0] = value, rooted
    add.input[:] = [rooted, eps] if k else [eps, rooted]
    add.output[0] = result
    nodes = [n for n in model.graph.node if n.name != add.name]
    at = next(i for i, n in enumerate(nodes) if n.name == root.name)
    moved = onnx.NodeProto()
    moved.CopyFrom(add)
    model.graph.ClearField("node")
    model.graph.node.extend(nodes[:at + 1] + [moved] + nodes[at + 1:])


def helper_dtype(elem_type: int | None, fallback) -> np.dtype:
    """The numpy dtype of an ONNX element type, ``fallback`` when unknown."""
    if not elem_type:
        return np.dtype(fallback)
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
