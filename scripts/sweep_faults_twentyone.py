"""The twenty-first set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a hand-written port's, a converter's, a checkpoint loader's or a deployment's mistake the earlier
sets never planted:

* ``attn-window`` — an attention given a local (sliding-window) mask it does not have (Mistral's / Qwen 2's
  ``sliding_window`` or ``use_sliding_window`` read as set, Gemma 2's / ModernBERT's alternating local layers mapped
  onto a global one, Longformer's local window carried into a plain encoder): an Add of a constant [S, S] bias
  (−1e4 outside the window, 0 inside) inserted before a self-attention Softmax (:func:`sweep_faults_nineteen.
  sink_sites`, queries and keys of one length S ≥ 4) — for a causal attention (no weight above the diagonal) the
  keys more than w − 1 positions back masked, else every key w or more positions away; w = S / 2, S / 4, 2.
  ``mask-causal`` adds a causal mask, ``mask-shifted`` / ``trilu-attr`` move a diagonal, ``softmax-chunked``
  normalises per block.  Expected ``attribute-mismatch``.
* ``qkv-clipped`` — queries, keys and values clamped where the model does not clamp them (DBRX's / OLMo's
  ``clip_qkv`` carried into another model, a config default read as set): a Clip(−c, c) inserted on both operands
  of an attention's scores MatMul (found from the Softmax through single-input nodes) and on the value operand of
  its probabilities product, c = 8 (DBRX's), then half and a quarter of each tensor's max |x|.
  ``clip-bounds`` narrows an existing Clip, ``logit-softcap`` caps the scores, ``qk-normed`` normalises q and k.
  Expected ``attribute-mismatch``.
* ``norm-at-init`` — a normalisation's parameters left at their initial values (a checkpoint whose LayerNorm keys
  are ``gamma`` / ``beta`` loaded with ``strict=False`` into a model that calls them ``weight`` / ``bias``, a
  converter that dropped a norm's affine, BatchNorm buffers not saved): every float parameter of a norm (a norm
  node's, an InstanceNormalization's affine Mul / Add after it, a written-out norm's weight Mul and bias Add;
  :func:`sweep_faults_twenty._norm_params`) set to its initialisation (scales and variances 1, shifts and means
  0), then the scales alone, then the shifts alone.  ``norm-reused`` copies another norm's parameters,
  ``vector-collapsed`` replaces a vector by its mean, ``scale-offset`` moves a scale by ±1, ``norm-dropped`` drops
  the whole norm.  Expected ``weight-mismatch``.
* ``rope-on-values`` — a rotary embedding applied to the values as well as the queries and keys (a port rotating
  the fused qkv tensor before splitting it, ``apply_rotary_pos_emb`` called on v): the rotation of the keys (an Add
  of ``k·cos`` and ``rotate(k)·sin``, :func:`sweep_faults_seventeen.position_sites`'s rotary sites, reaching the
  scores MatMul's key operand through layout nodes) cloned onto the value tensor of the same shape in the value
  operand's chain (its float nodes copied, reading the values instead of the keys), the value chain reading the
  rotated copy.  ``kv-swapped`` exchanges keys and values, ``rope-interleaved`` / ``rope-table`` change the
  rotation, ``pos-embed-dropped`` drops it.  Expected ``attribute-mismatch``.
* ``pos-interpolated`` — a learned absolute position table resampled the model does not resample (position
  interpolation — Chen et al.'s linear ``rope_scaling`` idea — applied to a learned table, a long-context
  fine-tune's scaling factor read into the base model, a ViT's ``interpolate_pos_encoding`` run at the size it was
  trained at through a coarser grid): a position table (:func:`sweep_faults_thirteen.position_sites`: a constant
  added to a computed tensor, or gathered by position ids) whose positions after a leading class row form a square
  grid (an added table) resampled bilinearly to half the grid and back, then (every table) row i read at position
  i / 2, then i / 4 (linear interpolation between rows).  ``position-offset`` shifts the rows by whole positions,
  ``pos-embed-dropped`` drops the table, ``weight-noise`` perturbs it at random.  Expected ``weight-mismatch``.
* ``rnn-bidir-merge`` — a bidirectional RNN's two directions merged wrongly (a hand-written bidirectional layer —
  input flipped, run forward, output not flipped back — in a port, Keras' ``Bidirectional`` output read as
  [backward, forward], a TF converter concatenating the directions in the other order): after an ONNX LSTM / GRU /
  RNN with ``direction="bidirectional"``, the backward direction's outputs Y[:, 1] reversed in time (Slices,
  a reversing Slice, Concat), then the two directions exchanged (one Slice with step −1 over the direction axis).
  ``rnn-layout`` reverses a direction's run or its gate blocks, ``axis-flipped`` flips a whole input or output,
  ``concat-order`` swaps two same-shape Concat inputs.  Expected ``attribute-mismatch``.
* ``act-pool-order`` — an activation and the pooling after it applied in the other order (a port pooling before
  the final norm-activation of a pre-activation ResNet / EfficientNet head, a squeeze-excitation written as
  ``act(mean(x))`` for ``mean(act(x))``): a GlobalAveragePool, GlobalMaxPool, AveragePool, ReduceMean or ReduceMax
  (not a norm's) whose input is an activation (one node, or written out — x·σ(x), the erf GELU — of ≤ 6 nodes)
  made to read the activation's input, a copy of the activation applied to its output (every reader of the pool
  rewired; other readers of the activation keep it).  ``act-before-layer`` moves an activation across a layer,
  ``pool-mode`` / ``reduce-kind`` change a pool's kind.  Expected ``attribute-mismatch``.
* ``avg-down`` — a strided 1 × 1 convolution's subsampling done by an average pool (ResNet-D's ``avg_down``
  shortcut — timm's ``resnet*d`` — for a plain ResNet's strided 1 × 1 projection, or the other way round in a
  port): an AveragePool (kernel and stride s, ``ceil_mode``, padding not counted) inserted on the input of a Conv /
  FusedConv with a constant 1 × 1 (or 1-wide) kernel, no padding and a stride s > 1, the Conv's stride set to 1.
  ``stride-moved`` moves a stride to another Conv, ``antialias-blur`` blurs before a strided Conv, ``pool-window``
  resizes an existing pool.  Expected ``attribute-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.  A planted file whose edits read a tensor made later in the node list is
re-sorted (:func:`sweep_faults_seventeen._toposorted`), so that it stays topologically sorted.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the inserted window Add; the three
inserted Clips; the norm nodes, affine Muls and Adds whose constants changed; the cloned rotation nodes; the node
reading the resampled table; the inserted Slices and Concat (or the one Slice); the pool and the cloned activation
nodes; the inserted AveragePool and the Conv whose stride changed.  Sites with more than 12 are refused.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, copy, insert_nodes,
                          node_by_name, producer, set_attr, unique_name, with_own_constant)
from sweep_faults_eighteen import _kv_chain, _rewired
from sweep_faults_nine import _onnx
from sweep_faults_nineteen import _convs, _ours, _with_value, sink_sites
from sweep_faults_ops import _opset
from sweep_faults_seventeen import ACT_ARITH, ACT_SPAN, ACTIVATIONS, _toposorted
from sweep_faults_seventeen import position_sites as _rotary_candidates
from sweep_faults_sixteen import SEGMENT, _ancestor_tensors, _block, _producers
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting
from sweep_faults_thirteen import position_sites as _table_sites
from sweep_faults_twelve import _float_output
from sweep_faults_twenty import _norm_members, _norm_params, _param, _scores_product

INT_MIN = np.iinfo(np.int64).min


def _ints(out: onnx.ModelProto, base: str, values) -> str:
    return _add_constant(out, base, np.array(list(values), np.int64))


def _slice(ctx: FileContext, out: onnx.ModelProto, x: str, y: str, starts, ends, axes, steps,
           name: str) -> onnx.NodeProto:
    """A Slice node in the file's opset (inputs from opset 10)."""
    if _opset(ctx) >= 10:
        ins = [x, _ints(out, f"{name}_starts", starts), _ints(out, f"{name}_ends", ends),
               _ints(out, f"{name}_axes", axes), _ints(out, f"{name}_steps", steps)]
        return helper.make_node("Slice", ins, [y], name=name)
    return helper.make_node("Slice", [x], [y], name=name, starts=list(starts), ends=list(ends), axes=list(axes))


