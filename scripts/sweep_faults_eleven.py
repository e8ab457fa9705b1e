"""The eleventh set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's, a checkpoint loader's or a graph rewriter's mistake the earlier sets never
planted: two sibling Slices of one tensor reading each other's window (q/k/v or gate/up chunks of a fused
projection taken in the wrong order, rotate_half's halves exchanged), a weight's output channels permuted by a
structured permutation (the LLaMA rotary interleave ↔ half-split permutation, head blocks reordered), one output
channel of a weight (and its bias) or one looked-up embedding row zeroed (a pruning mask or ``padding_idx`` on the
wrong row), a float weight replaced by a weight-only int8 DequantizeLinear whose per-tensor scale is too small
(large weights saturate at ±127), an Unsqueeze / Squeeze axis or a Gather axis moved where the shapes still work
(a broadcast over the wrong axis), a constant triangular mask rebuilt one diagonal off (attention sees one
future token), a non-square weight stored in the other layout and reshaped instead of transposed (a TF / JAX
[in, out] Dense kernel ``.reshape(out, in)``, an HWIO kernel reshaped to OIHW), and a bias moved after the
activation that followed it (a fusion pass computing act(x) + b instead of act(x + b)).

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when
no variant works at a site, a changed shared constant first given a private copy) and finds its sites by graph
structure and values alone, never by names.  Where a kind has several variants at a site it plants the first, in
its order of preference, whose outputs diverge from PyTorch's by ≥ 2× the tolerance (optimizations on and off),
else the strongest one (:func:`sweep_faults_nine._pick`).

Expected causes use the tool's vocabulary (``Cause`` in src/onnx_bisect/records/core.py): attribute changes and
rewiring ``attribute-mismatch`` (the shifted constant mask too, as ``trilu-attr``); changed weights
``weight-mismatch`` (the moved bias too, as ``bias-dropped``: at the Linear / Conv the bias is missing); the
clipping weight quantizer ``quantization`` (the tool's quantization rule measures each quantized weight against
PyTorch's, and a careful engineer names the DequantizeLinear's scale, not the float weight, as what to fix;
``weight-mismatch`` recorded as also accepted in ``extra``).

Not written: a Dropout in training mode (``training-mode``).  ONNX Runtime's CPU Dropout with a ``seed`` gives the
same mask in each new session, but its graph optimizer (basic level) removes a Dropout whose output is not a
graph output even with ``training_mode=True``, so such a file agrees with PyTorch with optimizations on and the
sweep never counts it (it diverges with optimizations off only).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          folded, insert_nodes, is_float_array, node_by_name, producer, prune, readers, set_attr,
                          unique_name, weight_input, with_argument, with_initializer, with_own_constant)
from sweep_faults_nine import _finite_outputs, _onnx, _pick
from sweep_faults_ops import _usable
from sweep_faults_ten import _checked, _constant_root, _dynamic, _from_input, _named, _value

#: nodes with a weight whose output channels the weight kinds change (a private copy of the shared tuple)
PRODUCT_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv")
MIN_CHANNELS = 4


# --------------------------------------------------------------------------- weights: output channels

def _out_axis(node: onnx.NodeProto, k: int, value: np.ndarray) -> int | None:
    """The axis of the weight at input ``k`` that indexes the node's output channels; None when the weight is
    not the node's B / kernel input (a MatMul's first input, a grouped ConvTranspose)."""
    op = node.op_type
    if "MatMul" in op:
        return value.ndim - 1 if k == 1 and value.ndim >= 2 else None
    if "Gemm" in op:
        if k != 1 or value.ndim != 2:
            return None
        return 0 if attribute(node, "transB", 0) else 1
    if op in ("Conv", "FusedConv"):
        return 0 if k == 1 else None
    if op == "ConvTranspose":
        return 1 if k == 1 and attribute(node, "group", 1) == 1 else None
    return None


def _bias_input(ctx: FileContext, node: onnx.NodeProto) -> int | None:
    """Input index of a Gemm's / Conv's constant 1-D bias (a vector over the output channels), else None."""
    k = 2
    if node.op_type in ("Gemm", "FusedGemm", "Conv", "ConvTranspose", "FusedConv") and len(node.input) > k \
            and node.input[k]:
        value = constant(ctx.proto, node.input[k])
        if is_float_array(value) and value.ndim == 1 and value.size > 1:
            return k
    return None


def _bias_of(ctx: FileContext, node: onnx.NodeProto, n: int) -> tuple[str, int, np.ndarray] | None:
    """(node, input index, value) of the bias over the node's ``n`` output channels: a Gemm's / Conv's own bias
    input, or the constant vector of size ``n`` of the Add that alone reads a MatMul's output (a Linear's bias);
    else None."""
    k = _bias_input(ctx, node)
    if k is not None:
        value = constant(ctx.proto, node.input[k])
        return (node.name, k, value) if value.size == n else None
    if "MatMul" not in node.op_type:
        return None
    found = readers(ctx.proto, node.output[0])
    if len(found) != 1 or found[0].op_type != "Add" or not found[0].name:
        return None
    add = found[0]
    for j, t in enumerate(add.input):
        value = constant(ctx.proto, t)
        if t != node.output[0] and is_float_array(value) and value.size == n and value.shape[-1] == n:
            return add.name, j, value
    return None


def channel_sites(ctx: FileContext) -> list[Site]:
    """Float weights (≥ 2 dims, read by this node alone, not all zero) of MatMul / Gemm / Conv nodes with ≥ 4
    output channels: ``(input index, initializer, output-channel axis)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in PRODUCT_OPS or not _onnx(n.domain) and not n.op_type.startswith("Fused"):
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if src != n.input[k] or not is_float_array(value) or not np.any(value):
                continue
            axis = _out_axis(n, k, value)
            if axis is not None and value.shape[axis] >= MIN_CHANNELS:
                sites.append(Site(n.name, (k, src, axis)))
    return sites


