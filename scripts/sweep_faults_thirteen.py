"""The thirteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each an exporter's, a converter's, a checkpoint loader's or a graph rewriter's mistake the earlier sets
never planted:

* ``dropout-active`` — a model exported in training mode: a Dropout left active.  ONNX Runtime's Dropout draws a
  new random mask on every run, which no sweep could reproduce, so the planted form is deterministic: a Mul by a
  fixed seeded Bernoulli keep-mask scaled by 1/(1 − p) (inverted dropout, p = 0.1, else 0.3, else 0.5) inserted
  after an attention Softmax (attention dropout), an activation, an embedding lookup or the last node of a
  residual branch (hidden dropout); on a 4-d feature map (N, C, H, W) outside attention the mask is per channel,
  (N, C, 1, 1) (``Dropout2d``).  Expected cause ``training-mode``.
* ``weightnorm-axis`` — a weight-normalised layer (``torch.nn.utils.weight_norm``: W = g · v / ‖v‖ with the norm
  per output channel, PyTorch's ``dim=0``) folded by a converter along the other axis (``dim=1``): each weight
  becomes g_o · W[o, i] / ‖W[:, i]‖ (v = W, g_o = ‖W[o, :]‖), a per-row and per-column rescaling of a MatMul / Gemm
  / Conv / ConvTranspose / RNN weight.  Expected ``weight-mismatch``.
* ``weight-bf16`` — a float32 weight whose checkpoint went through bfloat16 (a ``torch_dtype=bfloat16`` copy used
  for the export while PyTorch's reference kept float32): every entry rounded to bfloat16's 8-bit mantissa (round
  to nearest even).  Expected ``weight-mismatch`` (the weight differs; ``precision`` recorded as also accepted, as
  ``weight-rounded`` records ``quantization``).
* ``reshape-order`` — a Reshape that splits one axis into two, or merges two adjacent axes into one, doing it in
  the other (column-major) order: heads split as ``(d h)`` instead of ``(h d)``, merged back as ``(d h)``, a
  TensorFlow-order flatten, a token grid read as (w h).  A split gets a Reshape to the exchanged sizes and a
  Transpose back inserted after it (the Transpose alone where the two sizes are equal); a merge gets a Transpose
  exchanging the two axes inserted before it (unit axes the Reshape adds or drops aside; a merge of an Expand /
  Tile, where ``repeat-order`` plants, and any split or merge of axis 0 are left out).  Expected
  ``attribute-mismatch``.
* ``scores-transposed`` — attention scores computed as K·Qᵀ instead of Q·Kᵀ (a Keras-style key-first einsum
  translated without reordering its output axes): a Transpose of the last two axes inserted after a MatMul of two
  computed tensors whose square output reaches a Softmax over its last axis through scaling, masking and Casts.
  Expected ``attribute-mismatch``.
* ``mask-causal`` — a bidirectional attention exported as causal (``is_causal=True`` handed to a decoder kernel
  or to ``scaled_dot_product_attention``): an Add of a constant upper-triangular mask (the dtype's lowest value
  above the diagonal) inserted before a Softmax over square scores that attends to later positions.  Expected
  ``attribute-mismatch`` (as ``mask-value``).
* ``rope-interleaved`` — rotary embedding applied to interleaved pairs (GPT-J's ``rotate_every_two``) where the
  model rotates halves (GPT-NeoX / Llama ``rotate_half``): the ``cat(−x[..., d/2:], x[..., :d/2])`` built from
  two Slices (or a Split), a Neg and a Concat replaced by a Gather of the pair-swapped entries and a Mul by the signs
  (−1, +1, −1, +1 …), the cos / sin tables left as they are.  Only the halves → interleaved direction is planted.
  Expected ``attribute-mismatch`` (an op-level change, not a table; ``rope-table`` and ``rows-permuted`` plant the
  table and weight forms).
* ``position-offset`` — a learned absolute position table read with the wrong offset (OPT / BART / RoBERTa keep
  their positions from row 2, ``padding_idx + 1``; a converter dropping or adding that offset): the table's rows
  shifted by two (else one) positions, row i taking row i + k (the last rows repeated where the table ends).
  Sites: a constant float table of ≥ 3 positions and ≥ 2 channels added to an activation whose last two axes it
  matches (not flowing into a Softmax: attention biases are ``mask-transposed``'s), or a 2-d float table gathered
  along axis 0 by indices that are increasing ranges (position ids, not token ids); sinusoidal tables (cos² + sin²
  = 1 pairs, ``rope-table``'s) are left out.  Expected ``weight-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; unlike the earlier sets, a site
where even the strongest variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (the sweep
then tries the next site), so every planted fault of this set counts.

Planted nodes: the changed node (a weight's reader; for a table read through a private copy, that reader); for an
inserted node or pair (the dropout Mul, the split's Reshape and Transpose, the merge's Transpose, the scores'
Transpose, the causal mask's Add) the first new node, as ``cast-bf16`` and ``int-truncation`` do; for a replaced
subgraph (the rotation) the new nodes, as ``gelu-swap`` does.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, insert_nodes,
                          is_float_array, node_by_name, producer, readers, replace_node, unique_name, weight_input,
                          with_initializer, with_own_constant)
from sweep_faults_nine import OUTPUT_MIN, _onnx, _pick
from sweep_faults_ops import _usable
from sweep_faults_ten import _checked, _dynamic, _named, _unit, _value
from sweep_faults_twelve import _float_output, _graph_outputs

MS_DOMAIN = "com.microsoft"


def _counting(ctx: FileContext, variants, what: str) -> Planted:
    """The first of ``variants`` whose outputs count (≥ 2× the tolerance, optimizations on and off; see
    :func:`sweep_faults_nine._pick`); :class:`NoVariant` when none runs or even the strongest stays under."""
    planted = _pick(ctx, variants)
    if planted is None:
        raise NoVariant(f"{what}: no variant runs, changes the output and keeps it finite")
    worst = min(ctx.output_ratio(planted.model, opt) for opt in (False, True))
    if worst < OUTPUT_MIN:
        raise NoVariant(f"{what}: the strongest variant reaches {worst:.3g}× the tolerance (< {OUTPUT_MIN:g}×)")
    return planted


def _after(ctx: FileContext, node_name: str, build) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """Copy of the file with new nodes right after node ``node_name``: the node writes a new tensor ``raw``,
    ``build(out, raw, result)`` returns the new nodes, the last of which writes the node's old first output
    ``result`` (its readers read the new nodes' result)."""
    out = copy(ctx.proto)
    target = node_by_name(out, node_name)
    result = target.output[0]
    raw = unique_name(out, f"{result}_raw")
    target.output[0] = raw
    new = build(out, raw, result)
    insert_nodes(out, node_name, [], new)
    return out, new


def _add_constant(out: onnx.ModelProto, base: str, value: np.ndarray) -> str:
    name = unique_name(out, base)
    out.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
    return name


def _norm_axis(axis: int, rank: int) -> int:
    return axis % rank if rank else 0


# --------------------------------------------------------------------------- dropout left in training mode

DROPOUT_P = (0.1, 0.3, 0.5)
DROPOUT_ACTS = ("Softmax", "Relu", "Gelu", "LeakyRelu", "Clip", "Tanh", "Elu", "Selu", "Celu", "HardSwish", "Mish",
                "Softplus", "FastGelu", "BiasGelu", "QuickGelu")
BRANCH_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "Add", "FusedMatMul", "FusedGemm", "FusedConv")


