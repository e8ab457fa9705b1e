"""The sixth set of fault kinds (scripts/fault_sweep.py): wrong op types and operands, written before the tool had
seen any of them.

Ten kinds the tool was never tried on: a pooling's mode (MaxPool ↔ AveragePool, a Global pool's kind, an
AveragePool's ``count_include_pad``), a reduction's kind (ReduceMean ↔ ReduceSum ↔ ReduceMax), a comparison's
strictness (Less ↔ LessOrEqual, Greater ↔ GreaterOrEqual: a causal mask's diagonal), a Sub's or Div's operands
exchanged, a Pow's exponent, an integer constant off by one (position offsets, index arithmetic), an activation
quantizer's zero point, a Conv's dilation (pads widened so the shape stays), a normalization's scale and bias
exchanged, and Softmax ↔ LogSoftmax.  Each follows :mod:`sweep_faults`' conventions (``candidates`` /
``plant``, :class:`~sweep_faults.NoVariant` when no variant works at a site).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy,
                          drop_stale_value_info, folded, is_float_tensor, node_by_name, readers, set_attr, shape_of,
                          top_nodes, unique_name, with_argument)
from onnx import numpy_helper


def _opset(ctx: FileContext) -> int:
    return next((o.version for o in ctx.proto.opset_import if o.domain in ("", "ai.onnx")), 13)


def _retyped(ctx: FileContext, name: str, op_type: str, drop=(), add: dict | None = None) -> onnx.ModelProto:
    """Copy of the file with node ``name`` turned into ``op_type``: attributes ``drop`` removed, ``add`` set."""
    out = copy(ctx.proto)
    node = node_by_name(out, name)
    node.op_type = op_type
    kept = [a for a in node.attribute if a.name not in drop]
    node.ClearField("attribute")
    node.attribute.extend(kept)
    for k, v in (add or {}).items():
        set_attr(node, k, v)
    return out


def _usable(ctx: FileContext, out: onnx.ModelProto, tensor: str) -> onnx.ModelProto | None:
    """``out`` with stale shapes dropped when it runs and changes ``tensor``, else None."""
    if ctx.problem(out):
        return None
    out = drop_stale_value_info(ctx, out)
    return out if ctx.changes(out, tensor) else None


# --------------------------------------------------------------------------- pooling mode

POOL_SWAPS = {"MaxPool": "AveragePool", "AveragePool": "MaxPool", "GlobalMaxPool": "GlobalAveragePool",
              "GlobalAveragePool": "GlobalMaxPool"}
POOL_ONLY = {"MaxPool": ("storage_order", "dilations"), "AveragePool": ("count_include_pad",)}


def pool_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, tuple(POOL_SWAPS)) if len(n.output) == 1 or not n.output[1]]


def plant_pool_mode(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An AveragePool with padding counts the padded zeros (``count_include_pad`` flipped) half the time, else
    the pooling's kind swapped (max ↔ average)."""
    node = node_by_name(ctx.proto, site.node)
    pads = attribute(node, "pads") or []
    variants = []
    if node.op_type == "AveragePool" and any(pads):
        flip = 1 - int(attribute(node, "count_include_pad", 0))
        variants.append((_retyped(ctx, site.node, "AveragePool", add={"count_include_pad": flip}),
                         f"AveragePool count_include_pad → {flip} (pads {list(pads)})"))
    new = POOL_SWAPS[node.op_type]
    variants.append((_retyped(ctx, site.node, new, drop=POOL_ONLY.get(node.op_type, ())),
                     f"{node.op_type} → {new}"))
    if len(variants) > 1 and rng.random() < 0.5:
        variants.reverse()
    for out, text in variants:
        out = _usable(ctx, out, node.output[0])
        if out is not None:
            return Planted(out, [site.node], "attribute-mismatch", text)
    raise NoVariant("no other pooling runs and changes the output")


# --------------------------------------------------------------------------- reduction kind

REDUCE_SWAPS = {"ReduceMean": ("ReduceSum", "ReduceMax"), "ReduceSum": ("ReduceMean",),
                "ReduceMax": ("ReduceMean", "ReduceMin"), "ReduceMin": ("ReduceMax",)}


def _axes_as_input(op: str, opset: int) -> bool:
    return opset >= 18 or (op == "ReduceSum" and opset >= 13)


def reduce_kind_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, tuple(REDUCE_SWAPS)) if is_float_tensor(ctx, n.input[0])]


