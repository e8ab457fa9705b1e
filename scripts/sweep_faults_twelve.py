"""The twelfth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each an exporter's, a converter's, a checkpoint loader's or a graph rewriter's mistake the earlier sets
never planted: a BatchNormalization left in training mode (``training_mode=1``: it normalizes with the batch's own
statistics — a model exported without ``model.eval()``), a BatchNorm folded with a mistake into the convolution
before it, or into a per-channel Mul and Add where there is none (the variance used where the standard deviation
belongs, the running mean not subtracted, the shift left unscaled — a hand-written fold), a Sin and a Cos exchanged
(a rotary / sinusoidal embedding's tables in the wrong order, a snake / SIREN activation's phase), a square root
computed as a reciprocal square root (``rsqrt`` for ``sqrt``: a Sqrt made ``Pow(x, −0.5)``), a float tensor
truncated through an integer dtype (a traced ``.int()`` / ``int()`` or a converter typing a value int32: a Cast to
int32 and back inserted), a convolution kernel's two spatial axes exchanged (a loader reading a [kw, kh] layout as
[kh, kw]: a square kernel transposed), a broadcast-and-merge repeat in the other order (``repeat_interleave``
against ``repeat`` / ``tile``: grouped-query attention's key/value heads repeated as [h0, h1, h0, h1] instead of
[h0, h0, h1, h1], a Transpose inserted before the merging Reshape) and an Einsum equation with two letters of one
term exchanged (an operand or the result read transposed).

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names. Where a kind has
several variants at a site it plants the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), else the strongest one (:func:`sweep_faults_nine._pick`).

Expected causes use the tool's vocabulary (``Cause`` in src/onnx_bisect/records/core.py): the BatchNorm in training
mode ``training-mode`` (the tool's own description of it); the mistaken fold ``batchnorm-fold`` (``weight-mismatch``
recorded as also accepted in ``extra``: at the Conv the weights are wrong); op and equation changes and the inserted
Transpose ``attribute-mismatch``; the transposed kernel ``weight-mismatch``; the integer round trip ``dtype`` (the
value went through the wrong dtype; ``precision`` recorded as also accepted). Planted nodes: the changed node; for a
BatchNorm folded away the Conv that now carries it (or the new Mul and Add); for an inserted pair or node (the
integer round trip, the repeat Transpose) the first new node, as ``cast-bf16`` does.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          folded, insert_nodes, is_float_array, node_by_name, producer, prune, readers, replace_node,
                          set_attr, unique_name, weight_input, with_initializer)
from sweep_faults_nine import _finite_outputs, _onnx, _pick
from sweep_faults_ops import _opset, _retyped, _usable
from sweep_faults_ten import _checked, _dynamic, _named, _value


def _float_output(ctx: FileContext, node: onnx.NodeProto) -> bool:
    """The node's first output is a float tensor the clean file computes."""
    value = ctx.values.get(node.output[0]) if node.output else None
    return isinstance(value, np.ndarray) and value.dtype.kind == "f"  # a sequence output (SplitToSequence) is a list


def _graph_outputs(ctx: FileContext) -> set[str]:
    return {o.name for o in ctx.proto.graph.output}


# --------------------------------------------------------------------------- BatchNorm in training mode

def bn_sites(ctx: FileContext) -> list[Site]:
    """Named BatchNormalization nodes in inference mode (opset ≥ 14, one output) whose input depends on the
    graph inputs (a BatchNorm of a weight is the model's own weight standardisation)."""
    if _opset(ctx) < 14:
        return []
    dynamic = _dynamic(ctx)
    return [Site(n.name) for n in _named(ctx.proto.graph.node)
            if n.op_type == "BatchNormalization" and _onnx(n.domain) and not attribute(n, "training_mode", 0)
            and _float_output(ctx, n) and n.input[0] in dynamic and not any(n.output[1:])]