def _permutations(n: int, rng: np.random.Generator) -> list[tuple[np.ndarray, str]]:
    """Structured permutations of ``n`` output channels, in order of preference: the rotary interleaved →
    half-split permutation within blocks (head-sized where a power of two ≥ 8 divides n, else the whole axis),
    the half-split → interleaved one, head blocks (2 or 4) rotated by one."""
    found: list[tuple[np.ndarray, str]] = []
    blocks = [b for b in (64, 32, 16, 8) if n % b == 0 and b < n][:1] + [n]
    for b in blocks:
        if b % 2:
            continue
        within = np.arange(b).reshape(b // 2, 2).T.reshape(-1)  # [0,2,4,...,1,3,5,...]
        perm = (np.arange(n // b)[:, None] * b + within[None, :]).reshape(-1)
        found.append((perm, f"rotary permutation (interleaved pairs → half-split) within blocks of {b}"))
        inverse = np.argsort(within)
        perm = (np.arange(n // b)[:, None] * b + inverse[None, :]).reshape(-1)
        found.append((perm, f"rotary permutation (half-split → interleaved pairs) within blocks of {b}"))
    for heads in (4, 2):
        if n % heads == 0 and n // heads >= 2:
            perm = np.roll(np.arange(n).reshape(heads, n // heads), 1, axis=0).reshape(-1)
            found.append((perm, f"{heads} head blocks of {n // heads} rotated by one"))
    seen, out = set(), []
    for perm, text in found:
        key = tuple(perm.tolist())
        if key not in seen and not np.array_equal(perm, np.arange(n)):
            seen.add(key)
            out.append((perm, text))
    return out


def plant_rows_permuted(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight's output channels (and the bias with them: a Gemm's / Conv's, a MatMul's bias Add) permuted: the first structured
    permutation (see :func:`_permutations`) whose outputs count, else the strongest.  Planted: the node."""
    k, source, axis = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    n = value.shape[axis]
    found = _bias_of(ctx, node, n)
    bias_node, bias_k, bias = found if found is not None else (None, None, None)

    def variants():
        for perm, text in _permutations(n, rng):
            new = np.take(value, perm, axis=axis)
            if np.array_equal(new, value):
                continue
            out = with_initializer(ctx.proto, source, new)
            if bias is not None:
                out = with_own_constant(out, bias_node, bias_k, np.take(bias, perm, axis=-1), "permuted")
            checked = _checked(ctx, out, node.output)
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}): output channels (axis {axis}) "
                f"permuted, {text}" + (" (bias too)" if bias is not None else ""),
                {"weight": source, "permutation": text})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no permutation of the output channels changes the output")
    return planted


PRUNE_CHOICES = 3  # channels tried, among the strongest


def prune_sites(ctx: FileContext) -> list[Site]:
    """The output-channel weights of :func:`channel_sites`, and 2-D float embedding tables a Gather looks up by
    token ids (a graph input through Cast / Reshape ... alone): ``(input index, initializer, axis, ids input)``."""
    sites = [Site(s.node, (*s.detail, None)) for s in channel_sites(ctx)]
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Gather" or not _onnx(n.domain) or attribute(n, "axis", 0) != 0 or len(n.input) < 2:
            continue
        value = constant(ctx.proto, n.input[0])
        ids = _value(ctx, n.input[1])
        if is_float_array(value) and value.ndim == 2 and ids is not None and ids.dtype.kind in "iu" and ids.size \
                and _from_input(ctx, n.input[1]):
            sites.append(Site(n.name, (0, n.input[0], 0, 1)))
    return sites


def plant_channel_pruned(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """One output channel of the weight (with its bias entry: a Gemm's / Conv's, a MatMul's bias Add) set to zero, or one embedding row
    the input looks up: up to three channels, seeded among the eight of largest norm (rows: among those looked
    up), the first whose outputs count, else the strongest.  A shared table is given a private copy."""
    k, source, axis, ids_k = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    moved = np.moveaxis(value.astype(np.float64), axis, 0).reshape(value.shape[axis], -1)
    norms = np.linalg.norm(moved, axis=1)
    if ids_k is not None:
        used = np.unique(_value(ctx, node.input[ids_k]).reshape(-1).astype(np.int64) % value.shape[0])
        pool = [int(r) for r in used if norms[r] > 0]
    else:
        pool = [int(c) for c in np.argsort(-norms)[:8] if norms[c] > 0]
    if not pool:
        raise NoVariant("every channel is already zero")
    choices = [pool[int(i)] for i in rng.permutation(len(pool))[:PRUNE_CHOICES]]
    found = _bias_of(ctx, node, value.shape[axis]) if ids_k is None else None
    bias_node, bias_k, bias = found if found is not None else (None, None, None)

    def variants():
        for c in choices:
            new = value.copy()
            index = [slice(None)] * value.ndim
            index[axis] = c
            new[tuple(index)] = 0
            out = with_own_constant(ctx.proto, site.node, k, new, "pruned")
            if bias is not None:
                b = bias.copy()
                b[..., c] = 0
                out = with_own_constant(out, bias_node, bias_k, b, "pruned")
            checked = _checked(ctx, out, node.output)
            what = "embedding row" if ids_k is not None else f"output channel (axis {axis})"
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}): {what} {c} zeroed "
                f"(norm {norms[c]:.3g}, largest {norms.max():.3g})" + (" and its bias" if bias is not None else ""),
                {"weight": source, "channel": c})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no zeroed channel changes the output")
    return planted


# --------------------------------------------------------------------------- weight-only int8 with a clipping scale

CLIP_DIVISORS = (4, 8, 16, 32)  # the per-tensor scale is max|w| / 127 divided by this


def int8_sites(ctx: FileContext) -> list[Site]:
    """Float weights of :func:`channel_sites` (not behind a DequantizeLinear already) with a spread of
    magnitudes (the largest ≥ 2× the 99th percentile would not matter: any weight saturates at the clip)."""
    return [s for s in channel_sites(ctx) if constant(ctx.proto, s.detail[1]).size >= 16]


def plant_weight_int8_clipped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight replaced by DequantizeLinear(int8 initializer, per-tensor scale, zero point 0): the scale is
    max|w|/127 divided by 4, 8, 16 or 32, so the weights beyond 127·scale saturate.  The first divisor whose
    outputs count, else the strongest.  Planted: the layer reading the dequantized weight (the sweep's
    convention for weights behind a DequantizeLinear)."""
    k, source, axis = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    top = float(np.abs(value.astype(np.float64)).max())
    if top <= 0:
        raise NoVariant("an all-zero weight")

    def variants():
        for div in CLIP_DIVISORS:
            scale = np.float32(top / 127.0 / div)
            q = np.clip(np.round(value.astype(np.float64) / scale), -127, 127).astype(np.int8)
            clipped = float(np.mean(np.abs(value.astype(np.float64)) > 127 * float(scale)))
            out = copy(ctx.proto)
            qname = unique_name(out, f"{source}_int8")
            sname = unique_name(out, f"{source}_scale")
            zname = unique_name(out, f"{source}_zero_point")
            dname = unique_name(out, f"{source}_dequantized")
            out.graph.initializer.extend([numpy_helper.from_array(q, qname),
                                          numpy_helper.from_array(np.array(scale, value.dtype), sname),
                                          numpy_helper.from_array(np.array(0, np.int8), zname)])
            dq = helper.make_node("DequantizeLinear", [qname, sname, zname], [dname],
                                  name=unique_name(out, f"{site.node}_weight_dq"))
            node_by_name(out, site.node).input[k] = dname
            insert_nodes(out, site.node, [dq], [])
            prune(out, dead_nodes(ctx.proto))
            checked = _checked(ctx, out, node.output)
            yield None if checked is None else Planted(
                checked, [site.node], "quantization",
                f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) → DequantizeLinear(int8, "
                f"per-tensor scale {float(scale):.3g} = max|w|/127/{div}): {clipped:.1%} of the weights saturate",
                {"weight": source, "divisor": div, "clipped_fraction": clipped, "also_accepted": "weight-mismatch"})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the clipped int8 weight does not change the output")
    return planted


# --------------------------------------------------------------------------- sibling Slices exchanged

def _slice_args(ctx: FileContext, node: onnx.NodeProto) -> tuple | None:
    """The constant (starts, ends, axes, steps) of an opset ≥ 10 Slice; None when any is computed."""
    if len(node.input) < 3:
        return None
    args = [folded(ctx, t) if t else None for t in node.input[1:5]]
    if args[0] is None or args[1] is None or any(a is None for a, t in zip(args[2:], node.input[3:5]) if t):
        return None
    return tuple(args)


def slice_pair_sites(ctx: FileContext) -> list[Site]:
    """Pairs of named Slices (constant windows) of the same float tensor whose outputs have one shape and
    differ beyond the tolerance: ``(the other Slice,)`` (each pair once)."""
    groups: dict[str, list[onnx.NodeProto]] = {}
    for n in _named(ctx.proto.graph.node):
        if n.op_type == "Slice" and _onnx(n.domain) and n.output[0] in ctx.values and _slice_args(ctx, n):
            if ctx.values[n.output[0]].dtype.kind == "f" and ctx.values[n.output[0]].size > 1:
                groups.setdefault(n.input[0], []).append(n)
    sites = []
    for nodes in groups.values():
        for i, a in enumerate(nodes):
            for b in nodes[i + 1:]:
                va, vb = ctx.values[a.output[0]], ctx.values[b.output[0]]
                if va.shape == vb.shape and not np.array_equal(va, vb):
                    sites.append(Site(a.name, (b.name,)))
    return sites


def plant_slice_swapped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The two Slices read each other's window (their starts, ends, axes and steps exchanged, private
    constants): every reader of the one gets the other's chunk.  Planted: the Slice first in the graph's order
    (both diverge, on separate branches; the first is where a bisection meets the fault), the other in ``extra``."""
    (other,) = site.detail
    a, b = node_by_name(ctx.proto, site.node), node_by_name(ctx.proto, other)
    out = copy(ctx.proto)
    # each Slice reads the other's window from private initializers (a Constant node computing the other's
    # window may come after it in the graph's order; the constants left unread are dropped)
    for x, y in ((a, b), (b, a)):
        target = node_by_name(out, x.name)
        del target.input[1:]
        for t in y.input[1:]:
            if not t:
                target.input.append("")
                continue
            name = unique_name(out, f"{t}_window")
            out.graph.initializer.append(numpy_helper.from_array(np.asarray(folded(ctx, t)), name))
            target.input.append(name)
    prune(out, dead_nodes(ctx.proto))
    checked = _usable(ctx, out, a.output[0])
    if checked is None or not _finite_outputs(ctx, checked):
        raise NoVariant("the exchanged windows do not run, change the output or keep it finite")
    sa, sb = _slice_args(ctx, a), _slice_args(ctx, b)
    first = next(n.name for n in ctx.proto.graph.node if n.name in (a.name, b.name))
    return Planted(checked, [first], "attribute-mismatch",
                   f"Slices of {a.input[0]} ({list(ctx.values[a.output[0]].shape)} each) exchanged: starts "
                   f"{sa[0].tolist()} ↔ {sb[0].tolist()}, ends {sa[1].tolist()} ↔ {sb[1].tolist()}",
                   {"other": other, "both": [a.name, b.name]})


# --------------------------------------------------------------------------- an axis moved

def _axes_arg(ctx: FileContext, node: onnx.NodeProto) -> tuple[list[int], str] | None:
    """(axes, 'input' / 'attribute') of an Unsqueeze / Squeeze (constant axes), None when computed or absent."""
    if len(node.input) > 1 and node.input[1]:
        value = folded(ctx, node.input[1])
        return (None if value is None else ([int(v) for v in np.asarray(value).reshape(-1)], "input"))
    axes = attribute(node, "axes")
    return None if axes is None else (list(axes), "attribute")


def axis_sites(ctx: FileContext) -> list[Site]:
    """Unsqueezes and Squeezes (constant axes) and Gathers of a tensor that depends on the inputs whose outputs
    the clean file computes, float or not (a mask's Unsqueeze moves its broadcast)."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("Unsqueeze", "Squeeze", "Gather") or not _onnx(n.domain) or not n.input \
                or n.output[0] not in ctx.values or n.input[0] not in dynamic:
            continue
        if n.op_type in ("Unsqueeze", "Squeeze") and _axes_arg(ctx, n) is not None:
            sites.append(Site(n.name))
        elif n.op_type == "Gather" and _value(ctx, n.input[0]) is not None and _value(ctx, n.input[0]).ndim >= 2:
            sites.append(Site(n.name))
    return sites


def _axis_variants(ctx: FileContext, node: onnx.NodeProto, rng: np.random.Generator) -> list[tuple[list[int], str]]:
    out_rank = ctx.values[node.output[0]].ndim
    data = _value(ctx, node.input[0])
    found = []
    if node.op_type == "Gather":
        axis = attribute(node, "axis", 0) % data.ndim
        top = int(np.asarray(_value(ctx, node.input[1])).max(initial=0))
        low = int(np.asarray(_value(ctx, node.input[1])).min(initial=0))
        for a in range(data.ndim):
            if a != axis and data.shape[a] > max(top, -low - 1):
                found.append(([a], f"Gather axis {axis} → {a}"))
        return found
    axes, _ = _axes_arg(ctx, node)
    rank = out_rank if node.op_type == "Unsqueeze" else data.ndim
    norm = [a % rank for a in axes]
    for i, a in enumerate(norm):
        for b in range(rank):
            if b in norm:
                continue
            if node.op_type == "Squeeze" and data.shape[b] != 1:
                continue
            new = list(norm)
            new[i] = b
            found.append((sorted(new), f"{node.op_type} axes {axes} → {sorted(new)}"))
    found.sort(key=lambda v: abs(v[0][0] - norm[0]) if norm else 0)  # the nearest axis first
    return found


def plant_axis_moved(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An Unsqueeze's / Squeeze's axes entry moved to another valid axis, or a Gather's axis moved to another
    axis its indices fit, where the model still runs and keeps its output shapes (nearest axis first): the
    first whose outputs count, else the strongest.  Planted: the node."""
    node = node_by_name(ctx.proto, site.node)
    options = _axis_variants(ctx, node, rng)
    if not options:
        raise NoVariant("no other valid axis")

    def variants():
        for new, text in options:
            out = copy(ctx.proto)
            target = node_by_name(out, site.node)
            if node.op_type == "Gather":
                set_attr(target, "axis", new[0])
            else:
                _, where = _axes_arg(ctx, node)
                if where == "attribute":
                    set_attr(target, "axes", new)
                else:
                    out = with_argument(ctx, site.node, 1, np.array(new, np.int64))
            checked = _usable(ctx, out, node.output[0]) if not ctx.problem(out) else None
            if checked is not None and not _finite_outputs(ctx, checked):
                checked = None
            yield None if checked is None else Planted(checked, [site.node], "attribute-mismatch", text)

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no moved axis keeps the model running with its output shapes")
    return planted


# --------------------------------------------------------------------------- a constant triangular mask shifted

MASK_PASS_OPS = ("Cast", "Identity", "Unsqueeze", "Squeeze", "Expand", "Slice", "Reshape")
MASK_MIN = -1e4



def _triangle(value: np.ndarray) -> tuple[int, bool, object, object] | None:
    """(diagonal k, lower, kept value, masked value) when every 2-D slice of ``value`` is the same two-valued
    triangular mask (kept where j ≤ i + k for a lower one, j ≥ i + k for an upper one); else None."""
    if value.ndim < 2 or value.shape[-1] < 2 or value.shape[-2] < 2:
        return None
    flat = value.reshape(-1, *value.shape[-2:])
    m = flat[0]
    if not all(np.array_equal(m, f) for f in flat[1:]):
        return None
    levels = np.unique(m)
    if levels.size != 2:
        return None
    if m.dtype.kind == "b":
        kept, masked = True, False
    elif m.dtype.kind == "f" and levels.min() <= MASK_MIN and levels.max() == 0:
        kept, masked = levels.max(), levels.min()
    elif m.dtype.kind in "fiu" and set(levels.tolist()) == {0, 1}:
        kept, masked = levels.dtype.type(1), levels.dtype.type(0)
    else:
        return None
    rows, cols = m.shape
    for lower in (True, False):
        for k in range(-rows + 1, cols):
            band = np.tril(np.ones(m.shape, bool), k) if lower else np.triu(np.ones(m.shape, bool), k)
            for keep, drop in ((kept, masked), (masked, kept)):
                if np.array_equal(m, np.where(band, keep, drop).astype(m.dtype)):
                    return k, lower, keep, drop
    return None


def mask_shift_sites(ctx: FileContext) -> list[Site]:
    """Constant (possibly through Cast / Unsqueeze / Expand / Slice) triangular two-valued masks (bool, 0/1, or
    0 / ≤ -1e4) that an Add adds to an activation or a Where reads: ``(input index, constant)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or n.output[0] not in ctx.values:
            continue
        if n.op_type == "Add" and len(n.input) == 2:
            ks = [k for k in (0, 1) if folded(ctx, n.input[1 - k]) is None]
        elif n.op_type in ("Where", "And", "Or", "Mul"):
            ks = [k for k in range(len(n.input)) if folded(ctx, n.input[k]) is not None]
        else:
            continue
        for k in ks:
            root = _constant_root(ctx, n.input[k], MASK_PASS_OPS)
            if root is None or any(r.op_type in PRODUCT_OPS for r in readers(ctx.proto, root)):
                continue
            value = folded(ctx, n.input[k])
            if value is not None and _triangle(value) is not None:
                sites.append(Site(n.name, (k, root)))
    return sites


def plant_mask_shifted(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node reads the mask rebuilt one diagonal off (k + 1 first, a lower mask then lets each position see
    one future one; then k − 1), a private constant: the first whose outputs count, else the strongest."""
    k, root = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = folded(ctx, node.input[k])
    diag, lower, keep, drop = _triangle(value)
    tri = np.tril if lower else np.triu

    def variants():
        for step in (1, -1) if lower else (-1, 1):
            band = tri(np.ones(value.shape[-2:], bool), diag + step)
            new = np.broadcast_to(np.where(band, keep, drop).astype(value.dtype), value.shape).copy()
            if np.array_equal(new, value):
                continue
            out = _usable(ctx, with_argument(ctx, site.node, k, new), node.output[0])
            if out is not None and not _finite_outputs(ctx, out):
                out = None
            yield None if out is None else Planted(
                out, [site.node], "attribute-mismatch",
                f"{node.op_type} input {k} {node.input[k]} {list(value.shape)} ({value.dtype}; from constant {root}): "
                f"{'lower' if lower else 'upper'} triangular mask diagonal {diag} → {diag + step}",
                {"weight": root, "diagonal": [diag, diag + step]})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the shifted mask does not change the output")
    return planted


# --------------------------------------------------------------------------- a weight reshaped instead of transposed

def reshape_sites(ctx: FileContext) -> list[Site]:
    """The weights of :func:`channel_sites` that a reshape-for-transpose mistake changes: a MatMul / Gemm matrix
    that is not square (a square one would be transposed: ``transposed-weight``), a Conv / ConvTranspose kernel
    with a spatial extent or Cout ≠ Cin."""
    sites = []
    for s in channel_sites(ctx):
        value = constant(ctx.proto, s.detail[1])
        if value.ndim == 2 and value.shape[0] != value.shape[1]:
            sites.append(s)
        elif value.ndim >= 3 and (value.shape[0] != value.shape[1] or any(d > 1 for d in value.shape[2:])):
            sites.append(s)
    return sites


def _reshaped(value: np.ndarray) -> list[tuple[np.ndarray, str]]:
    """The weight as a loader that reshaped a checkpoint's other layout instead of transposing it would hold it:
    a matrix's transpose read in the matrix's shape (a TF / JAX [in, out] Dense kernel ``.reshape(out, in)``,
    or its batch of matrices each); a kernel stored HWIO (TF) reshaped to OIHW, or stored [O, kh, kw, I]
    (channels-last) reshaped."""
    found = []
    if value.ndim == 2:
        found.append((np.ascontiguousarray(value.T).reshape(value.shape), "transpose read in the original shape "
                      "(a [in, out] kernel .reshape(out, in) instead of .T)"))
    elif value.ndim == 3:  # a batch of matrices (MatMul with a 3-D weight)
        found.append((np.ascontiguousarray(np.swapaxes(value, -1, -2)).reshape(value.shape),
                      "each matrix's transpose read in its original shape"))
    else:
        spatial = tuple(range(2, value.ndim))
        found.append((np.ascontiguousarray(np.transpose(value, (*spatial, 1, 0))).reshape(value.shape),
                      "an HWIO (TF) kernel reshaped to OIHW instead of transposed"))
        found.append((np.ascontiguousarray(np.transpose(value, (0, *spatial, 1))).reshape(value.shape),
                      "a channels-last [O, kh, kw, I] kernel reshaped to OIHW instead of transposed"))
    return [(v, t) for v, t in found if not np.array_equal(v, value)]


def plant_weight_reshaped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight's elements read in another layout (same shape, same multiset of numbers): the first layout
    (see :func:`_reshaped`) whose outputs count, else the strongest.  Planted: the node."""
    k, source, axis = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)

    def variants():
        for new, text in _reshaped(value):
            checked = _checked(ctx, with_initializer(ctx.proto, source, new), node.output)
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}): {text}",
                {"weight": source})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the re-laid-out weight does not change the output")
    return planted


# --------------------------------------------------------------------------- a bias moved after the activation

#: elementwise ops an activation (fused or decomposed: GELU's Div / Erf / Add / Mul / Mul, SiLU's Sigmoid / Mul)
#: is made of; the bias is moved past the whole activation
ACT_OPS = ("Relu", "Gelu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid", "HardSwish",
           "Mish", "Celu", "FastGelu", "QuickGelu", "Erf", "Clip", "Mul", "Div", "Add", "Pow", "Sqrt", "Neg",
           "Reshape", "Cast", "Identity", "Unsqueeze", "Squeeze", "Flatten")  # (a Gemm's output reshaped first)
#: of which at least one must be a nonlinearity (act(x) + b ≠ act(x + b))
NONLINEAR_OPS = ("Relu", "Gelu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid",
                 "HardSwish", "Mish", "Celu", "FastGelu", "QuickGelu", "Erf", "Clip", "Pow", "Sqrt")
ACT_MAX_NODES = 12


def _activation_after(ctx: FileContext, tensor: str) -> onnx.NodeProto | None:
    """The node whose output ends the activation that reads ``tensor``: following the graph's order from the
    readers of ``tensor``, every node on the way is an elementwise op of ``ACT_OPS`` (its other inputs
    constants or tensors of the activation), and the open tensors close into one node's output (the
    activation's result); at most ``ACT_MAX_NODES`` nodes, at least one nonlinear; else None."""
    outputs = {o.name for o in ctx.proto.graph.output}
    nodes = list(ctx.proto.graph.node)
    open_, inside, seen_nonlinear = {tensor}, set(), False
    start = next((i for i, n in enumerate(nodes) if tensor in n.output), -1) + 1
    for n in nodes[start:]:
        reads = [t for t in n.input if t in open_]
        if not reads:
            continue
        if n.op_type not in ACT_OPS or not _onnx(n.domain) and n.op_type not in ("FastGelu", "QuickGelu", "Gelu"):
            return None
        if any(t and t not in open_ and folded(ctx, t) is None for t in n.input):
            return None
        inside.add(n.name)
        seen_nonlinear |= n.op_type in NONLINEAR_OPS
        for t in reads:  # a tensor stays open while another reader of it is still to come
            if all(r.name in inside for r in readers(ctx.proto, t)):
                open_.discard(t)
        open_.add(n.output[0])
        if len(open_) == 1 and seen_nonlinear and n.name and n.output[0] not in outputs:
            return n
        if len(inside) >= ACT_MAX_NODES or any(t in outputs for t in open_):
            return None
    return None


def bias_act_sites(ctx: FileContext) -> list[Site]:
    """A bias right before an activation: an Add of a constant float vector (not all zero) to a MatMul / Gemm /
    Conv output (``('add', k, end)``), or a Conv's / Gemm's own bias input (``('input', 2, end)``), where the
    sum feeds an activation alone (``end``: the node whose output ends it, see :func:`_activation_after`)."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or not n.output or n.output[0] not in ctx.values:
            continue
        if n.op_type == "Add" and len(n.input) == 2:
            ks = []
            for k in (0, 1):
                b = constant(ctx.proto, n.input[k])
                maker = producer(ctx.proto, n.input[1 - k])
                if is_float_array(b) and b.size > 1 and np.any(b) and maker is not None and maker.name \
                        and maker.op_type in PRODUCT_OPS:
                    ks.append(("add", k))
        elif n.op_type in ("Conv", "Gemm") and _bias_input(ctx, n) is not None \
                and np.any(constant(ctx.proto, n.input[2])):
            ks = [("input", 2)]
        else:
            continue
        for how, k in ks:
            end = _activation_after(ctx, n.output[0])
            if end is not None:
                sites.append(Site(n.name, (how, k, end.name)))
    return sites


def plant_bias_after_act(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The bias applied after the activation instead of before it: the activation reads the bias-free product
    and a new Add of the bias (broadcast as before: over a Conv's channel axis, a Linear's last axis) writes the
    activation's old output; the old bias Add, or the Conv's / Gemm's bias input, is taken out.  Planted: the
    MatMul / Gemm / Conv whose output is now handed on without its bias (the Linear's / Conv's output, as
    PyTorch sees it, is where the values first differ; the new Add after the activation is in ``extra``).
    Expected ``weight-mismatch``, as ``bias-dropped`` (at that node the bias is missing), with
    ``attribute-mismatch`` (the bias applied in the wrong place of the graph) recorded as also accepted."""
    how, k, end_name = site.detail
    node = node_by_name(ctx.proto, site.node)
    end = node_by_name(ctx.proto, end_name)
    out = copy(ctx.proto)
    final = end.output[0]
    bias_src = node.input[k]
    bias = constant(ctx.proto, bias_src)
    if how == "add":
        product = node.input[1 - k]
        for r in out.graph.node:  # the activation reads the product
            for j, t in enumerate(r.input):
                if t == node.output[0]:
                    r.input[j] = product
        shaped = bias
        planted = [producer(ctx.proto, product).name]
    else:
        t_node = node_by_name(out, site.node)
        del t_node.input[2]
        rank = ctx.values[node.output[0]].ndim
        shape = [1] * rank
        shape[1 if node.op_type == "Conv" else rank - 1] = bias.size
        shaped = bias.reshape(shape)
        planted = [site.node]
    bname = unique_name(out, f"{bias_src}_after_act")
    out.graph.initializer.append(numpy_helper.from_array(np.asarray(shaped), bname))
    pre = unique_name(out, f"{final}_no_bias")
    node_by_name(out, end_name).output[0] = pre
    add = helper.make_node("Add", [pre, bname], [final], name=unique_name(out, f"{end_name}_bias_add"))
    insert_nodes(out, end_name, [], [add])
    prune(out, dead_nodes(ctx.proto))
    checked = _checked(ctx, out, [final])
    if checked is None:
        raise NoVariant("the moved bias does not run, change the output or keep it finite")
    return Planted(checked, planted, "weight-mismatch",
                   f"{node.op_type} {site.node}'s bias {bias_src} ({list(bias.shape)}) added after the activation "
                   f"ending at {end.op_type} {end_name}: act(x) + b instead of act(x + b)",
                   {"bias": bias_src, "activation_end": end_name, "bias_add": add.name,
                    "also_accepted": "attribute-mismatch"})


KINDS = (
    FaultKind("slice-swapped", slice_pair_sites, plant_slice_swapped, "attribute-mismatch",
              "two sibling Slices of one tensor (same output shape) read each other's window (chunk order wrong)"),
    FaultKind("rows-permuted", channel_sites, plant_rows_permuted, "weight-mismatch",
              "a weight's output channels permuted: rotary interleave ↔ half-split within head-sized blocks, or "
              "head blocks rotated"),
    FaultKind("channel-pruned", prune_sites, plant_channel_pruned, "weight-mismatch",
              "one strong output channel of a weight (and its bias), or one looked-up embedding row, zeroed"),
    FaultKind("weight-int8-clipped", int8_sites, plant_weight_int8_clipped, "quantization",
              "a float weight replaced by DequantizeLinear(int8, per-tensor scale max|w|/127/4…32): weights saturate"),
    FaultKind("axis-moved", axis_sites, plant_axis_moved, "attribute-mismatch",
              "an Unsqueeze / Squeeze axes entry or a Gather axis moved to another valid axis (wrong broadcast)"),
    FaultKind("mask-shifted", mask_shift_sites, plant_mask_shifted, "attribute-mismatch",
              "a constant triangular mask rebuilt one diagonal off (one future token visible)"),
    FaultKind("weight-reshaped", reshape_sites, plant_weight_reshaped, "weight-mismatch",
              "a non-square weight's other layout reshaped instead of transposed ([in, out] .reshape, HWIO → OIHW)"),
    FaultKind("bias-after-act", bias_act_sites, plant_bias_after_act, "weight-mismatch",
              "a bias Add (or a Conv / Gemm bias) applied after the activation that followed it"),
)