def _as_reduction(ctx: FileContext, node: onnx.NodeProto, op: str) -> onnx.ModelProto | None:
    """Copy of the file with the Reduce node ``node`` computing ``op`` over the same axes (moved between the
    attribute and the input as the opset wants); None when its axes are not constant."""
    opset = _opset(ctx)
    if len(node.input) > 1 and node.input[1]:
        axes = folded(ctx, node.input[1])
        if axes is None:
            return None
        axes = [int(a) for a in axes.reshape(-1)]
    else:
        axes = attribute(node, "axes")
    out = copy(ctx.proto)
    target = node_by_name(out, node.name)
    target.op_type = op
    kept = [a for a in target.attribute if a.name != "axes"]
    target.ClearField("attribute")
    target.attribute.extend(kept)
    del target.input[1:]
    if axes is not None and _axes_as_input(op, opset):
        name = unique_name(out, f"{node.name}_axes")
        out.graph.initializer.append(numpy_helper.from_array(np.array(axes, np.int64), name))
        target.input.append(name)
    elif axes is not None:
        target.attribute.append(helper.make_attribute("axes", list(axes)))
    return out


def plant_reduce_kind(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A reduction computing another kind over the same axes (mean ↔ sum: a missing 1/N; mean ↔ max)."""
    node = node_by_name(ctx.proto, site.node)
    for op in rng.permutation(REDUCE_SWAPS[node.op_type]):
        out = _as_reduction(ctx, node, str(op))
        out = None if out is None else _usable(ctx, out, node.output[0])
        if out is not None:
            return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} → {op} (same axes)")
    raise NoVariant("no other reduction runs and changes the output")


# --------------------------------------------------------------------------- comparison strictness

COMPARE_SWAPS = {"Less": "LessOrEqual", "LessOrEqual": "Less", "Greater": "GreaterOrEqual",
                 "GreaterOrEqual": "Greater"}


def compare_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, tuple(COMPARE_SWAPS))]


def _other_kind(ctx: FileContext, site: Site, table: dict[str, str], finite: bool) -> Planted:
    """The node computing the op ``table`` maps its op to (raises NoVariant when that does not run, change its
    output or — ``finite`` — keep it finite)."""
    node = node_by_name(ctx.proto, site.node)
    new = table[node.op_type]
    out = _usable(ctx, _retyped(ctx, site.node, new), node.output[0])
    if out is None or finite and not np.isfinite(ctx.tensor(out, node.output[0])).all():
        raise NoVariant(f"{new} does not run, change the output (no ties) or stay finite")
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} → {new}")


def plant_compare_op(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A comparison made strict or not (a causal mask that hides or shows its diagonal)."""
    return _other_kind(ctx, site, COMPARE_SWAPS, finite=False)


# --------------------------------------------------------------------------- operand order

def operand_sites(ctx: FileContext) -> list[Site]:
    """Sub and Div of two float tensors (at least one computed), neither a scalar constant."""
    sites = []
    for n in top_nodes(ctx, ("Sub", "Div")):
        if len(n.input) != 2 or n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        values = [constant(ctx.proto, t) for t in n.input]
        if all(v is not None for v in values) or any(v is not None and v.size == 1 for v in values):
            continue
        sites.append(Site(n.name))
    return sites


def _exchanged(ctx: FileContext, name: str, i: int, j: int) -> onnx.ModelProto:
    """Copy of the file whose node ``name`` reads its inputs ``i`` and ``j`` the other way round (raises
    NoVariant when that does not run or change the node's output)."""
    node = node_by_name(ctx.proto, name)
    out = copy(ctx.proto)
    target = node_by_name(out, name)
    target.input[i], target.input[j] = node.input[j], node.input[i]
    out = _usable(ctx, out, node.output[0])
    if out is None:
        raise NoVariant(f"exchanging inputs {i} and {j} does not run or change the output")
    return out


def plant_operand_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Sub's or Div's two operands exchanged (``x - mean`` → ``mean - x``), output shape kept."""
    node = node_by_name(ctx.proto, site.node)
    out = _exchanged(ctx, site.node, 0, 1)
    flat = ctx.values[node.output[0]]
    if node.op_type == "Div" and not np.isfinite(ctx.tensor(out, node.output[0])).all() and np.isfinite(flat).all():
        raise NoVariant("the exchanged Div divides by zero")
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} operands exchanged")


# --------------------------------------------------------------------------- Pow exponent

def pow_sites(ctx: FileContext) -> list[Site]:
    sites = []
    for n in top_nodes(ctx, ("Pow",)):
        value = folded(ctx, n.input[1])
        if value is not None and value.size == 1 and value.dtype.kind == "f" and is_float_tensor(ctx, n.input[0]):
            sites.append(Site(n.name))
    return sites


def plant_pow_exponent(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Pow's constant exponent changed: 2 → 3 or 1 (squares), 0.5 → 1/3 or 1 (roots), else one more or
    less; integer exponents where the base has negative values (a fractional power of them is NaN)."""
    node = node_by_name(ctx.proto, site.node)
    old = folded(ctx, node.input[1])
    e = float(old.reshape(-1)[0])
    base = ctx.values.get(node.input[0], constant(ctx.proto, node.input[0]))
    negative = base is not None and (base < 0).any()
    choices = {2.0: [3.0, 1.0], 0.5: [1.0 / 3.0, 1.0], 3.0: [2.0]}.get(e, [e + 1.0, e - 1.0, e * 1.5])
    if negative:
        choices = [c for c in choices if float(c).is_integer()] or [round(e) + 1.0]
    for c in rng.permutation(choices):
        out = with_argument(ctx, site.node, 1, np.array(c, old.dtype).reshape(old.shape))
        out = _usable(ctx, out, node.output[0])
        if out is not None and np.isfinite(ctx.tensor(out, node.output[0])).all():
            return Planted(out, [site.node], "attribute-mismatch", f"Pow exponent {e:g} → {float(c):g}")
    raise NoVariant("no other exponent runs, changes the output and stays finite")


# --------------------------------------------------------------------------- integer constants

INT_ARITH = ("Add", "Sub", "Range")


def int_offset_sites(ctx: FileContext) -> list[Site]:
    """Add/Sub of an integer constant (position offsets, index arithmetic) and Range starts, where the result
    is data, not a shape: some float value downstream is what it changes (checked when planting)."""
    sites = []
    for n in top_nodes(ctx, INT_ARITH):
        positions = [0] if n.op_type == "Range" else [0, 1]
        for k in positions:
            value = folded(ctx, n.input[k]) if k < len(n.input) else None
            if value is None or value.dtype.kind not in "iu" or value.size > 64:
                continue
            if n.op_type != "Range" and folded(ctx, n.input[1 - k]) is not None:
                continue  # constant arithmetic
            sites.append(Site(n.name, (k,)))
    return sites


def plant_int_offset(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The integer constant one more or one less (every entry): positions counted from 1, an offset lost."""
    (k,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    old = folded(ctx, node.input[k])
    for step in rng.permutation([1, -1]):
        new = (old.astype(np.int64) + int(step)).astype(old.dtype)
        if old.dtype.kind == "u" and (old == 0).any() and step < 0:
            continue
        out = _usable(ctx, with_argument(ctx, site.node, k, new), node.output[0])
        if out is None:
            continue
        return Planted(out, [site.node], "attribute-mismatch",
                       f"{node.op_type} integer constant {old.reshape(-1)[:4].tolist()} {int(step):+d}")
    raise NoVariant("no off-by-one of the constant runs and changes the output")


# --------------------------------------------------------------------------- quantizer zero point

ZERO_POINT_SHIFTS = (24, 40, 64)


def zero_point_sites(ctx: FileContext) -> list[Site]:
    """Activation QuantizeLinear nodes with a constant zero point, read by a DequantizeLinear."""
    sites = []
    for n in top_nodes(ctx, ("QuantizeLinear",)):
        if constant(ctx.proto, n.input[0]) is not None or len(n.input) < 3 or not n.input[2]:
            continue
        zp = constant(ctx.proto, n.input[2])
        if zp is None or zp.size != 1:
            continue
        if any(r.op_type == "DequantizeLinear" for r in readers(ctx.proto, n.output[0])):
            sites.append(Site(n.name))
    return sites


def plant_zero_point(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The quantizer's zero point moved by 24–64 steps, the DequantizeLinears' too (a private copy): the
    representable range shifts, so one tail of the activation clips."""
    q = node_by_name(ctx.proto, site.node)
    dqs = [r for r in readers(ctx.proto, q.output[0]) if r.op_type == "DequantizeLinear"]
    zp = constant(ctx.proto, q.input[2])
    info = np.iinfo(zp.dtype)
    for shift in rng.permutation(ZERO_POINT_SHIFTS):
        shift = int(shift) * (1 if int(zp.reshape(-1)[0]) - info.min < info.max - int(zp.reshape(-1)[0]) else -1)
        new = np.clip(zp.astype(np.int64) + shift, info.min, info.max).astype(zp.dtype)
        out = copy(ctx.proto)
        name = unique_name(out, f"{q.input[2]}_shifted")
        out.graph.initializer.append(numpy_helper.from_array(new, name))
        for node in (q, *dqs):
            node_by_name(out, node.name).input[2] = name
        if ctx.problem(out) or not any(ctx.changes(out, dq.output[0]) for dq in dqs):
            continue
        return Planted(out, [q.name, *(dq.name for dq in dqs)], "quantization",
                       f"QuantizeLinear zero point {int(zp.reshape(-1)[0])} → {int(new.reshape(-1)[0])} "
                       f"(and its {len(dqs)} DequantizeLinear(s))")
    raise NoVariant("no shifted zero point changes the dequantized output")


# --------------------------------------------------------------------------- Conv dilation

def dilation_sites(ctx: FileContext) -> list[Site]:
    """Convs with explicit pads and a spatial kernel axis longer than 1 at dilation 1."""
    sites = []
    for n in top_nodes(ctx, ("Conv",)):
        w = shape_of(ctx, n.input[1])
        if w is None or len(w) < 3 or attribute(n, "auto_pad", "NOTSET") != "NOTSET":
            continue
        dil = attribute(n, "dilations") or [1] * (len(w) - 2)
        axes = tuple(i for i, k in enumerate(w[2:]) if k > 1 and dil[i] == 1)
        if axes:
            sites.append(Site(n.name, axes))
    return sites


def plant_conv_dilation(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Dilation 2 on one spatial axis, the padding grown by (k − 1) (half each side) so the shape stays."""
    node = node_by_name(ctx.proto, site.node)
    w = shape_of(ctx, node.input[1])
    rank = len(w) - 2
    for i in rng.permutation(site.detail):
        i = int(i)
        dil = list(attribute(node, "dilations") or [1] * rank)
        pads = list(attribute(node, "pads") or [0] * (2 * rank))
        dil[i] = 2
        grow = w[2 + i] - 1
        pads[i] += grow // 2
        pads[i + rank] += grow - grow // 2
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        set_attr(target, "dilations", dil)
        set_attr(target, "pads", pads)
        out = _usable(ctx, out, node.output[0])
        if out is not None:
            return Planted(out, [site.node], "attribute-mismatch",
                           f"Conv dilations → {dil}, pads → {pads} (kernel {list(w[2:])})")
    raise NoVariant("no dilated variant keeps the shape and changes the output")


# --------------------------------------------------------------------------- norm scale/bias, Softmax kind

AFFINE_NORMS = ("LayerNormalization", "InstanceNormalization", "GroupNormalization", "BatchNormalization")


def affine_sites(ctx: FileContext) -> list[Site]:
    """Norms whose scale and bias are constants of one shape with different values."""
    sites = []
    for n in top_nodes(ctx, AFFINE_NORMS):
        if len(n.input) < 3 or not n.input[2]:
            continue
        scale, bias = constant(ctx.proto, n.input[1]), constant(ctx.proto, n.input[2])
        if scale is not None and bias is not None and scale.shape == bias.shape and not np.allclose(scale, bias):
            sites.append(Site(n.name))
    return sites


def plant_norm_affine(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The normalization's scale and bias exchanged (a converter that mapped gamma and beta the wrong way)."""
    node = node_by_name(ctx.proto, site.node)
    out = _exchanged(ctx, site.node, 1, 2)
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} scale and bias exchanged")


SOFTMAX_SWAPS = {"Softmax": "LogSoftmax", "LogSoftmax": "Softmax"}


def softmax_kind_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, tuple(SOFTMAX_SWAPS))]