# --------------------------------------------------------------------------- a sliding-window mask added

WINDOW_FILL = -1e4  # an additive mask's fill that float16 holds
CAUSAL_ZERO = 1e-6  # an attention whose every weight above the diagonal is at most this is causal already
WINDOW_MIN = 4


def window_sites(ctx: FileContext) -> list[Site]:
    """Attention Softmaxes (:func:`sweep_faults_nineteen.sink_sites`) over equal query and key lengths S ≥ 4 with a
    computed float input: ``(S, causal)``."""
    sites = []
    for s in sink_sites(ctx):
        soft = node_by_name(ctx.proto, s.node)
        probs = ctx.values[soft.output[0]]
        if probs.ndim < 2 or probs.shape[-1] != probs.shape[-2] or probs.shape[-1] < WINDOW_MIN \
                or soft.input[0] not in ctx.values or probs.dtype.kind != "f":
            continue
        n = probs.shape[-1]
        upper = np.triu(np.ones((n, n), bool), 1)
        causal = float(np.max(np.abs(probs[..., upper]))) <= CAUSAL_ZERO
        sites.append(Site(s.node, (int(n), causal)))
    return sites


def _window_mask(n: int, w: int, causal: bool, dtype) -> np.ndarray:
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    outside = (i - j >= w) if causal else (np.abs(i - j) >= w)
    return np.where(outside, WINDOW_FILL, 0.0).astype(dtype)