def plant_bn_batch_stats(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """``training_mode=1`` (with the running-mean and running-variance outputs that mode requires, read by
    nothing): the node normalizes with the batch's mean and variance over (N, spatial) instead of its running
    statistics.  Planted: the node."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    set_attr(target, "training_mode", 1)
    del target.output[1:]
    target.output.extend([unique_name(out, f"{node.output[0]}_running_mean"),
                          unique_name(out, f"{node.output[0]}_running_var")])
    checked = _checked(ctx, out, [node.output[0]])
    if checked is None:
        raise NoVariant("the BatchNorm in training mode does not run, change the output or keep it finite")
    x = ctx.values.get(node.input[0], ctx.feeds.get(node.input[0]))
    axes = (0, *range(2, x.ndim))
    mean = folded(ctx, node.input[3])
    return Planted(checked, [site.node], "training-mode",
                   f"BatchNormalization {site.node} ({list(x.shape)}) training_mode=1: batch statistics over axes "
                   f"{list(axes)} (batch mean up to {float(np.max(np.abs(x.mean(axis=axes) - mean))):.3g} from the "
                   f"running mean)" if mean is not None else f"BatchNormalization {site.node} training_mode=1",
                   {"batch": int(x.shape[0])})


# --------------------------------------------------------------------------- BatchNorm folded with a mistake

FOLD_OPS = ("Conv", "ConvTranspose")


def _bn_params(ctx: FileContext, node: onnx.NodeProto) -> tuple[np.ndarray, ...] | None:
    """(scale, bias, mean, var) of a BatchNormalization as float64 vectors, None when any is computed."""
    values = [folded(ctx, t) for t in node.input[1:5]]
    if len(values) != 4 or any(v is None or not is_float_array(np.asarray(v)) or np.asarray(v).ndim != 1
                               for v in values):
        return None
    return tuple(np.asarray(v, np.float64) for v in values)


def fold_sites(ctx: FileContext) -> list[Site]:
    """Inference BatchNormalizations (constant parameters, a float input that depends on the graph inputs):
    ``(conv name,)`` where the input is the output of a named Conv (any group) or ConvTranspose (group 1) read by
    the BatchNorm alone, not a graph output, with a constant float kernel (and bias, if any); else ``(None,)``
    (the BatchNorm is folded into a per-channel scale and shift)."""
    outputs, dynamic = _graph_outputs(ctx), _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "BatchNormalization" or not _onnx(n.domain) or attribute(n, "training_mode", 0) \
                or any(n.output[1:]) or not _float_output(ctx, n) or n.input[0] not in dynamic \
                or _bn_params(ctx, n) is None:
            continue
        sites.append(Site(n.name, (_fold_target(ctx, n, outputs),)))
    return sites


def _fold_target(ctx: FileContext, bn: onnx.NodeProto, outputs: set[str]) -> str | None:
    """The Conv / ConvTranspose a BatchNorm can be folded into (see :func:`fold_sites`), else None."""
    conv = producer(ctx.proto, bn.input[0])
    if conv is None or not conv.name or conv.op_type not in FOLD_OPS or not _onnx(conv.domain):
        return None
    if conv.op_type == "ConvTranspose" and attribute(conv, "group", 1) != 1:
        return None
    if len(readers(ctx.proto, conv.output[0])) != 1 or conv.output[0] in outputs:
        return None
    w = folded(ctx, conv.input[1])
    has_bias = len(conv.input) > 2 and bool(conv.input[2])
    b = folded(ctx, conv.input[2]) if has_bias else None
    if not is_float_array(w) or w.ndim < 3 or (has_bias and not is_float_array(b)):
        return None
    axis = 1 if conv.op_type == "ConvTranspose" else 0
    return conv.name if w.shape[axis] == folded(ctx, bn.input[1]).size else None


def plant_bn_fold_wrong(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The BatchNorm folded, with one mistake, into the convolution before it (the Conv writes the BatchNorm's
    output, the BatchNorm is gone) or, where there is none, into a per-channel scale and shift (a Mul and an Add
    over axis 1 in its place).  Mistakes, in order of preference: the variance where the standard deviation
    belongs (scale γ / (var + eps)), the running mean not subtracted (shift β + b·s), the shift not scaled
    (β + b − μ).  The first whose outputs count, else the strongest.  Planted: the Conv (it carries the wrong
    fold), or the new Mul and Add."""
    (conv_name,) = site.detail
    bn = node_by_name(ctx.proto, site.node)
    gamma, beta, mean, var = _bn_params(ctx, bn)
    eps = float(attribute(bn, "epsilon", 1e-5))
    conv = node_by_name(ctx.proto, conv_name) if conv_name else None
    x_dtype = ctx.values[bn.output[0]].dtype
    if conv is not None:
        w = folded(ctx, conv.input[1])
        has_bias = len(conv.input) > 2 and bool(conv.input[2])
        b = np.asarray(folded(ctx, conv.input[2]), np.float64) if has_bias else np.zeros_like(mean)
        axis = 1 if conv.op_type == "ConvTranspose" else 0
    else:
        b = np.zeros_like(mean)
    rank = ctx.values[bn.output[0]].ndim
    std = np.sqrt(var + eps)
    mistakes = (
        ("variance used for the standard deviation: scale γ/(var + eps)", gamma / (var + eps), None),
        ("running mean not subtracted: shift β + b·s", gamma / std, lambda s: beta + b * s),
        ("shift not scaled: β + (b − μ)", gamma / std, lambda s: beta + (b - mean)),
    )

    def folded_model(scale: np.ndarray, shift: np.ndarray) -> tuple[onnx.ModelProto, list[str]]:
        out = copy(ctx.proto)
        if conv is not None:
            shape = [1] * w.ndim
            shape[axis] = scale.size
            new_w = (w.astype(np.float64) * scale.reshape(shape)).astype(w.dtype)
            target = node_by_name(out, conv_name)
            wname = unique_name(out, f"{conv.input[1]}_bn_folded")
            bname = unique_name(out, f"{conv_name}_bn_folded_bias")
            out.graph.initializer.extend([numpy_helper.from_array(new_w, wname),
                                          numpy_helper.from_array(shift.astype(w.dtype), bname)])
            target.input[1] = wname
            if has_bias:
                target.input[2] = bname
            else:
                target.input.append(bname)
            target.output[0] = bn.output[0]
            kept = [n for n in out.graph.node if n.name != site.node]
            out.graph.ClearField("node")
            out.graph.node.extend(kept)
            planted = [conv_name]
        else:
            shape = [scale.size] + [1] * (rank - 2)
            sname = unique_name(out, f"{site.node}_folded_scale")
            tname = unique_name(out, f"{site.node}_folded_shift")
            mid = unique_name(out, f"{bn.output[0]}_scaled")
            out.graph.initializer.extend([numpy_helper.from_array(scale.reshape(shape).astype(x_dtype), sname),
                                          numpy_helper.from_array(shift.reshape(shape).astype(x_dtype), tname)])
            mul = helper.make_node("Mul", [bn.input[0], sname], [mid], name=unique_name(out, f"{site.node}_scale"))
            add = helper.make_node("Add", [mid, tname], [bn.output[0]], name=unique_name(out, f"{site.node}_shift"))
            replace_node(out, site.node, [mul, add])
            planted = [mul.name, add.name]
        prune(out, dead_nodes(ctx.proto))
        return out, planted

    def variants():
        for text, scale, shift_of in mistakes:
            shift = beta + (b - mean) * scale if shift_of is None else shift_of(scale)
            out, planted = folded_model(scale, shift)
            checked = _checked(ctx, out, [bn.output[0]])
            into = f"into {conv.op_type} {conv_name} ({list(w.shape)})" if conv is not None else \
                "into a per-channel Mul and Add"
            yield None if checked is None else Planted(
                checked, planted, "batchnorm-fold", f"BatchNormalization {site.node} folded {into}, {text}",
                {"batchnorm": site.node, "mistake": text, "also_accepted": "weight-mismatch"})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no mistaken fold runs and changes the output")
    return planted


# --------------------------------------------------------------------------- Sin and Cos exchanged

TRIG = {"Sin": "Cos", "Cos": "Sin"}


def trig_sites(ctx: FileContext) -> list[Site]:
    """Named Sin and Cos nodes whose float output the clean file computes."""
    return [Site(n.name) for n in _named(ctx.proto.graph.node)
            if n.op_type in TRIG and _onnx(n.domain) and _float_output(ctx, n)]


def plant_trig_swap(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Sin made a Cos, or a Cos a Sin.  Planted: the node."""
    node = node_by_name(ctx.proto, site.node)
    new = TRIG[node.op_type]
    out = _usable(ctx, _retyped(ctx, site.node, new), node.output[0])
    if out is None or not _finite_outputs(ctx, out):
        raise NoVariant(f"{node.op_type} → {new} does not run, change the output or keep it finite")
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} {site.node} → {new}")


# --------------------------------------------------------------------------- sqrt computed as rsqrt

def sqrt_sites(ctx: FileContext) -> list[Site]:
    """Named Sqrt nodes whose float output the clean file computes, not all zero."""
    return [Site(n.name) for n in _named(ctx.proto.graph.node)
            if n.op_type == "Sqrt" and _onnx(n.domain) and _float_output(ctx, n)
            and np.any(ctx.values[n.output[0]])]


def plant_rsqrt(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Sqrt made ``Pow(x, −0.5)``: its readers get 1/√x where they wanted √x (an rsqrt kernel or op mapped to
    sqrt's name; a norm then multiplies by the standard deviation, an attention scale divides by 1/√d).  Planted:
    the node."""
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    target.op_type = "Pow"
    target.ClearField("attribute")
    name = unique_name(out, f"{site.node}_minus_half")
    out.graph.initializer.append(numpy_helper.from_array(np.array(-0.5, dtype), name))
    del target.input[1:]
    target.input.append(name)
    checked = _usable(ctx, out, node.output[0])
    if checked is None or not _finite_outputs(ctx, checked):
        raise NoVariant("rsqrt in place of sqrt does not run, change the output or keep it finite")
    return Planted(checked, [site.node], "attribute-mismatch",
                   f"Sqrt {site.node} computed as Pow(x, -0.5) (1/sqrt instead of sqrt)")


# --------------------------------------------------------------------------- float truncated through an integer

TRUNC_SKIP = ("Constant", "ConstantOfShape", "Shape", "Size", "Cast", "Identity", "QuantizeLinear",
              "DequantizeLinear", "Dropout")
INT32_MAX = 2.0 ** 31 - 1


def trunc_sites(ctx: FileContext) -> list[Site]:
    """Named nodes with a float output that depends on the graph inputs, whose values are finite, fit int32 and
    are not all integers already."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type in TRUNC_SKIP or not _float_output(ctx, n) or n.output[0] not in dynamic:
            continue
        v = ctx.values[n.output[0]]
        if v.size and np.isfinite(v).all() and np.abs(v).max() < INT32_MAX and not np.array_equal(v, np.trunc(v)):
            sites.append(Site(n.name))
    return sites


def plant_int_truncation(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Cast to INT32 and a Cast back to the float type inserted after the node (the node writes a new tensor,
    the second Cast writes the old one): every reader gets the values truncated toward zero.  Planted: the Cast
    to int32 (the node before it computes as it did)."""
    node = node_by_name(ctx.proto, site.node)
    value = ctx.values[node.output[0]]
    back = helper.np_dtype_to_tensor_dtype(value.dtype)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    result = target.output[0]
    raw = unique_name(out, f"{result}_float")
    as_int = unique_name(out, f"{result}_int32")
    target.output[0] = raw
    down = helper.make_node("Cast", [raw], [as_int], name=unique_name(out, f"{site.node}_to_int32"),
                            to=TensorProto.INT32)
    up = helper.make_node("Cast", [as_int], [result], name=unique_name(out, f"{site.node}_from_int32"), to=back)
    insert_nodes(out, site.node, [], [down, up])
    checked = _checked(ctx, out, [result])
    if checked is None:
        raise NoVariant("the int32 round trip does not run, change the output or keep it finite")
    clean_on = ctx.run(ctx.proto, True)
    if all(np.array_equal(a, b, equal_nan=True) for a, b in zip(ctx.run(checked, True), clean_on)):
        raise NoVariant("with optimizations on ONNX Runtime removes the round trip (outputs unchanged)")
    lost = float(np.max(np.abs(value - np.trunc(value))))
    return Planted(checked, [down.name], "dtype",
                   f"{node.op_type} output {result} ({list(value.shape)}) truncated through int32 (Cast pair after "
                   f"it; up to {lost:.3g} lost)", {"also_accepted": "precision"})


# --------------------------------------------------------------------------- a kernel's spatial axes exchanged

KERNEL_OPS = ("Conv", "ConvTranspose", "FusedConv")


def kernel_hw_sites(ctx: FileContext) -> list[Site]:
    """Constant kernels (≥ 2 spatial axes, the last two of one size > 1, read by this node alone) of named
    Conv / ConvTranspose nodes that are not symmetric in those axes: ``(input index, source)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in KERNEL_OPS or not _onnx(n.domain) and n.op_type != "FusedConv":
            continue
        for k, src in weight_input(ctx.proto, n):
            if k != 1:
                continue
            value = constant(ctx.proto, src)
            if value is None or value.ndim < 4 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
                continue
            if not np.array_equal(value, np.swapaxes(value, -1, -2)):
                sites.append(Site(n.name, (k, src)))
    return sites


def plant_kernel_hw(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The kernel's last two spatial axes exchanged (a square kernel transposed: W[..., i, j] ← W[..., j, i]).
    Planted: the node (for a kernel behind a DequantizeLinear, the layer reading it)."""
    k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    new = np.ascontiguousarray(np.swapaxes(value, -1, -2))
    checked = _checked(ctx, with_initializer(ctx.proto, source, new), node.output)
    if checked is None:
        raise NoVariant("the transposed kernel does not run, change the output or keep it finite")
    return Planted(checked, [site.node], "weight-mismatch",
                   f"{node.op_type} kernel {source} {list(value.shape)} ({value.dtype}): spatial axes "
                   f"{value.ndim - 2} and {value.ndim - 1} exchanged (a [kw, kh] layout read as [kh, kw])",
                   {"weight": source})


# --------------------------------------------------------------------------- repeat order

def _merged_axis(before: tuple[int, ...], after: tuple[int, ...]) -> int | None:
    """The axis ``a`` when ``after`` is ``before`` with axes ``a`` and ``a + 1`` merged into one, else None."""
    if len(after) != len(before) - 1:
        return None
    for a in range(len(before) - 1):
        if before[:a] + (before[a] * before[a + 1],) + before[a + 2:] == after:
            return a
    return None


def repeat_sites(ctx: FileContext) -> list[Site]:
    """Named Reshapes of an Expand's (or Tile's) float output that merge two adjacent axes of it of sizes > 1,
    one of which the Expand broadcast from 1 (Tile: repeated) and the other not: ``(merged axis a,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Reshape" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        made = producer(ctx.proto, n.input[0])
        if made is None or made.op_type not in ("Expand", "Tile") or not _onnx(made.domain) \
                or made.output[0] not in ctx.values:
            continue
        src = _value(ctx, made.input[0])
        if src is None:
            continue
        big = ctx.values[made.output[0]].shape
        a = _merged_axis(big, ctx.values[n.output[0]].shape)
        if a is None or big[a] < 2 or big[a + 1] < 2:
            continue
        small = (1,) * (len(big) - src.ndim) + src.shape
        grown = [small[i] != big[i] for i in (a, a + 1)]
        if grown[0] != grown[1]:
            sites.append(Site(n.name, (a,)))
    return sites


def plant_repeat_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Transpose exchanging the two axes the Reshape merges inserted before it: a repeat along one axis merged
    in the other order (``repeat_interleave`` ↔ ``repeat`` / ``tile``; grouped-query attention's key/value heads
    [h0, h1, h0, h1] instead of [h0, h0, h1, h1]).  Planted: the Transpose."""
    (a,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    rank = ctx.values[node.input[0]].ndim
    perm = list(range(rank))
    perm[a], perm[a + 1] = a + 1, a
    out = copy(ctx.proto)
    swapped = unique_name(out, f"{node.input[0]}_repeat_order")
    tr = helper.make_node("Transpose", [node.input[0]], [swapped], name=unique_name(out, f"{site.node}_repeat_order"),
                          perm=perm)
    node_by_name(out, site.node).input[0] = swapped
    insert_nodes(out, site.node, [tr], [])
    checked = _usable(ctx, out, node.output[0])
    if checked is None or not _finite_outputs(ctx, checked) \
            or ctx.tensor(checked, node.output[0]).shape != ctx.values[node.output[0]].shape:
        raise NoVariant("the other repeat order does not run, keep the shape or change the output")
    big = ctx.values[node.input[0]].shape
    return Planted(checked, [tr.name], "attribute-mismatch",
                   f"Reshape {site.node} merges axes {a}, {a + 1} of {list(big)} (one of them a repeat) in the other "
                   f"order (Transpose {perm} inserted: repeat ↔ repeat_interleave)", {"reshape": site.node})


# --------------------------------------------------------------------------- Einsum letters exchanged

def _terms(equation: str) -> tuple[list[str], str] | None:
    """(input terms, output term) of an explicit equation without ellipses; None otherwise."""
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq:
        return None
    lhs, rhs = eq.split("->")
    return lhs.split(","), rhs


def einsum_sites(ctx: FileContext) -> list[Site]:
    """Named Einsum nodes (explicit equation, no ellipsis) with a term holding two distinct letters of one size
    > 1: ``(term index (len(inputs): the output), i, j)`` for every such pair."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Einsum" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        terms = _terms(attribute(n, "equation", ""))
        if terms is None or len(terms[0]) != len(n.input):
            continue
        shapes = [None if _value(ctx, t) is None else _value(ctx, t).shape for t in n.input]
        shapes.append(ctx.values[n.output[0]].shape)
        for k, term in enumerate([*terms[0], terms[1]]):
            if shapes[k] is None or len(shapes[k]) != len(term) or len(set(term)) != len(term):
                continue
            for i in range(len(term)):
                for j in range(i + 1, len(term)):
                    if shapes[k][i] == shapes[k][j] > 1:
                        sites.append(Site(n.name, (k, i, j)))
    return sites


def plant_einsum_swap(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The two letters exchanged in that term of the equation (``bhqd,bhkd->bhqk`` → ``bhdq,bhkd->bhqk``: the
    operand, or the result, read transposed).  Planted: the node."""
    k, i, j = site.detail
    node = node_by_name(ctx.proto, site.node)
    equation = attribute(node, "equation")
    ins, res = _terms(equation)
    terms = [*ins, res]
    t = list(terms[k])
    t[i], t[j] = t[j], t[i]
    terms[k] = "".join(t)
    new = ",".join(terms[:-1]) + "->" + terms[-1]
    out = copy(ctx.proto)
    set_attr(node_by_name(out, site.node), "equation", new)
    checked = _usable(ctx, out, node.output[0])
    if checked is None or not _finite_outputs(ctx, checked):
        raise NoVariant("the exchanged letters do not run, change the output or keep it finite")
    return Planted(checked, [site.node], "attribute-mismatch", f"Einsum {site.node} equation {equation} → {new}",
                   {"equation": [equation, new]})


KINDS = (
    FaultKind("bn-batch-stats", bn_sites, plant_bn_batch_stats, "training-mode",
              "a BatchNormalization in training mode (training_mode=1): the batch's statistics, not the running ones"),
    FaultKind("bn-fold-wrong", fold_sites, plant_bn_fold_wrong, "batchnorm-fold",
              "a BatchNorm folded into the Conv before it with a mistake (var for std, mean not subtracted, shift "
              "unscaled)"),
    FaultKind("trig-swap", trig_sites, plant_trig_swap, "attribute-mismatch",
              "a Sin made a Cos or a Cos a Sin (rotary / sinusoidal tables exchanged)"),
    FaultKind("rsqrt", sqrt_sites, plant_rsqrt, "attribute-mismatch",
              "a Sqrt computed as Pow(x, -0.5): rsqrt where sqrt was meant"),
    FaultKind("int-truncation", trunc_sites, plant_int_truncation, "dtype",
              "a float node's output truncated through int32 (Cast to int32 and back inserted)"),
    FaultKind("kernel-hw-transposed", kernel_hw_sites, plant_kernel_hw, "weight-mismatch",
              "a square convolution kernel's spatial axes exchanged (a [kw, kh] layout read as [kh, kw])"),
    FaultKind("repeat-order", repeat_sites, plant_repeat_order, "attribute-mismatch",
              "an Expand / Tile repeat merged by a Reshape in the other order (repeat ↔ repeat_interleave: GQA heads)"),
    FaultKind("einsum-swap", einsum_sites, plant_einsum_swap, "attribute-mismatch",
              "two letters of one Einsum term exchanged (an operand or the result read transposed)"),
)