def _feeds_residual(ctx: FileContext, node: onnx.NodeProto, dynamic: set[str]) -> bool:
    """The node's output is read by one node alone, an Add of it and another computed float tensor of its shape
    (a skip connection): the node is the last of a residual branch."""
    t = node.output[0]
    shape = ctx.values[t].shape
    found = readers(ctx.proto, t)
    if len(found) != 1:  # the residual stream itself has other readers (the next norm, the next skip)
        return False
    for r in found:
        if r.op_type != "Add" or not _onnx(r.domain) or len(r.input) != 2 or r.input[0] == r.input[1]:
            continue
        other = r.input[1] if r.input[0] == t else r.input[0]
        if other in dynamic and other in ctx.values and ctx.values[other].shape == shape \
                and ctx.values[other].dtype.kind == "f" and not _residual_root(ctx, other, t):
            return True
    return False


def _residual_root(ctx: FileContext, skip: str, branch: str) -> bool:
    """Whether ``branch`` is computed from ``skip`` by elementwise ops alone within a few nodes (a gate or a
    scale of the skip itself, not a branch of its own)."""
    node = producer(ctx.proto, branch)
    for _ in range(2):
        if node is None:
            return False
        if skip in node.input:
            return node.op_type in ("Mul", "Div", "Cast", "Identity")
        node = producer(ctx.proto, node.input[0]) if node.input else None
    return False