def plant_attn_window(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An Add of a constant [S, S] window mask inserted on the Softmax's input (w = S / 2, S / 4, 2).  Planted: the
    Add."""
    n, causal = site.detail
    node = node_by_name(ctx.proto, site.node)
    scores = ctx.values[node.input[0]]
    windows = list(dict.fromkeys(w for w in (n // 2, n // 4, 2) if 1 < w < n))

    def variants():
        for w in windows:
            out = copy(ctx.proto)
            mask = _add_constant(out, f"{site.node}_window_mask", _window_mask(n, w, causal, scores.dtype))
            masked = unique_name(out, f"{node.input[0]}_windowed")
            add = helper.make_node("Add", [node.input[0], mask], [masked], name=unique_name(out, f"{site.node}_window"))
            node_by_name(out, site.node).input[0] = masked
            insert_nodes(out, site.node, [add], [])
            checked = _checked(ctx, out, [node.output[0]])
            how = (f"keys more than {w - 1} positions back masked (a causal sliding window of {w})" if causal
                   else f"keys {w} or more positions away masked (a local window of ±{w - 1})")
            yield None if checked is None else Planted(
                checked, [add.name], "attribute-mismatch",
                f"attention Softmax {site.node} ({list(scores.shape)}) given a sliding-window mask it does not have: "
                f"{how}", {"softmax": site.node, "window": w, "causal": causal})

    return _counting(ctx, variants(), "attention window")


# --------------------------------------------------------------------------- queries, keys and values clamped

CLIP_QKV = 8.0  # DBRX's clip_qkv
CLIP_FRACTIONS = (0.5, 0.25)


def qkv_clip_sites(ctx: FileContext) -> list[Site]:
    """Attention Softmaxes whose scores come from a MatMul of two computed float tensors
    (:func:`sweep_faults_twenty._scores_product`) and whose probabilities a value product reads: ``(scores product,
    value product)``, named by the Softmax."""
    dynamic = _dynamic(ctx)
    sites = []
    for s in sink_sites(ctx):
        soft = node_by_name(ctx.proto, s.node)
        mm = _scores_product(ctx, soft, dynamic)
        pv = s.detail[1]
        if mm is None:
            continue
        vals = [_value(ctx, t) for t in (mm.input[0], mm.input[1], node_by_name(ctx.proto, pv).input[1])]
        if any(v is None or v.dtype.kind != "f" or not v.size for v in vals):
            continue
        sites.append(Site(s.node, (mm.name, pv)))
    return sites


def _clip(ctx: FileContext, out: onnx.ModelProto, x: str, y: str, c: float, dtype, name: str) -> onnx.NodeProto:
    if _opset(ctx) >= 11:
        lo = _add_constant(out, f"{name}_min", np.array(-c, dtype))
        hi = _add_constant(out, f"{name}_max", np.array(c, dtype))
        return helper.make_node("Clip", [x, lo, hi], [y], name=name)
    return helper.make_node("Clip", [x], [y], name=name, min=-float(c), max=float(c))


def plant_qkv_clipped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Clip(−c, c) inserted on the queries, the keys and the values (c = 8, then half and a quarter of each
    tensor's max |x|).  Planted: the three Clips."""
    mm_name, pv_name = site.detail
    mm, pv = node_by_name(ctx.proto, mm_name), node_by_name(ctx.proto, pv_name)
    operands = [(mm_name, 0, "queries"), (mm_name, 1, "keys"), (pv_name, 1, "values")]
    tops = [float(np.abs(_value(ctx, node_by_name(ctx.proto, n).input[k]).astype(np.float64)).max())
            for n, k, _ in operands]
    plans = [("clip_qkv=8", [CLIP_QKV] * 3)] + [
        (f"{f:g} of each max |x|", [float(f"{t * f:.3g}") for t in tops]) for f in CLIP_FRACTIONS]

    def variants():
        for how, caps in plans:
            if all(c >= t for c, t in zip(caps, tops)) or any(c <= 0 for c in caps):
                yield None
                continue
            out = copy(ctx.proto)
            new = []
            for (name, k, what), c in zip(operands, caps):
                target = node_by_name(out, name)
                x = target.input[k]
                y = unique_name(out, f"{x}_clipped")
                clip = _clip(ctx, out, x, y, c, _value(ctx, x).dtype, unique_name(out, f"{name}_clip_{what}"))
                target.input[k] = y
                insert_nodes(out, name, [clip], [])
                new.append(clip)
            if not _toposorted(out):
                yield None
                continue
            checked = _checked(ctx, out, [mm.output[0], pv.output[0]])
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"attention at Softmax {site.node}: queries, keys and values of {mm_name} / {pv_name} clamped "
                f"({how}: ±{', ±'.join(f'{c:g}' for c in caps)}; max |x| "
                f"{', '.join(f'{t:.3g}' for t in tops)})", {"softmax": site.node, "caps": caps})

    return _counting(ctx, variants(), "qkv clipped")