def plant_softmax_kind(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    return _other_kind(ctx, site, SOFTMAX_SWAPS, finite=True)


KINDS = (
    FaultKind("pool-mode", pool_sites, plant_pool_mode, "attribute-mismatch",
              "MaxPool ↔ AveragePool (Global too), or an AveragePool's count_include_pad flipped"),
    FaultKind("reduce-kind", reduce_kind_sites, plant_reduce_kind, "attribute-mismatch",
              "ReduceMean ↔ ReduceSum / ReduceMax, ReduceMax ↔ ReduceMin (same axes)"),
    FaultKind("compare-op", compare_sites, plant_compare_op, "attribute-mismatch",
              "Less ↔ LessOrEqual, Greater ↔ GreaterOrEqual (a mask's diagonal)"),
    FaultKind("operand-order", operand_sites, plant_operand_order, "attribute-mismatch",
              "a Sub's or Div's two tensor operands exchanged"),
    FaultKind("pow-exponent", pow_sites, plant_pow_exponent, "attribute-mismatch",
              "a Pow's constant exponent changed (2 → 3 / 1, 0.5 → 1/3 / 1, else ±1)"),
    FaultKind("int-offset", int_offset_sites, plant_int_offset, "attribute-mismatch",
              "an integer Add/Sub constant or a Range start off by one"),
    FaultKind("zero-point", zero_point_sites, plant_zero_point, "quantization",
              f"an activation quantizer's zero point moved by {ZERO_POINT_SHIFTS[0]}–{ZERO_POINT_SHIFTS[-1]}"),
    FaultKind("conv-dilation", dilation_sites, plant_conv_dilation, "attribute-mismatch",
              "a Conv's dilation 1 → 2 on one axis, pads grown so the shape stays"),
    FaultKind("norm-affine", affine_sites, plant_norm_affine, "attribute-mismatch",
              "a normalization's scale and bias inputs exchanged"),
    FaultKind("softmax-kind", softmax_kind_sites, plant_softmax_kind, "attribute-mismatch",
              "Softmax ↔ LogSoftmax"),
)