def dropout_sites(ctx: FileContext) -> list[Site]:
    """Named nodes with a computed float output of ≥ 8 entries, not all zero, not a graph output: an attention
    Softmax or an activation, a Gather from a 2-d float table (an embedding), or the last node of a residual
    branch (a MatMul / Gemm / Conv / bias Add feeding an Add with the skip): ``(where,)``."""
    dynamic, outputs = _dynamic(ctx), _graph_outputs(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not (_onnx(n.domain) or n.domain == MS_DOMAIN) or not _float_output(ctx, n) \
                or n.output[0] not in dynamic or n.output[0] in outputs:
            continue
        value = ctx.values[n.output[0]]
        if value.size < 8 or not np.any(value):
            continue
        where = None
        if n.op_type in DROPOUT_ACTS:
            where = "attention" if n.op_type == "Softmax" else "activation"
        elif n.op_type == "Gather" and is_float_array(constant(ctx.proto, n.input[0])) \
                and constant(ctx.proto, n.input[0]).ndim == 2:
            where = "embedding"
        elif n.op_type in BRANCH_OPS and _feeds_residual(ctx, n, dynamic):
            where = "residual branch"
        if where:
            sites.append(Site(n.name, (where,)))
    return sites


def plant_dropout_active(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by a fixed keep-mask / (1 − p) inserted after the node (the node writes a new tensor, the Mul its old
    output): p = 0.1, else 0.3, else 0.5, one seeded uniform draw thresholded at each p (a dropped entry is
    guaranteed).  Per channel (N, C, 1, 1) on a 4-d output outside attention, else per element.  Planted: the
    Mul."""
    (where,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = ctx.values[node.output[0]]
    channel = where != "attention" and value.ndim == 4
    shape = value.shape[:2] + (1,) * (value.ndim - 2) if channel else value.shape
    draw = rng.random(shape)
    draw.flat[int(np.argmin(draw))] = 0.0  # at least one entry dropped at every p

    def variants():
        for p in DROPOUT_P:
            mask = ((draw >= p) / (1 - p)).astype(value.dtype)

            def build(out, raw, result, mask=mask):
                name = _add_constant(out, f"{site.node}_dropout_mask", mask)
                return [helper.make_node("Mul", [raw, name], [result],
                                         name=unique_name(out, f"{site.node}_dropout"))]

            out, new = _after(ctx, site.node, build)
            checked = _checked(ctx, out, [node.output[0]])
            dropped = float(1 - np.count_nonzero(mask) / mask.size)
            yield None if checked is None else Planted(
                checked, [new[0].name], "training-mode",
                f"Dropout(p={p:g}) left in training mode after {node.op_type} {site.node} ({where}, "
                f"{list(value.shape)}): a fixed {'per-channel ' if channel else ''}mask {list(shape)} dropping "
                f"{dropped:.1%}, the rest scaled by {1 / (1 - p):.4g}",
                {"p": p, "mask": "channel" if channel else "element", "after": site.node, "where": where})

    return _counting(ctx, variants(), "dropout")


# --------------------------------------------------------------------------- weight norm folded along the wrong axis

WN_OPS = ("MatMul", "FusedMatMul", "Gemm", "FusedGemm", "Conv", "FusedConv", "ConvTranspose", "LSTM", "GRU", "RNN")
RNN_OPS = ("LSTM", "GRU", "RNN")


def _wn_axes(node: onnx.NodeProto, k: int, value: np.ndarray) -> tuple[int, int] | None:
    """(axis of PyTorch's ``dim=0``, axis of its ``dim=1``) of the weight at input ``k``, in ONNX's layout:
    a MatMul's [in, out] is a Linear's weight transposed, a Gemm's follows ``transB``, a Conv's and a
    ConvTranspose's keep PyTorch's, an RNN's [directions, gates·hidden, in] puts PyTorch's rows on axis 1."""
    op = node.op_type
    if op in ("MatMul", "FusedMatMul"):
        if k != 1 or value.ndim != 2:
            return None
        return (0, 1) if op == "FusedMatMul" and attribute(node, "transB", 0) else (1, 0)
    if op in ("Gemm", "FusedGemm"):
        if k != 1 or value.ndim != 2:
            return None
        return (0, 1) if attribute(node, "transB", 0) else (1, 0)
    if op in ("Conv", "FusedConv", "ConvTranspose"):
        return (0, 1) if k == 1 and value.ndim >= 3 else None
    if op in RNN_OPS:
        return (1, 2) if k in (1, 2) and value.ndim == 3 else None
    return None


def wn_sites(ctx: FileContext) -> list[Site]:
    """Float weights (≥ 2 dims, read by this node alone, not all zero) of named MatMul / Gemm / Conv /
    ConvTranspose / LSTM / GRU / RNN nodes, ≥ 2 channels on PyTorch's ``dim=0``: ``(input index, source)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in WN_OPS or not (_onnx(n.domain) or n.domain == MS_DOMAIN):
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if src != n.input[k] or not is_float_array(value) or not np.any(value):
                continue
            axes = _wn_axes(n, k, value)
            if axes is not None and value.shape[axes[0]] >= 2:
                sites.append(Site(n.name, (k, src)))
    return sites


def _norm_except(v: np.ndarray, keep: tuple[int, ...]) -> np.ndarray:
    axes = tuple(a for a in range(v.ndim) if a not in keep)
    return np.sqrt(np.sum(v * v, axis=axes, keepdims=True)) if axes else np.abs(v)


def plant_weightnorm_axis(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """W → g · W / ‖W‖_dim=1 with g = ‖W‖_dim=0 (norms over every other axis, each RNN direction on its own):
    the weight-norm fold done along the wrong axis.  Planted: the node."""
    k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    dim, wrong = _wn_axes(node, k, value)
    extra_keep = (0,) if node.op_type in RNN_OPS else ()
    v = value.astype(np.float64)
    g = _norm_except(v, (dim, *extra_keep))
    n = _norm_except(v, (wrong, *extra_keep))
    with np.errstate(all="ignore"):
        new = np.where(n > 0, g * v / np.where(n > 0, n, 1.0), v).astype(value.dtype)

    def variants():
        checked = _checked(ctx, with_initializer(ctx.proto, source, new), node.output)
        scale = np.abs(new.astype(np.float64)) / np.maximum(np.abs(v), 1e-30)
        used = scale[np.abs(v) > 0]
        yield None if checked is None else Planted(
            checked, [site.node], "weight-mismatch",
            f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}): weight norm folded along the wrong "
            f"axis (norm over ONNX axis {wrong}'s slices instead of axis {dim}'s: entries scaled "
            f"×{float(used.min()):.3g}…×{float(used.max()):.3g})",
            {"weight": source, "axis": dim, "wrong_axis": wrong})

    return _counting(ctx, variants(), "weight norm along the wrong axis")


# --------------------------------------------------------------------------- weight through bfloat16

def bf16_round(value: np.ndarray) -> np.ndarray:
    """``value`` rounded to bfloat16 (round to nearest even on float32's bits), in its own dtype."""
    f = np.ascontiguousarray(value.astype(np.float32))
    bits = f.view(np.uint32).astype(np.uint64)
    finite = np.isfinite(f)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(finite, rounded, f).astype(value.dtype)


def bf16_sites(ctx: FileContext) -> list[Site]:
    """Float weights (≥ 2 dims, read by this node alone) of named MatMul / Gemm / Conv / RNN nodes that bfloat16
    does not represent exactly: ``(source,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in WN_OPS or not (_onnx(n.domain) or n.domain == MS_DOMAIN):
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if src == n.input[k] and is_float_array(value) and not np.array_equal(bf16_round(value), value):
                sites.append(Site(n.name, (src,)))
    return sites


def plant_weight_bf16(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight rounded to bfloat16 and stored back in its dtype.  Planted: the node."""
    (source,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    new = bf16_round(value)

    def variants():
        checked = _checked(ctx, with_initializer(ctx.proto, source, new), node.output)
        with np.errstate(all="ignore"):
            rel = np.abs(new.astype(np.float64) - value) / np.maximum(np.abs(value.astype(np.float64)), 1e-30)
        yield None if checked is None else Planted(
            checked, [site.node], "weight-mismatch",
            f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) rounded through bfloat16 (a "
            f"bf16 checkpoint): up to {float(rel.max()):.3g} relative, {float(np.mean(new != value)):.1%} of the "
            f"entries changed", {"weight": source, "also_accepted": "precision"})

    return _counting(ctx, variants(), "bfloat16 weight")


# --------------------------------------------------------------------------- a split or merge in the other order

def _one_merge(big: tuple[int, ...], small: tuple[int, ...]) -> int | None:
    """The axis ``a`` (≥ 1) of ``big`` when ``small`` is ``big`` with axes ``a`` and ``a + 1`` (both ≥ 2) merged
    into one, axes of size 1 aside (a Reshape that also adds or drops unit axes, onnx-simplifier's 2-d Gemm
    operands); else None."""
    target = [s for s in small if s != 1]
    for a in range(1, len(big) - 1):
        if big[a] >= 2 and big[a + 1] >= 2:
            merged = big[:a] + (big[a] * big[a + 1],) + big[a + 2:]
            if [s for s in merged if s != 1] == target:
                return a
    return None


def reshape_sites(ctx: FileContext) -> list[Site]:
    """Named Reshapes with a float output that split one axis into two adjacent axes of sizes ≥ 2, ``("split",
    a)`` (a: the first of the two in the output), or merge two such axes into one, ``("merge", a)`` (a: the first
    in the input; not of an Expand / Tile output), unit axes aside, axis 0 never one of the two."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Reshape" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        src = _value(ctx, n.input[0])
        if src is None:
            continue
        before, after = tuple(src.shape), tuple(ctx.values[n.output[0]].shape)
        a = _one_merge(before, after)
        if a is not None:
            made = producer(ctx.proto, n.input[0])
            if made is None or made.op_type not in ("Expand", "Tile"):
                sites.append(Site(n.name, ("merge", a)))
            continue
        a = _one_merge(after, before)
        if a is not None:
            sites.append(Site(n.name, ("split", a)))
    return sites


def plant_reshape_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Split: a Reshape to the two sizes exchanged (every other dim copied: 0) and a Transpose exchanging them back
    inserted after the Reshape — ``(h d)`` read as ``(d h)`` — or, where the two sizes are equal, the Transpose
    alone.  Merge: a Transpose exchanging the two axes inserted before it.  Planted: the first new node (the
    Transpose where it is the only one)."""
    how, a = site.detail
    node = node_by_name(ctx.proto, site.node)
    if how == "split":
        after = ctx.values[node.output[0]].shape
        rank = len(after)
        perm = list(range(rank))
        perm[a], perm[a + 1] = a + 1, a

        square = after[a] == after[a + 1]

        def build(out, raw, result):
            if square:  # the sizes exchanged are the same sizes: the Transpose alone
                return [helper.make_node("Transpose", [raw], [result], name=unique_name(out, f"{site.node}_back"),
                                         perm=perm)]
            shape = [0] * rank
            shape[a], shape[a + 1] = after[a + 1], after[a]
            sname = _add_constant(out, f"{site.node}_column_major_shape", np.array(shape, np.int64))
            mid = unique_name(out, f"{result}_column_major")
            re = helper.make_node("Reshape", [raw, sname], [mid], name=unique_name(out, f"{site.node}_column_major"))
            tr = helper.make_node("Transpose", [mid], [result], name=unique_name(out, f"{site.node}_back"),
                                  perm=perm)
            return [re, tr]

        out, new = _after(ctx, site.node, build)
        text = (f"Reshape {site.node} splits axis {a} into {list(after[a:a + 2])} in the other order ("
                + ("a Transpose of the two inserted after it)" if square else
                   f"as {[after[a + 1], after[a]]}, then transposed back)"))
        planted, extra = [new[0].name], {"reshape": site.node, "transpose": new[-1].name}
    else:
        before = _value(ctx, node.input[0]).shape
        perm = list(range(len(before)))
        perm[a], perm[a + 1] = a + 1, a
        out = copy(ctx.proto)
        swapped = unique_name(out, f"{node.input[0]}_column_major")
        tr = helper.make_node("Transpose", [node.input[0]], [swapped],
                              name=unique_name(out, f"{site.node}_column_major"), perm=perm)
        node_by_name(out, site.node).input[0] = swapped
        insert_nodes(out, site.node, [tr], [])
        text = (f"Reshape {site.node} merges axes {a}, {a + 1} of {list(before)} in the other order (Transpose "
                f"{perm} inserted before it)")
        planted, extra = [tr.name], {"reshape": site.node}

    def variants():
        checked = _usable(ctx, out, node.output[0])
        if checked is not None and ctx.tensor(checked, node.output[0]).shape != ctx.values[node.output[0]].shape:
            checked = None
        yield None if checked is None else Planted(checked, planted, "attribute-mismatch", text, extra)

    return _counting(ctx, variants(), "the other reshape order")


# --------------------------------------------------------------------------- attention scores transposed

SCORE_PASS = ("Mul", "Div", "Add", "Sub", "Where", "Cast", "Identity", "QuantizeLinear", "DequantizeLinear")
SCORE_DEPTH = 6


def _softmax_reached(ctx: FileContext, tensor: str) -> onnx.NodeProto | None:
    """The Softmax over the last axis that ``tensor`` reaches through ≤ ``SCORE_DEPTH`` scaling / masking / Cast /
    QuantizeLinear / DequantizeLinear nodes, each the tensor's only reader; else None."""
    outputs = _graph_outputs(ctx)
    for _ in range(SCORE_DEPTH + 1):
        found = readers(ctx.proto, tensor)
        if len(found) != 1 or tensor in outputs:
            return None
        node = found[0]
        if node.op_type == "Softmax" and _onnx(node.domain):
            rank = ctx.values[node.output[0]].ndim
            return node if _norm_axis(attribute(node, "axis", -1), rank) == rank - 1 else None
        if node.op_type not in SCORE_PASS or not _onnx(node.domain) or node.output[0] not in ctx.values:
            return None
        tensor = node.output[0]
    return None


def scores_sites(ctx: FileContext) -> list[Site]:
    """Named MatMuls of two computed tensors with a float output of ≥ 3 dims whose last two are equal (≥ 2) that
    reach a Softmax over the last axis (see :func:`_softmax_reached`): ``(softmax name,)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("MatMul", "FusedMatMul") or not (_onnx(n.domain) or n.domain == MS_DOMAIN) \
                or not _float_output(ctx, n) or not all(t in dynamic for t in n.input[:2]):
            continue
        shape = ctx.values[n.output[0]].shape
        if len(shape) < 3 or shape[-1] != shape[-2] or shape[-1] < 2:
            continue
        soft = _softmax_reached(ctx, n.output[0])
        if soft is not None:
            sites.append(Site(n.name, (soft.name,)))
    return sites


def plant_scores_transposed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Transpose of the last two axes inserted after the scores' MatMul (K·Qᵀ for Q·Kᵀ).  Planted: the
    Transpose."""
    (soft,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    shape = ctx.values[node.output[0]].shape
    perm = list(range(len(shape)))
    perm[-1], perm[-2] = perm[-2], perm[-1]

    def variants():
        def build(out, raw, result):
            return [helper.make_node("Transpose", [raw], [result], name=unique_name(out, f"{site.node}_key_first"),
                                     perm=perm)]

        out, new = _after(ctx, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "attribute-mismatch",
            f"attention scores {node.output[0]} {list(shape)} of {node.op_type} {site.node} transposed (K·Qᵀ for "
            f"Q·Kᵀ) before Softmax {soft}", {"matmul": site.node, "softmax": soft})

    return _counting(ctx, variants(), "transposed scores")


# --------------------------------------------------------------------------- a causal mask added

CAUSAL_SEEN = 1e-4  # a softmax attends to later positions when some weight above the diagonal exceeds this


def causal_sites(ctx: FileContext) -> list[Site]:
    """Named Softmax nodes over the last axis of a float input whose last two axes are equal (≥ 2), with some
    weight above the diagonal (the attention is not causal already)."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        probs = ctx.values[n.output[0]]
        if probs.ndim < 2 or probs.shape[-1] != probs.shape[-2] or probs.shape[-1] < 2 \
                or _norm_axis(attribute(n, "axis", -1), probs.ndim) != probs.ndim - 1:
            continue
        upper = np.triu(np.ones(probs.shape[-2:], bool), 1)
        if float(np.max(np.abs(probs[..., upper]))) > CAUSAL_SEEN and n.input[0] in ctx.values:
            sites.append(Site(n.name))
    return sites


def plant_mask_causal(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An Add of a constant [T, T] mask (0 on and below the diagonal, the dtype's lowest value above) inserted
    before the Softmax.  Planted: the Add."""
    node = node_by_name(ctx.proto, site.node)
    scores = ctx.values[node.input[0]]
    t = scores.shape[-1]
    mask = np.triu(np.full((t, t), np.finfo(scores.dtype).min, scores.dtype), 1)

    def variants():
        out = copy(ctx.proto)
        mname = _add_constant(out, f"{site.node}_causal_mask", mask)
        masked = unique_name(out, f"{node.input[0]}_causal")
        add = helper.make_node("Add", [node.input[0], mname], [masked], name=unique_name(out, f"{site.node}_causal"))
        node_by_name(out, site.node).input[0] = masked
        insert_nodes(out, site.node, [add], [])
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [add.name], "attribute-mismatch",
            f"a causal mask [{t}, {t}] added before Softmax {site.node} ({list(scores.shape)}): a bidirectional "
            f"attention exported as causal (is_causal=True)", {"softmax": site.node})

    return _counting(ctx, variants(), "causal mask")


# --------------------------------------------------------------------------- rotary on interleaved pairs

def _halves(ctx: FileContext, concat: onnx.NodeProto) -> str | None:
    """The tensor X when the Concat computes ``cat(−X[..., d/2:], X[..., :d/2])`` on its last axis from a Neg of
    a Slice (or Split output) and a Slice (or Split output) of X (checked on the values), else None."""
    if len(concat.input) != 2 or concat.output[0] not in ctx.values:
        return None
    value = ctx.values[concat.output[0]]
    if value.ndim < 1 or _norm_axis(attribute(concat, "axis", 0), value.ndim) != value.ndim - 1:
        return None
    neg, second = (producer(ctx.proto, t) for t in concat.input)
    if neg is None or second is None or neg.op_type != "Neg" or second.op_type not in ("Slice", "Split"):
        return None
    first = producer(ctx.proto, neg.input[0])
    if first is None or first.op_type not in ("Slice", "Split") or first.input[0] != second.input[0]:
        return None
    x = _value(ctx, first.input[0])
    d = value.shape[-1]
    if x is None or x.shape != value.shape or d < 4 or d % 2:
        return None
    h = d // 2
    expected = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return first.input[0] if np.array_equal(expected, value) else None


def rope_sites(ctx: FileContext) -> list[Site]:
    """Named Concats computing rotate_half (``cat(−x2, x1)`` of a tensor's two halves on the last axis, from two
    Slices or a Split, and a Neg): ``(x,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type == "Concat" and _onnx(n.domain) and _float_output(ctx, n):
            x = _halves(ctx, n)
            if x is not None:
                sites.append(Site(n.name, (x,)))
    return sites


def plant_rope_interleaved(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Concat (and the Slices / Split and Neg only it reads) replaced by ``Gather(x, [1, 0, 3, 2, …],
    axis=-1)`` and a Mul by ``[−1, 1, −1, 1, …]``: GPT-J's rotate_every_two (out[2i] = −x[2i+1], out[2i+1] = x[2i])
    where the model rotates halves.  Planted: the Gather and the Mul."""
    (x,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = ctx.values[node.output[0]]
    d = value.shape[-1]
    idx = np.arange(d).reshape(-1, 2)[:, ::-1].reshape(-1).astype(np.int64)
    sign = np.tile(np.array([-1, 1], value.dtype), d // 2)

    def variants():
        out = copy(ctx.proto)
        iname = _add_constant(out, f"{site.node}_pair_index", idx)
        sname = _add_constant(out, f"{site.node}_pair_sign", sign)
        mid = unique_name(out, f"{node.output[0]}_pairs")
        gather = helper.make_node("Gather", [x, iname], [mid], name=unique_name(out, f"{site.node}_pairs"), axis=-1)
        mul = helper.make_node("Mul", [mid, sname], [node.output[0]],
                               name=unique_name(out, f"{site.node}_every_two"))
        replace_node(out, site.node, [gather, mul])
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [gather.name, mul.name], "attribute-mismatch",
            f"rotate_half {site.node} ({list(value.shape)}: cat(-x[..., {d // 2}:], x[..., :{d // 2}])) computed as "
            f"rotate_every_two on interleaved pairs (Gather + Mul by ±1), the cos / sin tables unchanged",
            {"concat": site.node, "x": x})

    return _counting(ctx, variants(), "interleaved rotary")


# --------------------------------------------------------------------------- learned positions off by an offset

POSITION_SHIFTS = (2, 1)
POSITION_SOFTMAX_DEPTH = 3


def _sinusoidal(value: np.ndarray) -> bool:
    d = value.shape[-1]
    return d >= 4 and d % 2 == 0 and (_unit(value[..., :d // 2], value[..., d // 2:])
                                      or _unit(value[..., 0::2], value[..., 1::2]))


def _near_softmax(ctx: FileContext, tensor: str) -> bool:
    """Whether ``tensor`` reaches a Softmax within ``POSITION_SOFTMAX_DEPTH`` nodes (an attention bias)."""
    frontier = [tensor]
    for _ in range(POSITION_SOFTMAX_DEPTH):
        nxt = []
        for t in frontier:
            for r in readers(ctx.proto, t):
                if r.op_type in ("Softmax", "LogSoftmax"):
                    return True
                nxt += [o for o in r.output if o]
        frontier = nxt
    return False


def _ranges(idx: np.ndarray) -> bool:
    """Integer indices whose every row (last axis, ≥ 3 entries) counts up by one: position ids."""
    if idx.dtype.kind not in "iu" or idx.ndim < 1 or idx.shape[-1] < 3:
        return False
    rows = idx.reshape(-1, idx.shape[-1]).astype(np.int64)
    return bool(np.all(np.diff(rows, axis=-1) == 1))


def position_sites(ctx: FileContext) -> list[Site]:
    """``("add", input index, source)``: a float constant (≥ 2 dims, ≥ 3 positions on axis −2, ≥ 2 channels, every
    other axis 1, varying along the positions) added by a named Add to a computed tensor whose last two axes it
    matches, the sum reaching no Softmax within three nodes.  ``("gather", 0, source)``: a named Gather along axis
    0 of a 2-d float constant table by position ids (increasing ranges, see :func:`_ranges`).  Sinusoidal tables
    are left out."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        if n.op_type == "Add" and len(n.input) == 2:
            for k, t in enumerate(n.input):
                other = n.input[1 - k]
                table = constant(ctx.proto, t)
                x = ctx.values.get(other)
                if not is_float_array(table) or table.ndim < 2 or other not in dynamic or x is None \
                        or x.ndim < 2 or table.shape[-2:] != x.shape[-2:] or table.shape[-2] < 3 \
                        or table.shape[-1] < 2 or any(s != 1 for s in table.shape[:-2]):
                    continue
                if np.allclose(table, table[..., :1, :]) or _sinusoidal(table) or _near_softmax(ctx, n.output[0]):
                    continue
                sites.append(Site(n.name, ("add", k, t)))
        elif n.op_type == "Gather" and attribute(n, "axis", 0) == 0:
            table = constant(ctx.proto, n.input[0])
            idx = _value(ctx, n.input[1])
            if is_float_array(table) and table.ndim == 2 and table.shape[0] >= 3 and table.shape[1] >= 2 \
                    and idx is not None and _ranges(idx) and not _sinusoidal(table) \
                    and not np.allclose(table, table[:1]):
                sites.append(Site(n.name, ("gather", 0, n.input[0])))
    return sites


def plant_position_offset(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The table's positions shifted by k = 2, else 1: row i takes row min(i + k, last) (a private copy where
    another node reads the table too).  Planted: the node."""
    how, k_in, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    table = constant(ctx.proto, source)
    axis = table.ndim - 2 if how == "add" else 0
    n = table.shape[axis]

    def variants():
        for shift in POSITION_SHIFTS:
            rows = np.minimum(np.arange(n) + shift, n - 1)
            new = np.ascontiguousarray(np.take(table, rows, axis=axis))
            out = with_own_constant(ctx.proto, site.node, k_in, new, "offset")
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"position table {source} {list(table.shape)} ({'added' if how == 'add' else 'gathered'} by "
                f"{node.op_type} {site.node}) read {shift} position{'s' if shift > 1 else ''} off: row i takes row "
                f"i + {shift} (the last rows repeated)", {"weight": source, "shift": shift})

    return _counting(ctx, variants(), "position offset")


KINDS = (
    FaultKind("dropout-active", dropout_sites, plant_dropout_active, "training-mode",
              "a Dropout left in training mode: a fixed seeded keep-mask / (1 − p) Mul after a Softmax, an "
              "activation, an embedding or a residual branch (per channel on 4-d feature maps)", max_tries=40),
    FaultKind("weightnorm-axis", wn_sites, plant_weightnorm_axis, "weight-mismatch",
              "a weight-normalised layer folded along the wrong axis: W → ‖W‖_dim0 · W / ‖W‖_dim1", max_tries=40),
    FaultKind("weight-bf16", bf16_sites, plant_weight_bf16, "weight-mismatch",
              "a MatMul / Gemm / Conv / RNN float weight rounded through bfloat16 (a bf16 checkpoint)", max_tries=40),
    FaultKind("reshape-order", reshape_sites, plant_reshape_order, "attribute-mismatch",
              "a Reshape splitting or merging two axes in the other (column-major) order: (h d) ↔ (d h)",
              max_tries=40),
    FaultKind("scores-transposed", scores_sites, plant_scores_transposed, "attribute-mismatch",
              "attention scores transposed before the Softmax (K·Qᵀ for Q·Kᵀ)", max_tries=40),
    FaultKind("mask-causal", causal_sites, plant_mask_causal, "attribute-mismatch",
              "a causal mask added before a bidirectional attention's Softmax (is_causal=True)", max_tries=40),
    FaultKind("rope-interleaved", rope_sites, plant_rope_interleaved, "attribute-mismatch",
              "rotate_half computed as rotate_every_two (rotary on interleaved pairs instead of halves)",
              max_tries=40),
    FaultKind("position-offset", position_sites, plant_position_offset, "weight-mismatch",
              "a learned position table read 2 (else 1) positions off (OPT / RoBERTa's offset dropped or added)",
              max_tries=40),
)