# --------------------------------------------------------------------------- a norm's parameters left at init

INIT_BY_OP = {  # (op, input index) → (role, initial value)
    **{(op, 1): ("scale", 1.0) for op in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                                          "GroupNormalization", "InstanceNormalization", "BatchNormalization")},
    **{(op, 2): ("shift", 0.0) for op in ("LayerNormalization", "GroupNormalization", "InstanceNormalization",
                                          "BatchNormalization")},
    ("BatchNormalization", 3): ("mean", 0.0), ("BatchNormalization", 4): ("var", 1.0),
    ("Mul", 0): ("scale", 1.0), ("Mul", 1): ("scale", 1.0), ("Add", 0): ("shift", 0.0), ("Add", 1): ("shift", 0.0),
}
INIT_PLANS = (("every parameter", ("scale", "shift", "mean", "var")), ("the scales", ("scale",)),
              ("the shifts", ("shift",)), ("the running statistics", ("mean", "var")))


def init_sites(ctx: FileContext) -> list[Site]:
    """Norms (:func:`sweep_faults_twenty._norm_params`) with a parameter whose role is known and whose value is not
    its initialisation: ``(((node, input index, role, init), …),)``, named by the anchor."""
    sites = []
    for _, anchor, params in _norm_params(ctx):
        known = []
        for name, k in params:
            role = INIT_BY_OP.get((node_by_name(ctx.proto, name).op_type, k))
            if role is not None:
                known.append((name, k, *role))
        if any(not np.all(_param(ctx, (n, k)) == init) for n, k, _, init in known) \
                and len({n for n, *_ in known}) <= SEGMENT:
            sites.append(Site(anchor, (tuple(known),)))
    return sites


