"""The twentieth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a hand-written port's, a converter's, a checkpoint loader's or a deployment's mistake the earlier
sets never planted:

* ``logit-softcap`` — logits soft-capped where the model does not cap them (a Gemma 2 port's
  ``attn_logit_softcapping`` / ``final_logit_softcapping`` carried into another model, a config default read as
  set): ``c · tanh(x / c)`` inserted on an attention's scores (before an attention Softmax,
  :func:`sweep_faults_nineteen.sink_sites`) or on a logits output (a graph output a layer writes,
  :func:`sweep_faults_eighteen.output_sites`), the cap Gemma 2's (50 on scores, 30 on logits), then max|x|, max|x| / 2,
  max|x| / 4 (a mask's fill, |x| ≥ 1e4, left out of the maximum).  ``clip-bounds`` narrows an existing Clip, ``output-activation`` appends a Softmax / Sigmoid,
  ``scale-constant`` changes a scalar.  Expected ``attribute-mismatch``.
* ``token-pool`` — a sequence pooled in the other convention (timm's ``global_pool='token'`` ↔ ``'avg'``,
  sentence-transformers' CLS ↔ mean pooling, a classifier on a decoder's last token): the first (or last) token taken
  from a rank-3 float activation (a Gather of a scalar index 0 / −1 on axis 1, a Slice of one such position; the
  activation read by no other Gather / Slice / Split, so not one step of an unrolled loop) becomes a mean (then a max)
  over that axis; a ReduceMean over one non-batch axis of a rank-3 activation (not a norm's)
  becomes the first (then the last) position.  The node is replaced under its own name.  ``gather-index`` moves an
  index, ``reduce-kind`` changes a Reduce's kind, ``pool-mode`` exchanges Max / Average pools.  Expected
  ``attribute-mismatch``.
* ``norm-reused`` — a normalisation computed with another norm's parameters (a port calling ``self.norm1`` where
  ``self.norm2`` was meant, a loader mapping ``ln_1`` / ``ln_2`` or ``attn_norm`` / ``ffn_norm`` keys wrongly, a
  BatchNorm module reused with its running statistics): every float parameter of a norm (a norm node's scale, bias,
  mean and variance; an InstanceNormalization's affine Mul / Add after it, GroupNorm exported; a written-out norm's
  weight Mul and bias Add, :func:`sweep_faults_seventeen._written_norms`) replaced by the corresponding one of the
  nearest other norm (previous, then next) whose parameters have the same shapes and other values.
  ``weights-exchanged`` exchanges two product weights, ``vector-collapsed`` replaces a vector by its mean,
  ``norm-affine`` exchanges a norm's own scale and bias.  Expected ``weight-mismatch``.
* ``qk-normed`` — queries and keys normalised per head where the model does not (a QK-norm model's port —
  OLMo 2, Qwen 3, ViT-22B — applied to a plain attention, ``qk_layernorm`` read as set, Swin V2's cosine attention
  for Swin V1's dot product): both operands of an attention's scores MatMul (found from the Softmax through single-
  input nodes) normalised along the contracted axis — an RMS normalisation with a unit weight (``x · √d / ‖x‖``:
  ReduceL2, Max with 1e-6, Div, Mul), then an L2 normalisation (cosine similarity).  ``norm-*`` kinds change
  existing norms, ``scale-constant`` a scalar.  Expected ``attribute-mismatch``.
* ``embed-maxnorm`` — embedding lookups renormalised (``nn.Embedding(max_norm=…)`` in a port where the model has
  none, a Keras ``max_norm`` constraint carried over): after a Gather from a constant float 2-D table, rows longer
  than m scaled to length m (``e · min(1, m / (‖e‖ + 1e-7))``: ReduceL2, Add, Div, Min, Mul), m = 1, then the median
  and half the median of the looked-up rows' norms.  ``embed-scale`` multiplies every embedding by √d,
  ``vocab-swap`` exchanges rows, ``channel-pruned`` zeroes one.  Expected ``attribute-mismatch`` (``weight-mismatch``
  also accepted: a table renormalised in place reads the same).
* ``droppath-scaled`` — a residual branch scaled by its survival probability at inference (stochastic depth in the
  original, non-inverted convention — Huang et al.'s test-time ``p_l · f(x)`` — for a model trained with timm's
  inverted DropPath, or drop_connect scaling kept in an export): an Add of two computed float tensors of one shape
  where one (the branch) is computed from the other (the skip) through a layer, not by a gate of the skip itself:
  a Mul by 1 − p inserted on the branch, p = 0.1, 0.2, 0.3, 0.5.  ``residual-rescaled`` scales the sum,
  ``dropout-active`` masks the branch, ``residual-dropped`` drops it.  Expected ``attribute-mismatch``.
* ``antialias-blur`` — a strided convolution given an anti-aliasing blur it does not have (an antialiased-cnns /
  timm ``aa_layer`` / BlurPool model's code used for a plain checkpoint, or the other way round): a depthwise
  binomial low-pass ([1, 2, 1] / 4, then [1, 3, 3, 1] / 8, along each strided axis, zero padded to keep the shape)
  inserted on the input of a Conv (ONNX, or com.microsoft FusedConv) with a constant kernel, a stride > 1 and one
  or two spatial axes.  ``kernel-flip``, ``kernel-standardized`` change a kernel, ``pool-window`` a pool, ``stride-
  moved`` moves a stride.  Expected ``attribute-mismatch``.
* ``router-renorm`` — a mixture-of-experts router's top-k weights normalised in the other convention
  (``norm_topk_prob``: Mixtral / DeepSeek renormalise the top-k probabilities, Qwen2-MoE / OLMoE / Switch do not;
  a config flag read wrong, a port of one router into the other model): after a TopK over the last axis of a
  router's probabilities (a Softmax or Sigmoid, through Casts), the values renormalised (ReduceSum, Div inserted,
  every reader rewired) where they are not, or the renormalising Div (by a ReduceSum of the values) made an
  Identity where they are.  ``topk-attr`` changes a TopK's attributes, ``softmax-unnormalised`` drops a Softmax's
  normalisation.  Expected ``attribute-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.  A planted file whose edits read a tensor made later in the node list is
re-sorted (:func:`sweep_faults_seventeen._toposorted`), so that it stays topologically sorted.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the inserted Div, Tanh and Mul; the
replaced pooling node; the norm nodes, affine Muls and Adds whose constants changed; the inserted normalisation nodes
(four per operand, three for the cosine variant); the five inserted renormalisation nodes; the inserted Mul; the
inserted blur Conv; the inserted ReduceSum and Div, or the Div made an Identity.  Sites with more than 12 are
refused.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, folded,
                          insert_nodes, is_float_array, node_by_name, producer, readers, replace_node, unique_name)
from sweep_faults_eighteen import _rewired, output_sites
from sweep_faults_nine import _onnx
from sweep_faults_nineteen import _convs, _with_value, sink_sites
from sweep_faults_ops import _opset
from sweep_faults_seventeen import NORM_NODES, _single_norm, _sole_readers, _toposorted, _written_norms
from sweep_faults_sixteen import SEGMENT
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting, _norm_axis, _residual_root
from sweep_faults_twelve import _float_output

PASS = ("Cast", "Identity")


def _reduce(ctx: FileContext, out: onnx.ModelProto, op: str, x: str, result: str, axes: list[int], keepdims: int,
            name: str) -> onnx.NodeProto:
    """A Reduce node over ``axes`` in the file's opset (axes an input from opset 18, ReduceSum's from 13)."""
    if _opset(ctx) >= 18 or (op == "ReduceSum" and _opset(ctx) >= 13):
        c = _add_constant(out, f"{name}_axes", np.array(axes, np.int64))
        return helper.make_node(op, [x, c], [result], name=name, keepdims=keepdims)
    return helper.make_node(op, [x], [result], name=name, axes=list(axes), keepdims=keepdims)


def _reduce_axes(ctx: FileContext, n: onnx.NodeProto, rank: int) -> list[int] | None:
    axes = attribute(n, "axes")
    if axes is None and len(n.input) > 1 and n.input[1]:
        axes = constant(ctx.proto, n.input[1])
    if axes is None:
        return None
    return sorted(int(a) % rank for a in np.atleast_1d(axes))


def _through(ctx: FileContext, tensor: str) -> onnx.NodeProto | None:
    """The node computing ``tensor``, looking through Casts and Identities."""
    p = producer(ctx.proto, tensor)
    for _ in range(4):
        if p is None or p.op_type not in PASS or not p.input:
            return p
        p = producer(ctx.proto, p.input[0])
    return p


# --------------------------------------------------------------------------- logits soft-capped

SOFTCAPS = {"scores": 50.0, "logits": 30.0}  # Gemma 2's attn_logit_softcapping, final_logit_softcapping
CAP_FRACTIONS = (1.0, 0.5, 0.25)
MASK_LIMIT = 1e4  # |x| at or above it: a masking value, left out of max|x|


def softcap_sites(ctx: FileContext) -> list[Site]:
    """Attention Softmaxes (:func:`sweep_faults_nineteen.sink_sites`): ``("scores", softmax)``; logits outputs
    (:func:`sweep_faults_eighteen.output_sites`): ``("logits", output)``, named by their writer."""
    sites = [Site(s.node, ("scores", s.node)) for s in sink_sites(ctx)]
    return sites + [Site(s.node, ("logits", s.detail[0])) for s in output_sites(ctx)]


def _cap_nodes(out: onnx.ModelProto, x: str, result: str, cap: float, dtype, base: str) -> list[onnx.NodeProto]:
    c = _add_constant(out, f"{base}_softcap", np.array(cap, dtype))
    scaled, squashed = unique_name(out, f"{x}_over_cap"), unique_name(out, f"{x}_squashed")
    return [helper.make_node("Div", [x, c], [scaled], name=unique_name(out, f"{base}_softcap_div")),
            helper.make_node("Tanh", [scaled], [squashed], name=unique_name(out, f"{base}_softcap_tanh")),
            helper.make_node("Mul", [squashed, c], [result], name=unique_name(out, f"{base}_softcap_mul"))]


def plant_logit_softcap(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """``c · tanh(x / c)`` inserted on the Softmax's input (scores) or written to the output (its writer writes a
    new tensor its other readers read).  Planted: the Div, Tanh and Mul."""
    where, target = site.detail
    if where == "scores":
        x = node_by_name(ctx.proto, target).input[0]
    else:
        x = target
    v = _value(ctx, x)
    if v is None or v.dtype.kind != "f" or not v.size:
        raise NoVariant("soft cap: no float value")
    a = np.abs(v.astype(np.float64))
    a = a[np.isfinite(a) & (a < MASK_LIMIT)]  # a mask's fill (-1e4, finfo.min, -inf) is no logit
    m = float(a.max()) if a.size else 0.0
    if m <= 0:
        raise NoVariant("soft cap: the values are all zero, masked or not finite")
    caps = [SOFTCAPS[where]] + [float(f"{m * f:.3g}") for f in CAP_FRACTIONS]

    def variants():
        for cap in caps:
            out = copy(ctx.proto)
            if where == "scores":
                soft = node_by_name(out, target)
                capped = unique_name(out, f"{x}_capped")
                new = _cap_nodes(out, x, capped, cap, v.dtype, target)
                soft.input[0] = capped
                insert_nodes(out, target, new, [])
                watch = [soft.output[0]]
            else:
                raw = unique_name(out, f"{x}_uncapped")
                writer = node_by_name(out, site.node)
                for i, t in enumerate(writer.output):
                    if t == x:
                        writer.output[i] = raw
                for r in readers(out, x):
                    _rewired(r, x, raw)
                new = _cap_nodes(out, raw, x, cap, v.dtype, site.node)
                insert_nodes(out, site.node, [], new)
                watch = [x]
            if not _toposorted(out):
                yield None
                continue
            checked = _checked(ctx, out, watch)
            what = f"attention scores of Softmax {target}" if where == "scores" else f"logits output {x}"
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"{what} ({list(v.shape)}, max |x| {m:.3g}) soft-capped: {cap:g} · tanh(x / {cap:g}) inserted",
                {"where": where, "target": target, "cap": cap})

    return _counting(ctx, variants(), "logit soft cap")


# --------------------------------------------------------------------------- a sequence pooled the other way

def _norm_members(ctx: FileContext) -> set[str]:
    return {name for _, _, span in _written_norms(ctx) for name in span}


def pool_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX nodes on a computed rank-3 float activation with ≥ 2 entries on the pooled axis: a Gather of a
    scalar constant index (first or last) on axis 1 or a Slice of one such position on axis 1: ``("token", 1,
    keepdims, position)``, the tensor read by no other Gather / Slice / Split (not one step of an unrolled loop); a
    ReduceMean over one axis (1 or 2), not a written-out norm's nor of a square:
    ``("mean", axis, keepdims, "")``."""
    dynamic, norms = _dynamic(ctx), None
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("Gather", "Slice", "ReduceMean") or not _onnx(n.domain) or not _float_output(ctx, n) \
                or not n.input or n.input[0] not in dynamic:
            continue
        x, y = _value(ctx, n.input[0]), ctx.values[n.output[0]]
        if x is None or x.ndim != 3:
            continue
        if n.op_type in ("Gather", "Slice") and any(r.op_type in ("Gather", "Slice", "Split") and r.name != n.name
                                                    for r in readers(ctx.proto, n.input[0])):
            continue  # one step of an unrolled loop or a chunk, not a pooled token
        if n.op_type == "Gather":
            idx = constant(ctx.proto, n.input[1])
            if _norm_axis(int(attribute(n, "axis", 0)), 3) != 1 or idx is None or idx.ndim != 0 or x.shape[1] < 2:
                continue
            pos = int(idx) % x.shape[1]
            if pos in (0, x.shape[1] - 1):
                sites.append(Site(n.name, ("token", 1, 0, "first" if pos == 0 else "last")))
        elif n.op_type == "Slice":
            if y.ndim != 3 or y.shape[1] != 1 or x.shape[1] < 2 or y.shape[0] != x.shape[0] or y.shape[2] != x.shape[2]:
                continue
            if np.array_equal(y, x[:, :1]):
                sites.append(Site(n.name, ("token", 1, 1, "first")))
            elif np.array_equal(y, x[:, -1:]):
                sites.append(Site(n.name, ("token", 1, 1, "last")))
        else:
            axes = _reduce_axes(ctx, n, 3)
            if axes is None or len(axes) != 1 or axes[0] == 0 or x.shape[axes[0]] < 2:
                continue
            p = producer(ctx.proto, n.input[0])
            if p is not None and (p.op_type == "Pow" or (p.op_type == "Mul" and p.input[0] == p.input[1])):
                continue
            if norms is None:
                norms = _norm_members(ctx)
            if n.name in norms:
                continue
            sites.append(Site(n.name, ("mean", axes[0], int(attribute(n, "keepdims", 1)), "")))
    return sites


def plant_token_pool(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node replaced, under its name, by a ReduceMean (then a ReduceMax) over the axis (a token taken), or by a
    Gather of the first (then the last) position (a mean taken).  Planted: the node."""
    kind, axis, keep, pos = site.detail
    node = node_by_name(ctx.proto, site.node)
    x, y = node.input[0], node.output[0]
    size = _value(ctx, x).shape[axis]
    if kind == "token":
        plans = [("ReduceMean", "mean"), ("ReduceMax", "max")]
    else:
        plans = [("Gather", 0), ("Gather", size - 1)]

    def variants():
        for op, how in plans:
            out = copy(ctx.proto)
            if op == "Gather":
                idx = _add_constant(out, f"{site.node}_token", np.array([how] if keep else how, np.int64))
                new = helper.make_node("Gather", [x, idx], [y], name=site.node, axis=axis)
            else:
                new = _reduce(ctx, out, op, x, y, [axis], keep, site.node)
            replace_node(out, site.node, [new])
            checked = _checked(ctx, out, [y])
            if kind == "token":
                text = f"the {pos} token ({node.op_type}) replaced by a {how} over axis {axis} ({size} entries)"
            else:
                text = (f"a mean over axis {axis} ({size} entries) replaced by the "
                        f"{'first' if how == 0 else 'last'} position")
            yield None if checked is None else Planted(
                checked, [site.node], "attribute-mismatch",
                f"sequence pooling {site.node} ({list(_value(ctx, x).shape)} → {list(ctx.values[y].shape)}) in the "
                f"other convention: {text}", {"node": site.node, "was": kind, "now": op, "axis": axis})

    return _counting(ctx, variants(), "token pool")


# --------------------------------------------------------------------------- a norm run with another norm's parameters

AFFINE_AFTER = ("InstanceNormalization",)  # GroupNorm exported as InstanceNorm + Reshape + Mul + Add


def _affine_after(ctx: FileContext, tensor: str) -> list[tuple[str, int]]:
    """``(node, input index)`` of the per-channel Mul and Add (constant float vectors) after an
    InstanceNormalization (through a Reshape that alone reads it)."""
    found, t = [], tensor
    after = _sole_readers(ctx, t)
    if len(after) == 1 and after[0].op_type == "Reshape" and _onnx(after[0].domain):
        t = after[0].output[0]
        after = _sole_readers(ctx, t)
    for op in ("Mul", "Add"):
        if len(after) != 1 or after[0].op_type != op or not after[0].name or not _onnx(after[0].domain) \
                or len(after[0].input) != 2:
            break
        a = after[0]
        k = 1 - list(a.input).index(t) if t in a.input else -1
        c = constant(ctx.proto, a.input[k]) if k >= 0 else None
        if not is_float_array(c) or c.size < 2:
            break
        found.append((a.name, k))
        t = a.output[0]
        after = _sole_readers(ctx, t)
    return found


def _norm_params(ctx: FileContext) -> list[tuple[int, str, tuple]]:
    """``(position, anchor, ((node, input index), …))`` of every norm with float parameters of ≥ 2 entries: single
    norm nodes (their inputs after the first; an InstanceNormalization's affine after it) and written-out norms (their
    weight Mul and bias Add), in node order."""
    order = {n.name: i for i, n in enumerate(ctx.proto.graph.node) if n.name}
    dynamic = _dynamic(ctx)
    found = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in NORM_NODES or not _single_norm(ctx, n) or n.input[0] not in dynamic:
            continue
        params = []
        for k in range(1, len(n.input)):
            v = folded(ctx, n.input[k]) if n.input[k] else None
            if is_float_array(v) and v.size >= 2:
                params.append((n.name, k))
        if n.op_type in AFFINE_AFTER:
            params += _affine_after(ctx, n.output[0])
        if params:
            found.append((order[n.name], n.name, tuple(params)))
    for _, _, span in _written_norms(ctx):
        params = []
        for name in span:
            s = node_by_name(ctx.proto, name)
            if s.op_type not in ("Mul", "Add") or len(s.input) != 2:
                continue
            for k in (0, 1):
                c = constant(ctx.proto, s.input[k])
                if is_float_array(c) and c.size >= 2:
                    params.append((name, k))
        if params:
            found.append((min(order[s] for s in span), span[0], tuple(params)))
    return sorted(found)


def _param(ctx: FileContext, ref: tuple[str, int]) -> np.ndarray:
    return folded(ctx, node_by_name(ctx.proto, ref[0]).input[ref[1]])


def reused_sites(ctx: FileContext) -> list[Site]:
    """Norms (:func:`_norm_params`) with another norm whose parameters have the same shapes and dtypes and other
    values: ``(own params, (the nearest previous such norm's params, the nearest next's))``, named by the anchor."""
    norms = _norm_params(ctx)
    sig = [tuple((_param(ctx, r).shape, _param(ctx, r).dtype.str) for r in params) for _, _, params in norms]
    sites = []
    for i, (_, anchor, params) in enumerate(norms):
        own = [_param(ctx, r) for r in params]
        if sum(1 for _, _, p in norms if p == params) > 1:
            continue
        partners = []
        for j in sorted((j for j in range(len(norms)) if j != i and sig[j] == sig[i]),
                        key=lambda j: (abs(j - i), j > i)):
            other = [_param(ctx, r) for r in norms[j][2]]
            if any(not np.array_equal(a, b) for a, b in zip(own, other)):
                partners.append(norms[j][2])
            if len(partners) == 2:
                break
        if partners and len({r[0] for r in params}) <= SEGMENT:
            sites.append(Site(anchor, (params, tuple(partners))))
    return sites


def plant_norm_reused(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Each parameter of the norm replaced by the partner norm's (nearest first).  Planted: the nodes whose
    constants changed."""
    params, partners = site.detail
    own = [_param(ctx, r) for r in params]

    def variants():
        for partner in partners:
            out, planted = ctx.proto, []
            for (name, k), old, src in zip(params, own, partner):
                value = _param(ctx, src)
                if np.array_equal(value, old):
                    continue
                out = _with_value(ctx, out, name, k, value)
                if name not in planted:
                    planted.append(name)
            checked = _checked(ctx, out, [node_by_name(ctx.proto, n).output[0] for n in planted])
            yield None if checked is None else Planted(
                checked, planted, "weight-mismatch",
                f"norm at {site.node} computed with the parameters of the norm at {partner[0][0]} "
                f"({', '.join(f'{list(v.shape)}' for v in own)}: {', '.join(planted)} changed)",
                {"norm": site.node, "reused": partner[0][0], "nodes": planted})

    return _counting(ctx, variants(), "norm reused")


# --------------------------------------------------------------------------- queries and keys normalised

QK_EPS = 1e-6
SCORE_DEPTH = 8


def _scores_product(ctx: FileContext, soft: onnx.NodeProto, dynamic: set[str]) -> onnx.NodeProto | None:
    """The ONNX MatMul of two computed tensors the Softmax's input comes from through nodes with one computed
    input."""
    t = soft.input[0]
    for _ in range(SCORE_DEPTH):
        p = producer(ctx.proto, t)
        if p is None or not _onnx(p.domain):
            return None
        if p.op_type == "MatMul" and len(p.input) == 2 and all(i in dynamic for i in p.input):
            return p if p.name else None
        live = [i for i in p.input if i in dynamic]
        if len(live) != 1:
            return None
        t = live[0]
    return None


def qk_sites(ctx: FileContext) -> list[Site]:
    """Attention Softmaxes (:func:`sweep_faults_nineteen.sink_sites`) whose scores come from a MatMul of queries
    ``(…, S, d)`` and keys ``(…, d, S)``, d ≥ 2: ``(matmul, d)``, named by the Softmax."""
    dynamic = _dynamic(ctx)
    sites = []
    for s in sink_sites(ctx):
        mm = _scores_product(ctx, node_by_name(ctx.proto, s.node), dynamic)
        if mm is None:
            continue
        q, k = _value(ctx, mm.input[0]), _value(ctx, mm.input[1])
        if q is None or k is None or q.ndim < 2 or k.ndim < 2 or q.dtype.kind != "f" or q.shape[-1] != k.shape[-2] \
                or q.shape[-1] < 2:
            continue
        sites.append(Site(s.node, (mm.name, int(q.shape[-1]))))
    return sites


def plant_qk_normed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Both operands of the scores MatMul normalised along the contracted axis: ``x · √d / max(‖x‖, 1e-6)`` (an RMS
    norm with a unit weight), then ``x / max(‖x‖, 1e-6)`` (cosine).  Planted: the inserted nodes."""
    mm_name, d = site.detail

    def variants():
        for rms in (True, False):
            out = copy(ctx.proto)
            mm = node_by_name(out, mm_name)
            new = []
            for idx, axis in ((0, -1), (1, -2)):
                x = mm.input[idx]
                v = _value(ctx, x)
                base = f"{mm_name}_{'q' if idx == 0 else 'k'}norm"
                norm, safe = unique_name(out, f"{x}_l2"), unique_name(out, f"{x}_l2_safe")
                unit = unique_name(out, f"{x}_unit")
                eps = _add_constant(out, f"{base}_eps", np.array(QK_EPS, v.dtype))
                new += [_reduce(ctx, out, "ReduceL2", x, norm, [axis % v.ndim], 1, unique_name(out, f"{base}_l2")),
                        helper.make_node("Max", [norm, eps], [safe], name=unique_name(out, f"{base}_floor")),
                        helper.make_node("Div", [x, safe], [unit], name=unique_name(out, f"{base}_div"))]
                if rms:
                    scaled = unique_name(out, f"{x}_rms")
                    c = _add_constant(out, f"{base}_sqrt_d", np.array(math.sqrt(d), v.dtype))
                    new.append(helper.make_node("Mul", [unit, c], [scaled], name=unique_name(out, f"{base}_scale")))
                    unit = scaled
                mm.input[idx] = unit
            insert_nodes(out, mm_name, new, [])
            checked = _checked(ctx, out, [mm.output[0]])
            how = "RMS-normalised (unit weight, QK-norm)" if rms else "L2-normalised (cosine attention)"
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"attention at Softmax {site.node}: queries and keys of {mm_name} (head size {d}) {how} before the "
                f"scores", {"softmax": site.node, "scores": mm_name, "rms": rms})

    return _counting(ctx, variants(), "qk normed")


# --------------------------------------------------------------------------- embedding lookups renormalised

MAXNORM_EPS = 1e-7  # PyTorch's embedding_renorm_


def maxnorm_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Gathers (axis 0) from a constant float 2-D table (≥ 2 rows, ≥ 2 columns) with a float output the
    clean file computes and looked-up rows not all zero: ``(row norms of the looked-up rows, sorted)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Gather" or not _onnx(n.domain) or int(attribute(n, "axis", 0)) != 0 \
                or not _float_output(ctx, n):
            continue
        table = constant(ctx.proto, n.input[0])
        idx = _value(ctx, n.input[1])
        if not is_float_array(table) or table.ndim != 2 or table.shape[0] < 2 or table.shape[1] < 2 or idx is None \
                or idx.dtype.kind not in "iu" or not idx.size:
            continue
        rows = np.unique(idx.reshape(-1) % table.shape[0])
        norms = np.sort(np.linalg.norm(table[rows].astype(np.float64), axis=1))
        if norms[-1] > 0:
            sites.append(Site(n.name, (tuple(float(x) for x in norms),)))
    return sites


def plant_embed_maxnorm(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """After the Gather: ``e · min(1, m / (‖e‖ + 1e-7))`` over the last axis (ReduceL2, Add, Div, Min, Mul), m = 1,
    then the median and half the median of the looked-up rows' norms (those below the longest).  Planted: the five
    inserted nodes."""
    (norms,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    y = ctx.values[node.output[0]]
    top, median = norms[-1], float(np.median(norms))
    limits = [m for m in (1.0, float(f"{median:.3g}"), float(f"{median / 2:.3g}")) if 0 < m < top]
    if not limits:
        raise NoVariant("embedding max norm: every looked-up row is shorter than each limit")

    def variants():
        for m in limits:
            def build(o, raw, result, m=m):
                base = f"{site.node}_max_norm"
                norm, padded, ratio, scale = (unique_name(o, f"{raw}_{s}") for s in ("norm", "norm_eps", "ratio",
                                                                                      "scale"))
                eps = _add_constant(o, f"{base}_eps", np.array(MAXNORM_EPS, y.dtype))
                limit = _add_constant(o, f"{base}_limit", np.array(m, y.dtype))
                one = _add_constant(o, f"{base}_one", np.array(1.0, y.dtype))
                return [_reduce(ctx, o, "ReduceL2", raw, norm, [y.ndim - 1], 1, unique_name(o, f"{base}_l2")),
                        helper.make_node("Add", [norm, eps], [padded], name=unique_name(o, f"{base}_eps_add")),
                        helper.make_node("Div", [limit, padded], [ratio], name=unique_name(o, f"{base}_ratio")),
                        helper.make_node("Min", [ratio, one], [scale], name=unique_name(o, f"{base}_min")),
                        helper.make_node("Mul", [raw, scale], [result], name=unique_name(o, f"{base}_mul"))]

            out, new = _after(ctx, site.node, build)
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"embedding lookup {site.node} ({list(y.shape)}) renormalised with max_norm={m:g} (looked-up rows' "
                f"norms {norms[0]:.3g}–{top:.3g}, median {median:.3g})",
                {"gather": site.node, "max_norm": m, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "embedding max norm")


# --------------------------------------------------------------------------- a residual branch scaled by its survival

DROP_RATES = (0.1, 0.2, 0.3, 0.5)


def _ancestors(made: dict, tensor: str) -> set[str]:
    seen, stack = set(), [tensor]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        p = made.get(t)
        if p is not None:
            stack += [i for i in p.input if i]
    return seen


def droppath_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Adds of two computed float tensors of the output's shape where one (the branch, written by a named
    node) is computed from the other (the skip) and not the other way round, not by a gate of the skip itself:
    ``(branch input index,)``."""
    dynamic = _dynamic(ctx)
    made = {o: n for n in ctx.proto.graph.node for o in n.output if o}
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Add" or not _onnx(n.domain) or len(n.input) != 2 or n.input[0] == n.input[1] \
                or not all(i in dynamic for i in n.input) or not _float_output(ctx, n):
            continue
        shape = ctx.values[n.output[0]].shape
        vals = [_value(ctx, i) for i in n.input]
        if any(v is None or v.shape != shape or not np.any(v) for v in vals):
            continue
        anc = [_ancestors(made, i) for i in n.input]
        for b in (0, 1):
            skip, branch = n.input[1 - b], n.input[b]
            if skip in anc[b] and branch not in anc[1 - b] and branch in made and made[branch].name \
                    and not _residual_root(ctx, skip, branch):
                sites.append(Site(n.name, (b,)))
                break
    return sites


def plant_droppath_scaled(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by 1 − p inserted on the branch operand of the Add (p = 0.1, 0.2, 0.3, 0.5).  Planted: the Mul."""
    (b,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    branch = node.input[b]
    dtype = ctx.values[node.output[0]].dtype

    def variants():
        for p in DROP_RATES:
            out = copy(ctx.proto)
            add = node_by_name(out, site.node)
            c = _add_constant(out, f"{site.node}_survival", np.array(1 - p, dtype))
            kept = unique_name(out, f"{branch}_survival_scaled")
            mul = helper.make_node("Mul", [branch, c], [kept], name=unique_name(out, f"{site.node}_drop_path"))
            add.input[b] = kept
            insert_nodes(out, site.node, [mul], [])
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [mul.name], "attribute-mismatch",
                f"residual Add {site.node} ({list(ctx.values[node.output[0]].shape)}): its branch {branch} scaled by "
                f"the survival probability {1 - p:g} at inference (non-inverted stochastic depth, drop rate {p:g})",
                {"add": site.node, "branch": branch, "p": p})

    return _counting(ctx, variants(), "drop path scaled")


# --------------------------------------------------------------------------- an anti-aliasing blur before a strided Conv

BLURS = ((np.array([1.0, 2.0, 1.0]) / 4, (1, 1)), (np.array([1.0, 3.0, 3.0, 1.0]) / 8, (1, 2)))


def _taps(taps: np.ndarray) -> str:
    total = 4 if taps.size == 3 else 8
    return f"{[int(round(t * total)) for t in taps]} / {total}"


def blur_sites(ctx: FileContext) -> list[Site]:
    """Named Conv / FusedConv nodes (constant float kernel, computed input) with one or two spatial axes and a
    stride > 1 on an axis of ≥ 3 input entries: ``(strided axes,)``."""
    sites = []
    for n, w in _convs(ctx):
        x = _value(ctx, n.input[0])
        if x is None or x.ndim not in (3, 4) or w.ndim != x.ndim:
            continue
        strides = list(attribute(n, "strides", [1] * (x.ndim - 2)))
        axes = tuple(i for i, s in enumerate(strides) if s > 1 and x.shape[2 + i] >= 3)
        if axes:
            sites.append(Site(n.name, (axes,)))
    return sites


def plant_antialias_blur(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A depthwise Conv (group C, stride 1, zero pads keeping the shape) with a binomial filter along the strided
    axes inserted on the Conv's input.  Planted: the blur Conv."""
    (axes,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = node.input[0]
    xv = _value(ctx, x)
    channels, spatial = xv.shape[1], xv.ndim - 2

    def variants():
        for taps, (lo, hi) in BLURS:
            kernel = np.ones([1] * spatial)
            for i in range(spatial):
                f = taps if i in axes else np.ones(1)
                shape = [1] * spatial
                shape[i] = f.size
                kernel = kernel * f.reshape(shape)
            weight = np.broadcast_to(kernel, (channels, 1, *kernel.shape)).astype(xv.dtype)
            pads = [lo if i in axes else 0 for i in range(spatial)] + [hi if i in axes else 0 for i in range(spatial)]
            out = copy(ctx.proto)
            conv = node_by_name(out, site.node)
            w = _add_constant(out, f"{site.node}_blur_kernel", np.ascontiguousarray(weight))
            blurred = unique_name(out, f"{x}_blurred")
            blur = helper.make_node("Conv", [x, w], [blurred], name=unique_name(out, f"{site.node}_blur"),
                                    group=int(channels), kernel_shape=list(kernel.shape), pads=pads,
                                    strides=[1] * spatial)
            conv.input[0] = blurred
            insert_nodes(out, site.node, [blur], [])
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [blur.name], "attribute-mismatch",
                f"{node.op_type} {site.node} (strides {list(attribute(node, 'strides', []))}, input "
                f"{list(xv.shape)}) given an anti-aliasing blur: a depthwise {_taps(taps)} filter along spatial axes "
                f"{[a + 2 for a in axes]} inserted on its input",
                {"conv": site.node, "taps": int(taps.size)})

    return _counting(ctx, variants(), "anti-alias blur")


# --------------------------------------------------------------------------- a router's top-k weights renormalised

ROUTER_SCORES = ("Softmax", "Sigmoid")


def _renormaliser(ctx: FileContext, values: str) -> onnx.NodeProto | None:
    """The named ONNX Div of the TopK values (or a Cast of them) by a ReduceSum of them (through an Add of a small
    constant and Casts), when there is one."""
    for s in readers(ctx.proto, values):
        if s.op_type != "ReduceSum" or not _onnx(s.domain):
            continue
        frontier = {s.output[0]}
        for _ in range(3):
            nxt = set()
            for t in frontier:
                for r in readers(ctx.proto, t):
                    if r.op_type == "Div" and _onnx(r.domain) and r.name and len(r.input) == 2 and r.input[1] == t:
                        head = r.input[0]
                        hp = producer(ctx.proto, head)
                        if head == values or (hp is not None and hp.op_type in PASS and hp.input[0] == values):
                            return r
                    if r.op_type in PASS + ("Add", "Max", "Clip"):
                        nxt.add(r.output[0])
            frontier = nxt
    return None


def router_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX TopK nodes over the last axis (k < the axis' size) of a Softmax's (over that axis) or a Sigmoid's
    output (through Casts) with float values: ``(score op, k, experts, renormalising Div or "")``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "TopK" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        x = _value(ctx, n.input[0])
        p = _through(ctx, n.input[0])
        if x is None or p is None or p.op_type not in ROUTER_SCORES or not _onnx(p.domain) or x.ndim < 1:
            continue
        axis = _norm_axis(int(attribute(n, "axis", -1)), x.ndim)
        if axis != x.ndim - 1:
            continue
        if p.op_type == "Softmax" and _norm_axis(int(attribute(p, "axis", -1)), x.ndim) != axis:
            continue
        k = ctx.values[n.output[0]].shape[axis]
        if k >= x.shape[axis]:
            continue
        div = _renormaliser(ctx, n.output[0])
        sites.append(Site(n.name, (p.op_type, int(k), int(x.shape[axis]), div.name if div is not None else "")))
    return sites


def plant_router_renorm(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """No renormalisation: a ReduceSum over the last axis and a Div inserted after the TopK's values (every reader
    reads the Div).  A renormalisation: its Div made an Identity of the values (same name).  Planted: the inserted
    ReduceSum and Div, or the Div."""
    op, k, experts, div = site.detail
    node = node_by_name(ctx.proto, site.node)
    values = node.output[0]
    rank = ctx.values[values].ndim

    def variants():
        if div:
            d = node_by_name(ctx.proto, div)
            out = copy(ctx.proto)
            replace_node(out, div, [helper.make_node("Identity", [d.input[0]], [d.output[0]], name=div)])
            planted, how = [div], "renormalised (norm_topk_prob) read as not: the Div by their sum dropped"
        else:
            def build(o, raw, result):
                total = unique_name(o, f"{raw}_sum")
                return [_reduce(ctx, o, "ReduceSum", raw, total, [rank - 1], 1,
                                unique_name(o, f"{site.node}_renorm_sum")),
                        helper.make_node("Div", [raw, total], [result], name=unique_name(o, f"{site.node}_renorm"))]

            out, new = _after(ctx, site.node, build)
            planted, how = [n.name for n in new], "not renormalised read as renormalised (norm_topk_prob): divided " \
                                                  "by their sum"
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [values] + ([node_by_name(ctx.proto, div).output[0]] if div else []))
        yield None if checked is None else Planted(
            checked, planted, "attribute-mismatch",
            f"router TopK {site.node} (top {k} of {experts}, {op} scores): the routing weights {how}",
            {"topk": site.node, "k": k, "experts": experts, "renormalised": bool(div)})

    return _counting(ctx, variants(), "router renorm")


KINDS = (
    FaultKind("logit-softcap", softcap_sites, plant_logit_softcap, "attribute-mismatch",
              "attention scores or output logits soft-capped: c · tanh(x / c) inserted (Gemma 2's cap carried over)",
              max_tries=40),
    FaultKind("token-pool", pool_sites, plant_token_pool, "attribute-mismatch",
              "a sequence pooled in the other convention: the CLS / last token ↔ a mean over tokens",
              max_tries=40),
    FaultKind("norm-reused", reused_sites, plant_norm_reused, "weight-mismatch",
              "a norm computed with another norm's parameters (norm1 used for norm2, ln_1 / ln_2 keys mapped wrong)",
              max_tries=40),
    FaultKind("qk-normed", qk_sites, plant_qk_normed, "attribute-mismatch",
              "queries and keys RMS- / L2-normalised before the scores (QK-norm, cosine attention) in a plain "
              "attention", max_tries=40),
    FaultKind("embed-maxnorm", maxnorm_sites, plant_embed_maxnorm, "attribute-mismatch",
              "embedding lookups renormalised to a max norm (nn.Embedding(max_norm=…)) the model does not have",
              max_tries=40),
    FaultKind("droppath-scaled", droppath_sites, plant_droppath_scaled, "attribute-mismatch",
              "a residual branch scaled by its survival probability 1 − p at inference (non-inverted stochastic "
              "depth)", max_tries=40),
    FaultKind("antialias-blur", blur_sites, plant_antialias_blur, "attribute-mismatch",
              "a strided Conv given an anti-aliasing blur (BlurPool): a depthwise binomial filter on its input",
              max_tries=40),
    FaultKind("router-renorm", router_sites, plant_router_renorm, "attribute-mismatch",
              "a MoE router's top-k weights renormalised where they are not, or not where they are "
              "(norm_topk_prob read wrong)", max_tries=40),
)