def plant_norm_at_init(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The parameters of the chosen roles set to their initial values (every one; the scales; the shifts; the
    running statistics).  Planted: the nodes whose constants changed."""
    (known,) = site.detail

    def variants():
        seen = set()
        for how, roles in INIT_PLANS:
            out, planted, changed = ctx.proto, [], []
            for name, k, role, init in known:
                old = _param(ctx, (name, k))
                if role not in roles or np.all(old == init):
                    continue
                out = _with_value(ctx, out, name, k, np.full_like(old, init))
                changed.append(f"{role} {list(old.shape)} → {init:g}")
                if name not in planted:
                    planted.append(name)
            key = tuple(changed)
            if not planted or key in seen:
                yield None
                continue
            seen.add(key)
            checked = _checked(ctx, out, [node_by_name(ctx.proto, n).output[0] for n in planted])
            yield None if checked is None else Planted(
                checked, planted, "weight-mismatch",
                f"norm at {site.node}: {how} left at initialisation ({'; '.join(changed)}: {', '.join(planted)})",
                {"norm": site.node, "roles": list(roles), "nodes": planted})

    return _counting(ctx, variants(), "norm at init")


# --------------------------------------------------------------------------- rotary applied to the values

ROTATION_DEPTH = 6


def _rotations(ctx: FileContext, dynamic: set[str]) -> dict[str, str]:
    """``{Add: t}``: named ONNX Adds of ``t·c1`` and ``u·c2`` (Muls) with u computed from t within
    ``ROTATION_DEPTH`` nodes and c1, c2 (computed or not) not computed from t — a rotation whose cos / sin are
    computed in the graph."""
    made = _producers(ctx.proto)
    found = {}
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Add" or not _onnx(n.domain) or len(n.input) != 2 or not _float_output(ctx, n):
            continue
        muls = [made.get(i) for i in n.input]
        if not all(m is not None and m.op_type == "Mul" and len(m.input) == 2 for m in muls):
            continue
        shape = ctx.values[n.output[0]].shape
        for k in (0, 1):
            for a in (0, 1):
                t, c1 = muls[k].input[a], muls[k].input[1 - a]
                tv = _value(ctx, t)
                if t not in dynamic or tv is None or tv.shape != shape:
                    continue
                for b in (0, 1):
                    u, c2 = muls[1 - k].input[b], muls[1 - k].input[1 - b]
                    near, frontier = set(), {u}
                    for _ in range(ROTATION_DEPTH):
                        frontier = {i for f in frontier if f in made for i in made[f].input if i in dynamic}
                        near |= frontier
                    if t in near and u != t and all(t not in _ancestor_tensors(ctx.proto, c, made)
                                                    for c in (c1, c2)):
                        found[n.name] = t
                        break
                if n.name in found:
                    break
            if n.name in found:
                break
    return found


CHAIN_OPS = ("Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Identity", "Cast", "Concat", "Mul", "Div")
CHAIN_DEPTH = 8


def _chain(ctx: FileContext, tensor: str, dynamic: set[str]) -> list[str]:
    """``tensor`` and the tensors it is computed from through layout nodes, one-input Concats (a cache) and
    scalings, each node with one computed input, nearest first."""
    chain = _kv_chain(ctx, tensor, dynamic)
    for _ in range(CHAIN_DEPTH):
        p = producer(ctx.proto, chain[-1])
        if p is None or not _onnx(p.domain) or not p.name or p.op_type not in CHAIN_OPS:
            break
        live = [i for i in p.input if i in dynamic]
        if len(live) != 1 or (p.op_type == "Div" and p.input[0] != live[0]):
            break
        chain.append(live[0])
    return chain


def rope_value_sites(ctx: FileContext) -> list[Site]:
    """Rotary Adds (:func:`sweep_faults_seventeen.position_sites`'s ``rotary`` sites) whose output is in the key
    chain of an attention's scores MatMul (:func:`sweep_faults_eighteen._kv_chain`), with a value tensor of the
    rotated tensor's shape and dtype in the value operand's chain: ``(rotated input, value tensor, its reader)``."""
    dynamic = _dynamic(ctx)
    rotary = {s.node: s.detail[1] for s in _rotary_candidates(ctx) if s.detail[0] == "rotary"}
    rotary.update(_rotations(ctx, dynamic))
    if not rotary:
        return []
    sites, taken = [], set()
    for s in sink_sites(ctx):
        soft = node_by_name(ctx.proto, s.node)
        mm = _scores_product(ctx, soft, dynamic)
        if mm is None:
            continue
        pv = node_by_name(ctx.proto, s.detail[1])
        ck, cv = _chain(ctx, mm.input[1], dynamic), _chain(ctx, pv.input[1], dynamic)
        for t in ck:
            p = producer(ctx.proto, t)
            if p is None or p.name not in rotary or p.name in taken:
                continue
            x = _value(ctx, rotary[p.name])
            for j in reversed(range(len(cv))):
                v = _value(ctx, cv[j])
                if v is None or cv[j] in ck or v.shape != x.shape or v.dtype != x.dtype:
                    continue
                reader = pv.name if j == 0 else producer(ctx.proto, cv[j - 1]).name
                taken.add(p.name)
                sites.append(Site(p.name, (rotary[p.name], cv[j], reader)))
                break
            break
    return sites


def plant_rope_on_values(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The rotation's float nodes (from the rotated tensor to the rotary Add) cloned onto the value tensor, the
    value chain's next node reading the clone's result.  Planted: the cloned nodes."""
    t, v, reader = site.detail
    made = _producers(ctx.proto)
    span = _block(ctx.proto, t, node_by_name(ctx.proto, site.node).output[0], made)
    cloned = [n for n in span if all(o in ctx.values and ctx.values[o].dtype.kind == "f" for o in n.output if o)]
    if not cloned or len(cloned) > SEGMENT:
        raise NoVariant(f"rope on values: {len(cloned)} rotation nodes")

    def variants():
        out = copy(ctx.proto)
        rename, new = {t: v}, []
        for n in cloned:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = unique_name(out, f"{n.name}_on_values")
            for i, x in enumerate(c.input):
                if x in rename:
                    c.input[i] = rename[x]
            for i, y in enumerate(c.output):
                if y:
                    rename[y] = unique_name(out, f"{y}_on_values")
                    c.output[i] = rename[y]
            out.graph.node.append(c)
            new.append(c)
        result = rename[node_by_name(ctx.proto, site.node).output[0]]
        if not _rewired(node_by_name(out, reader), v, result) or not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [o for o in node_by_name(ctx.proto, reader).output if o])
        yield None if checked is None else Planted(
            checked, [n.name for n in new], "attribute-mismatch",
            f"the rotary embedding of {t} (rotary Add {site.node}) applied to the values {v} "
            f"({list(_value(ctx, v).shape)}) as well: {len(new)} rotation nodes cloned, {reader} reads the rotated "
            f"values", {"rotary": site.node, "keys": t, "values": v, "reader": reader})

    return _counting(ctx, variants(), "rope on values")


# --------------------------------------------------------------------------- a position table resampled

INTERP_FACTORS = (2, 4)
GRID_MIN = 4


def _interp_rows(table: np.ndarray, axis: int, factor: float) -> np.ndarray:
    """Row i of ``table`` along ``axis`` replaced by the linear interpolation at position i / factor."""
    n = table.shape[axis]
    pos = np.arange(n) / factor
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n - 1)
    w = (pos - lo).reshape([-1 if a == axis else 1 for a in range(table.ndim)])
    t = table.astype(np.float64)
    return (np.take(t, lo, axis=axis) * (1 - w) + np.take(t, hi, axis=axis) * w).astype(table.dtype)


def _bilinear(grid: np.ndarray, size: int) -> np.ndarray:
    """A [g, g, d] grid resampled to [size, size, d] (bilinear, half-pixel centres, align_corners=False)."""
    g = grid.shape[0]

    def coords(n_out: int):
        x = np.clip((np.arange(n_out) + 0.5) * g / n_out - 0.5, 0, g - 1)
        lo = np.floor(x).astype(int)
        return lo, np.minimum(lo + 1, g - 1), x - lo

    r0, r1, rw = coords(size)
    c0, c1, cw = coords(size)
    rows = grid[r0] * (1 - rw)[:, None, None] + grid[r1] * rw[:, None, None]
    return rows[:, c0] * (1 - cw)[None, :, None] + rows[:, c1] * cw[None, :, None]


def _grid_resampled(table: np.ndarray, axis: int) -> np.ndarray | None:
    """The table's positions after a leading class row as a g × g grid (g ≥ 4) resampled to ⌈g / 2⌉ and back
    (the class row kept); None when they form no such grid."""
    n = table.shape[axis]
    for lead in (1,):
        g = math.isqrt(n - lead)
        if g >= GRID_MIN and g * g == n - lead:
            moved = np.moveaxis(table.astype(np.float64), axis, -2)
            flat = moved.reshape(-1, n, moved.shape[-1])
            res = []
            for block in flat:
                grid = block[lead:].reshape(g, g, -1)
                back = _bilinear(_bilinear(grid, (g + 1) // 2), g).reshape(g * g, -1)
                res.append(np.concatenate([block[:lead], back]))
            return np.moveaxis(np.stack(res).reshape(moved.shape), -2, axis).astype(table.dtype)
    return None


def plant_pos_interpolated(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The position table resampled: its grid (where its positions form one) through half the grid, then every row
    i read at i / 2, i / 4.  Planted: the node reading the table (a private copy where another node reads it)."""
    how, k_in, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    table = _value(ctx, source)
    axis = table.ndim - 2 if how == "add" else 0
    plans = []
    grid = _grid_resampled(table, axis) if how == "add" else None
    if grid is not None:
        plans.append((grid, f"its {math.isqrt(table.shape[axis] - 1)}-wide position grid resampled through half the "
                            f"grid and back (bilinear)"))
    for f in INTERP_FACTORS:
        plans.append((_interp_rows(table, axis, f), f"position interpolation by {f}: row i read at i / {f}"))

    def variants():
        for new, text in plans:
            out = with_own_constant(ctx.proto, site.node, k_in, np.ascontiguousarray(new), "interpolated")
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"position table {source} {list(table.shape)} ({'added' if how == 'add' else 'gathered'} by "
                f"{node.op_type} {site.node}) resampled: {text}", {"weight": source, "how": text})

    return _counting(ctx, variants(), "position table interpolated")


# --------------------------------------------------------------------------- a bidirectional RNN's directions

BIDIR_OPS = ("LSTM", "GRU", "RNN")


def bidir_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX LSTM / GRU / RNN nodes (opset ≥ 10) with ``direction="bidirectional"`` whose output Y the clean
    file computes (≥ 2 time steps): ``(direction axis, time axis, steps)``."""
    if _opset(ctx) < 10:
        return []
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in BIDIR_OPS or not _onnx(n.domain) \
                or attribute(n, "direction", "forward") != "bidirectional" or not n.output or not n.output[0] \
                or n.output[0] not in ctx.values:
            continue
        y = ctx.values[n.output[0]]
        layout = int(attribute(n, "layout", 0))
        d_axis, t_axis = (2, 1) if layout else (1, 0)
        if y.ndim != 4 or y.shape[d_axis] != 2 or y.shape[t_axis] < 2 or y.dtype.kind != "f":
            continue
        sites.append(Site(n.name, (d_axis, t_axis, int(y.shape[t_axis]))))
    return sites


def plant_rnn_bidir_merge(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """After the RNN's Y: the backward direction reversed in time (Slice forward, Slice backward, a reversing
    Slice, Concat), then the directions exchanged (one reversing Slice over the direction axis).  Planted: the
    reversing Slice (the Slices taking each direction and the Concat putting them back hand on the RNN's values
    as they are: the reversal is the fault)."""
    d_axis, t_axis, steps = site.detail
    node = node_by_name(ctx.proto, site.node)

    def unflipped(o, raw, result):
        base = f"{site.node}_bidir"
        fwd, bwd, rev = (unique_name(o, f"{raw}_{s}") for s in ("forward", "backward", "backward_unflipped"))
        return [_slice(ctx, o, raw, fwd, [0], [1], [d_axis], [1], unique_name(o, f"{base}_forward")),
                _slice(ctx, o, raw, bwd, [1], [2], [d_axis], [1], unique_name(o, f"{base}_backward")),
                _slice(ctx, o, bwd, rev, [-1], [INT_MIN], [t_axis], [-1], unique_name(o, f"{base}_time_reversed")),
                helper.make_node("Concat", [fwd, rev], [result], name=unique_name(o, f"{base}_concat"), axis=d_axis)]

    def exchanged(o, raw, result):
        return [_slice(ctx, o, raw, result, [-1], [INT_MIN], [d_axis], [-1],
                       unique_name(o, f"{site.node}_directions_exchanged"))]

    plans = [(unflipped, "the backward direction's outputs left in reversed time order (the flip back missing)"),
             (exchanged, "the two directions concatenated in the other order ([backward, forward])")]

    def variants():
        for build, text in plans:
            out, new = _after(ctx, site.node, build)
            checked = _checked(ctx, out, [node.output[0]])
            reversing = [n.name for n in new if n.name.endswith(("_time_reversed", "_directions_exchanged"))]
            yield None if checked is None else Planted(
                checked, reversing, "attribute-mismatch",
                f"bidirectional {node.op_type} {site.node} ({steps} steps, Y {list(ctx.values[node.output[0]].shape)})"
                f" merged wrongly: {text}", {"rnn": site.node, "variant": build.__name__})

    return _counting(ctx, variants(), "bidirectional merge")


# --------------------------------------------------------------------------- an activation and a pool exchanged

POOL_OPS = ("GlobalAveragePool", "GlobalMaxPool", "AveragePool", "ReduceMean", "ReduceMax")


def _act_before(ctx: FileContext, t: str, dynamic: set[str], made: dict) -> list[onnx.NodeProto] | None:
    """The largest activation computing ``t`` from one tensor of its shape: ≤ ``ACT_SPAN`` activation or
    elementwise nodes (one an activation), every computed input from inside or that tensor."""
    tv = _value(ctx, t)
    cands, seen, frontier = [], set(), [t]
    for _ in range(ACT_SPAN):
        nxt = []
        for u in frontier:
            p = made.get(u)
            if p is None or not p.name or p.op_type not in ACTIVATIONS + ACT_ARITH or not _ours(p):
                continue
            for i in p.input:
                if i in dynamic and i not in seen:
                    seen.add(i)
                    cands.append(i)
                    nxt.append(i)
        frontier = nxt
    best = None
    for x in cands:
        xv = _value(ctx, x)
        if xv is None or xv.shape != tv.shape or xv.dtype.kind != "f":
            continue
        span = _block(ctx.proto, x, t, made)
        names = {s.name for s in span}
        if not span or len(span) > ACT_SPAN or not all(s.name and s.op_type in ACTIVATIONS + ACT_ARITH and _ours(s)
                                                      for s in span) \
                or not any(s.op_type in ACTIVATIONS for s in span):
            continue
        if any(i in dynamic and i != x and (made.get(i) is None or made[i].name not in names)
               for s in span for i in s.input):
            continue
        if best is None or len(span) > len(best[1]):
            best = (x, span)
    return best


def act_pool_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX pooling nodes (:data:`POOL_OPS`, not a written-out norm's Reduce) on a computed float activation:
    ``(activation input, activation nodes)``."""
    dynamic, made, norms = _dynamic(ctx), _producers(ctx.proto), _norm_members(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in POOL_OPS or not _onnx(n.domain) or not _float_output(ctx, n) or n.name in norms \
                or not n.input or n.input[0] not in dynamic or n.input[0] not in ctx.values:
            continue
        found = _act_before(ctx, n.input[0], dynamic, made)
        if found is None:
            continue
        x, span = found
        if len(span) + 1 <= SEGMENT:
            sites.append(Site(n.name, (x, tuple(s.name for s in span))))
    return sites


def plant_act_pool_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The pool reads the activation's input; the activation's nodes, cloned, run on the pool's output (its readers
    read theirs).  Planted: the pool and the cloned nodes."""
    x, span_names = site.detail
    pool = node_by_name(ctx.proto, site.node)
    a = pool.input[0]
    span = [node_by_name(ctx.proto, s) for s in span_names]

    def build(o, raw, result):
        rename, new = {x: raw}, []
        for n in span:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = unique_name(o, f"{n.name}_after_pool")
            for i, t in enumerate(c.input):
                if t in rename:
                    c.input[i] = rename[t]
            for i, y in enumerate(c.output):
                if y:
                    rename[y] = result if y == a else unique_name(o, f"{y}_after_pool")
                    c.output[i] = rename[y]
            new.append(c)
        return new

    def variants():
        out, new = _after(ctx, site.node, build)
        node_by_name(out, site.node).input[0] = x
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [pool.output[0]])
        yield None if checked is None else Planted(
            checked, [site.node] + [n.name for n in new], "attribute-mismatch",
            f"{pool.op_type} {site.node} ({list(_value(ctx, a).shape)} → {list(ctx.values[pool.output[0]].shape)}) "
            f"and the activation before it ({', '.join(s.op_type for s in span)}) applied in the other order: "
            f"act(pool(x)) for pool(act(x))", {"pool": site.node, "activation": list(span_names)})

    return _counting(ctx, variants(), "activation and pool exchanged")


# --------------------------------------------------------------------------- a strided 1 × 1 Conv as avg_down

def avg_down_sites(ctx: FileContext) -> list[Site]:
    """Named Conv / FusedConv nodes with a constant 1-wide kernel on every spatial axis (one or two), no padding,
    dilation 1 and a stride > 1 on some axis of ≥ 2 input entries: ``(strides,)``."""
    sites = []
    for n, w in _convs(ctx):
        x = _value(ctx, n.input[0])
        spatial = w.ndim - 2
        if x is None or x.ndim != w.ndim or spatial not in (1, 2) or any(k != 1 for k in w.shape[2:]):
            continue
        strides = list(attribute(n, "strides", [1] * spatial))
        pads = list(attribute(n, "pads", [0] * 2 * spatial))
        if any(pads) or attribute(n, "auto_pad", "NOTSET") not in ("NOTSET", "VALID") \
                or any(d != 1 for d in attribute(n, "dilations", [1] * spatial)):
            continue
        if any(s > 1 and x.shape[2 + i] >= 2 for i, s in enumerate(strides)):
            sites.append(Site(n.name, (tuple(int(s) for s in strides),)))
    return sites


def plant_avg_down(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An AveragePool (kernel = stride = the Conv's strides, ceil_mode 1, count_include_pad 0) inserted on the Conv's
    input and the Conv's strides set to 1.  Planted: the AveragePool and the Conv."""
    (strides,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = node.input[0]

    def variants():
        out = copy(ctx.proto)
        conv = node_by_name(out, site.node)
        pooled = unique_name(out, f"{x}_avg_down")
        attrs = {"kernel_shape": list(strides), "strides": list(strides), "ceil_mode": 1}
        if _opset(ctx) >= 7:
            attrs["count_include_pad"] = 0
        if _opset(ctx) < 10:
            attrs.pop("ceil_mode")
        pool = helper.make_node("AveragePool", [x], [pooled], name=unique_name(out, f"{site.node}_avg_down"), **attrs)
        conv.input[0] = pooled
        set_attr(conv, "strides", [1] * len(strides))
        insert_nodes(out, site.node, [pool], [])
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [pool.name, site.node], "attribute-mismatch",
            f"{node.op_type} {site.node} (1 × 1 kernel, strides {list(strides)}, input {list(_value(ctx, x).shape)})"
            f" downsampling by an average pool (ResNet-D avg_down): an AveragePool {list(strides)} inserted on its "
            f"input, its strides set to 1", {"conv": site.node, "strides": list(strides)})

    return _counting(ctx, variants(), "avg down")


KINDS = (
    FaultKind("attn-window", window_sites, plant_attn_window, "attribute-mismatch",
              "an attention given a sliding-window (local) mask it does not have (sliding_window read as set)",
              max_tries=40),
    FaultKind("qkv-clipped", qkv_clip_sites, plant_qkv_clipped, "attribute-mismatch",
              "queries, keys and values clamped to ±c before the attention (DBRX / OLMo clip_qkv carried over)",
              max_tries=40),
    FaultKind("norm-at-init", init_sites, plant_norm_at_init, "weight-mismatch",
              "a norm's parameters left at their initialisation (gamma / beta keys not loaded, strict=False)",
              max_tries=40),
    FaultKind("rope-on-values", rope_value_sites, plant_rope_on_values, "attribute-mismatch",
              "the rotary embedding applied to the values as well as the queries and keys", max_tries=40),
    FaultKind("pos-interpolated", _table_sites, plant_pos_interpolated, "weight-mismatch",
              "a learned position table resampled (position interpolation, a ViT grid through a coarser one)",
              max_tries=40),
    FaultKind("rnn-bidir-merge", bidir_sites, plant_rnn_bidir_merge, "attribute-mismatch",
              "a bidirectional RNN's directions merged wrongly: the backward outputs not flipped back, or "
              "[backward, forward]", max_tries=40),
    FaultKind("act-pool-order", act_pool_sites, plant_act_pool_order, "attribute-mismatch",
              "an activation and the pooling after it applied in the other order: act(pool(x)) for pool(act(x))",
              max_tries=40),
    FaultKind("avg-down", avg_down_sites, plant_avg_down, "attribute-mismatch",
              "a strided 1 × 1 Conv's subsampling done by an average pool (ResNet-D avg_down) where it is not",
              max_tries=40),
)
