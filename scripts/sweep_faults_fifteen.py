"""The fifteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's, a graph rewriter's, a hand-written port's, a kernel's or a deployment's mistake the
earlier sets never planted:

* ``norm-uncentred`` — a LayerNorm written out by hand (a converter's or a port's decomposition) whose numerator
  forgets the mean: ``x / sqrt(var(x) + eps)`` instead of ``(x − mean) / sqrt(var(x) + eps)``, the variance still
  centred.  A LayerNormalization replaced by ReduceMean, Sub, Mul, ReduceMean, Add(eps), Sqrt, a Div of the raw
  input by the standard deviation, then the original scale Mul and bias Add.  ``norm-kind`` (LayerNorm → RMSNorm:
  no centring anywhere, no bias) and ``unbiased-var`` change other parts of the statistics.  Expected
  ``attribute-mismatch``.
* ``norm-scale-before`` — a norm's weight γ folded into the wrong neighbour (a SmoothQuant / QuaRot-style rewrite
  that folds the norm weight into the layer before the norm instead of the layers after it): the norm computes
  ``norm(γ ⊙ x)`` with a unit weight where the model computes ``γ ⊙ norm(x)``.  A Mul by γ inserted before a
  LayerNormalization / RMSNormalization / SimplifiedLayerNormalization whose weight becomes ones; for a decomposed
  RMSNorm (``x · rsqrt(mean(x²) + eps) · γ``) the Mul by γ inserted on the norm's input (its own readers only: the
  residual keeps the raw stream) and the final Mul's γ made ones.  ``norm-affine`` drops the weight,
  ``vector-collapsed`` flattens it, ``scale-offset`` adds one.  Expected ``weight-mismatch`` (the norm's weight is
  ones where PyTorch's is γ; ``attribute-mismatch`` recorded as also accepted).
* ``softmax-chunked`` — a chunked / memory-efficient attention rewrite (a flash-style kernel, a key-blocked
  decomposition) that drops the cross-block rescaling: each block of keys normalised on its own, so every block's
  probabilities sum to one.  A Softmax replaced by a Split of its axis into two blocks (⌈S/2⌉, ⌊S/2⌋; else four), a
  Softmax of each block and a Concat.  Expected ``attribute-mismatch``.
* ``num-heads`` — attention run with the wrong head count (a converter or a fusion reading ``num_attention_heads``
  wrong, or hard-coding it): the head split of the queries, keys and values, every Reshape between the projections
  and the scores / the value product, and the merge after it, all made consistent with 2H heads of d/2 channels
  (else H/2 heads of 2d), so the model runs and every head attends over a different slice of the channels.  The
  Reshapes' shapes are found by following the head and head-size axes from the projections through the Transposes
  and Reshapes; attention with a per-head bias or a per-head table on the way (relative position biases, rotary
  tables) is left out (a real export with the wrong count fails there).  ``shape-constant`` changes one Reshape;
  ``repeat-order`` the key/value head repeat.  Expected ``attribute-mismatch``.
* ``axis-flipped`` — a flip the model does not make (an image loaded mirrored or a test-time-augmentation flip baked
  into the export; a reverse-direction RNN whose input a converter flipped once more — Keras ``go_backwards`` read
  as ONNX ``direction=reverse`` — or whose output it did not flip back): a Slice with step −1 along the width (else
  the height) of a graph input a Conv reads, along the time axis of a graph input a 1-d Conv reads (directly or
  through an input Cast / quantizer), and along the time axis of an LSTM / GRU / RNN input or output.
  ``channel-reverse`` reverses a constant's channels, ``kernel-flip`` a kernel.  Expected ``attribute-mismatch``.
* ``input-normalized`` — input preprocessing applied twice (the mean / std normalisation baked into the export
  while the caller still normalises, or the other way round): a Sub of a mean and a Div by a std inserted on a float
  graph input read by a Conv, directly or through an input Cast / quantizer (ImageNet's per-channel mean / std for
  three channels, else 0.5 / 0.5).  Expected ``attribute-mismatch``.
* ``bias-doubled`` — a bias counted twice (a fusion that folded the bias into the layer — MatMul + Add → Gemm /
  FusedMatMul, a BatchNorm fold into a Conv's bias — and kept the separate Add): an Add of the same bias inserted
  after a MatMul's bias Add, a Gemm with a bias or a Conv / ConvTranspose with a bias (reshaped to broadcast over
  the channels).  ``bias-shift`` perturbs a bias's value, ``residual-doubled`` adds an activation twice.  Expected
  ``attribute-mismatch`` (``weight-mismatch`` recorded as also accepted: at the layer the bias is 2b).
* ``embed-scale`` — an embedding multiplier the model does not have (``scale_embedding=True`` of BART / Marian /
  M2M100, Gemma's √d normaliser, fairseq's ``embed_scale`` applied to a model that does not scale): a Mul by √d
  inserted after the Gather of a token-embedding table by token ids (a graph input through Casts / Reshapes).
  Tables already followed by a scalar Mul are left out (their scale is ``scale-constant``'s).  Expected
  ``attribute-mismatch`` (``weight-mismatch`` recorded as also accepted: the table looks scaled).

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; as in the thirteenth and
fourteenth sets, a site where even the strongest variant stays under 2× the tolerance raises
:class:`~sweep_faults.NoVariant` (the sweep then tries the next site), so every planted fault of this set counts.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the uncentred norm's Div (the
statistics nodes before it compute what the model computes, the scale and bias after it are the model's own); the
inserted Mul by γ and the norm whose weight became ones; the per-block Softmaxes (not the Split and Concat around
them, which move values only); the Reshapes that split the query, key and value projections into heads (where the
head count enters; the Reshapes after them that had to follow — a key's relayout for Kᵀ, the value product's — are
listed in ``extra["also_changed"]``, and sites whose splits span more than 12 nodes are refused); the flipping Slice;
the inserted Sub and Div of the preprocessing; the second bias Add; the embedding's Mul.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy,
                          drop_stale_value_info, insert_nodes, is_float_array, node_by_name, producer, readers,
                          replace_node, unique_name, with_own_constant)
from sweep_faults_fourteen import _table
from sweep_faults_nine import _onnx, _up
from sweep_faults_ops import _opset
from sweep_faults_ten import _checked, _dynamic, _from_input, _named, _value
from sweep_faults_thirteen import _add_constant, _counting, _norm_axis
from sweep_faults_twelve import _float_output, _graph_outputs

MS_DOMAIN = "com.microsoft"
INT64_MIN = -(2 ** 63)


def _reduce_mean(out: onnx.ModelProto, opset: int, x: str, axes: list[int], y: str, name: str) -> onnx.NodeProto:
    """A ReduceMean of ``x`` over ``axes`` (keepdims) writing ``y``: axes as an input from opset 18, else an
    attribute."""
    if opset >= 18:
        a = _add_constant(out, f"{name}_axes", np.array(axes, np.int64))
        return helper.make_node("ReduceMean", [x, a], [y], name=name, keepdims=1)
    return helper.make_node("ReduceMean", [x], [y], name=name, axes=axes, keepdims=1)


def _first_in_graph(proto: onnx.ModelProto, names) -> str:
    """The name of whichever of the nodes ``names`` comes first in the graph's order."""
    wanted = set(names)
    return next(n.name for n in proto.graph.node if n.name in wanted)


def _used_outputs(proto: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether any output of ``node`` after its first is read or is a graph output."""
    outputs = {o.name for o in proto.graph.output}
    return any(o and (o in outputs or readers(proto, o)) for o in node.output[1:])


# --------------------------------------------------------------------------- a LayerNorm whose numerator is uncentred

def uncentred_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX LayerNormalizations with a computed float input of rank ≥ 2 whose mean over the normalised axes is
    not zero (its first output alone used): ``(axis,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "LayerNormalization" or not _onnx(n.domain) or not _float_output(ctx, n) \
                or _used_outputs(ctx.proto, n) or len(n.input) < 2:
            continue
        x = _value(ctx, n.input[0])
        if x is None or x.ndim < 2 or x.dtype.kind != "f":
            continue
        axis = _norm_axis(attribute(n, "axis", -1), x.ndim)
        mean = x.astype(np.float64).mean(axis=tuple(range(axis, x.ndim)))
        if np.any(mean):
            sites.append(Site(n.name, (axis,)))
    return sites


def plant_norm_uncentred(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The LayerNormalization written out with the raw input in the numerator (the variance still centred).
    Planted: the Div."""
    (axis,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = _value(ctx, node.input[0])
    axes = list(range(axis, x.ndim))
    dtype = ctx.values[node.output[0]].dtype
    opset = _opset(ctx)

    def variants():
        out = copy(ctx.proto)
        y = node.output[0]
        base = f"{site.node}_uncentred"
        eps = _add_constant(out, f"{base}_eps", np.array(float(attribute(node, "epsilon", 1e-5)), dtype))
        t = {k: unique_name(out, f"{y}_{k}") for k in ("mean", "centred", "square", "var", "var_eps", "std",
                                                       "normed", "scaled")}
        div = helper.make_node("Div", [node.input[0], t["std"]], [t["normed"]], name=unique_name(out, f"{base}_div"))
        new = [_reduce_mean(out, opset, node.input[0], axes, t["mean"], unique_name(out, f"{base}_mean")),
               helper.make_node("Sub", [node.input[0], t["mean"]], [t["centred"]],
                                name=unique_name(out, f"{base}_sub")),
               helper.make_node("Mul", [t["centred"], t["centred"]], [t["square"]],
                                name=unique_name(out, f"{base}_square")),
               _reduce_mean(out, opset, t["square"], axes, t["var"], unique_name(out, f"{base}_var")),
               helper.make_node("Add", [t["var"], eps], [t["var_eps"]], name=unique_name(out, f"{base}_eps")),
               helper.make_node("Sqrt", [t["var_eps"]], [t["std"]], name=unique_name(out, f"{base}_sqrt")),
               div]
        bias = node.input[2] if len(node.input) >= 3 and node.input[2] else None
        new.append(helper.make_node("Mul", [t["normed"], node.input[1]], [t["scaled"] if bias else y],
                                    name=unique_name(out, f"{base}_scale")))
        if bias:
            new.append(helper.make_node("Add", [t["scaled"], bias], [y], name=unique_name(out, f"{base}_bias")))
        replace_node(out, site.node, new)
        checked = _checked(ctx, out, [y])
        yield None if checked is None else Planted(
            checked, [div.name], "attribute-mismatch",
            f"LayerNormalization {site.node} ({list(x.shape)}, axes {axes}) written out as x / sqrt(var + eps): the "
            f"mean not subtracted in the numerator (the variance still centred)", {"norm": site.node})

    return _counting(ctx, variants(), "uncentred norm")


# --------------------------------------------------------------------------- a norm's weight folded before it

SCALED_NORMS = ("LayerNormalization", "RMSNormalization", "SimplifiedLayerNormalization")
RMS_DEPTH = 8  # nodes above the rsqrt factor within which the norm's input must be read


def _gamma(value: np.ndarray | None, size: int) -> bool:
    """A float weight of ``size`` entries that is not one value (a unit or constant weight folds to a no-op or a
    mere rescaling)."""
    return is_float_array(value) and value.size == size and size >= 2 and float(np.ptp(value)) > 0


def _rms_norm(ctx: FileContext, mul: onnx.NodeProto) -> tuple[int, str, list[str]] | None:
    """For a Mul by a constant weight γ of a decomposed RMSNorm's ``x · rsqrt(mean(x²) + eps)``: (γ's input index,
    the norm's input x, the names of the norm's nodes that read x); else None."""
    if mul.op_type != "Mul" or not _onnx(mul.domain) or len(mul.input) != 2:
        return None
    for k in (0, 1):
        gamma = constant(ctx.proto, mul.input[k])
        other = mul.input[1 - k]
        out = ctx.values.get(mul.output[0])
        if out is None or not _gamma(gamma, out.shape[-1]) or gamma.ndim != 1:
            continue
        inner = _up(ctx.proto, other)
        if inner is None or inner.op_type != "Mul" or not _onnx(inner.domain) or len(inner.input) != 2:
            continue
        for j in (0, 1):
            x, factor = inner.input[j], inner.input[1 - j]
            maker = producer(ctx.proto, x)
            if x == factor or x not in ctx.values or maker is not None and maker.op_type == "Sub":
                continue  # (a Sub: a decomposed LayerNorm's centred input, not an RMSNorm's)
            # the factor's ancestry: a ReduceMean and a root of the input's square, reading x
            chain, frontier, seen = [], [factor], set()
            for _ in range(RMS_DEPTH):
                nxt = []
                for t in frontier:
                    p = producer(ctx.proto, t)
                    if p is None or p.name in seen:
                        continue
                    seen.add(p.name)
                    chain.append(p)
                    nxt += [i for i in p.input if i]
                frontier = nxt
            ops = {p.op_type for p in chain}
            direct = [p for p in chain if x in p.input]
            if "ReduceMean" in ops and ops & {"Sqrt", "Reciprocal", "Pow", "Div"} and direct \
                    and all(p.name for p in direct) and inner.name:
                return k, x, [inner.name] + [p.name for p in direct]
    return None


def scale_before_sites(ctx: FileContext) -> list[Site]:
    """``("op", D)``: named LayerNormalization / RMSNormalization / SimplifiedLayerNormalization nodes (ONNX or
    com.microsoft) with a constant non-uniform float weight; ``("rms", k, x, readers)``: the weight Mul of a
    decomposed RMSNorm (see :func:`_rms_norm`)."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _float_output(ctx, n):
            continue
        if n.op_type in SCALED_NORMS and (_onnx(n.domain) or n.domain == MS_DOMAIN) and len(n.input) >= 2 \
                and not _used_outputs(ctx.proto, n):
            x = _value(ctx, n.input[0])
            gamma = constant(ctx.proto, n.input[1])
            if x is not None and gamma is not None and _gamma(gamma, gamma.size) and gamma.size > 1:
                sites.append(Site(n.name, ("op",)))
        elif n.op_type == "Mul":
            found = _rms_norm(ctx, n)
            if found is not None:
                k, x, inner = found
                sites.append(Site(n.name, ("rms", k, x, tuple(inner))))
    return sites


def plant_norm_scale_before(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by γ inserted on the norm's input (read by the norm alone), the norm's weight made ones.  Planted: the
    new Mul and the norm (the decomposed RMSNorm's weight Mul)."""
    how = site.detail[0]
    node = node_by_name(ctx.proto, site.node)

    def variants():
        out = copy(ctx.proto)
        if how == "op":
            k, x, inner = 1, node.input[0], [site.node]
        else:
            k, x, inner = site.detail[1], site.detail[2], list(site.detail[3])
        gamma = constant(ctx.proto, node.input[k])
        xdtype = ctx.values[x].dtype if x in ctx.values else _value(ctx, x).dtype
        g = _add_constant(out, f"{node.input[k]}_before_norm", gamma.astype(xdtype))
        scaled = unique_name(out, f"{x}_gamma_scaled")
        mul = helper.make_node("Mul", [x, g], [scaled], name=unique_name(out, f"{site.node}_gamma_before"))
        for name in inner:
            target = node_by_name(out, name)
            for i, t in enumerate(target.input):
                if t == x:
                    target.input[i] = scaled
        insert_nodes(out, _first_in_graph(out, inner), [mul], [])
        out = with_own_constant(out, site.node, k, np.ones_like(gamma), "unit")
        checked = _checked(ctx, out, [node.output[0]])
        what = f"{node.op_type} {site.node}" if how == "op" else f"decomposed RMSNorm (weight Mul {site.node})"
        yield None if checked is None else Planted(
            checked, [mul.name, site.node], "weight-mismatch",
            f"{what}: its weight {node.input[k]} ({gamma.size} entries) folded before the norm (norm(γ·x) with a unit "
            f"weight instead of γ·norm(x))", {"norm": site.node, "also_accepted": "attribute-mismatch"})

    return _counting(ctx, variants(), "norm weight before the norm")


# --------------------------------------------------------------------------- a softmax normalised per block

CHUNKS = (2, 4)


def chunk_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Softmaxes (opset ≥ 13) of a computed float tensor of rank ≥ 2 with ≥ 4 entries along the axis:
    ``(axis,)``."""
    if _opset(ctx) < 13:
        return []
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        v = ctx.values[n.output[0]]
        axis = _norm_axis(attribute(n, "axis", -1), v.ndim)
        if v.ndim >= 2 and v.shape[axis] >= 4:
            sites.append(Site(n.name, (axis,)))
    return sites


def plant_softmax_chunked(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Split (2 blocks: ⌈S/2⌉, ⌊S/2⌋; else 4) → a Softmax per block → Concat.  Planted: the block Softmaxes."""
    (axis,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    size = ctx.values[node.output[0]].shape[axis]

    def variants():
        for blocks in CHUNKS:
            if size < 2 * blocks:
                continue
            sizes = [len(b) for b in np.array_split(np.arange(size), blocks)]
            out = copy(ctx.proto)
            y = node.output[0]
            base = f"{site.node}_chunk{blocks}"
            split_sizes = _add_constant(out, f"{base}_sizes", np.array(sizes, np.int64))
            parts = [unique_name(out, f"{y}_block{i}") for i in range(blocks)]
            normed = [unique_name(out, f"{y}_block{i}_softmax") for i in range(blocks)]
            softmaxes = [helper.make_node("Softmax", [p], [q], name=unique_name(out, f"{base}_softmax{i}"), axis=axis)
                         for i, (p, q) in enumerate(zip(parts, normed))]
            new = [helper.make_node("Split", [node.input[0], split_sizes], parts,
                                    name=unique_name(out, f"{base}_split"), axis=axis),
                   *softmaxes,
                   helper.make_node("Concat", normed, [y], name=unique_name(out, f"{base}_concat"), axis=axis)]
            replace_node(out, site.node, new)
            checked = _checked(ctx, out, [y])
            yield None if checked is None else Planted(
                checked, [s.name for s in softmaxes], "attribute-mismatch",
                f"Softmax {site.node} over axis {axis} ({size} entries) normalised per block of keys ({sizes}): the "
                f"cross-block rescaling of a chunked attention dropped, each block sums to one",
                {"softmax": site.node, "blocks": sizes})

    return _counting(ctx, variants(), "chunked softmax")


# --------------------------------------------------------------------------- attention with the wrong head count

LAYOUT_OPS = ("Transpose", "Reshape", "Cast", "Identity")
SCORE_OPS = ("Mul", "Div", "Add", "Sub", "Where", "Cast", "Identity")
PROB_OPS = ("Where", "Cast", "Identity", "Mul", "Div", "IsNaN", "Dropout")
HEAD_SPAN = 12  # the changed Reshapes must lie within this many consecutive nodes (one reported segment)


def _scalar_side(ctx: FileContext, node: onnx.NodeProto) -> int | None:
    """For a Mul / Div of a computed tensor by a scalar constant, the index of the computed input; else None."""
    if node.op_type not in ("Mul", "Div") or len(node.input) != 2:
        return None
    for k in (0, 1):
        c = constant(ctx.proto, node.input[1 - k])
        if c is not None and c.size == 1 and node.input[k] not in node.input[1 - k:2 - k]:
            return k
    return None


def _layout_walk_up(ctx: FileContext, tensor: str) -> tuple[str, list[onnx.NodeProto]] | None:
    """(the tensor the layout chain starts from, the chain's nodes from there to ``tensor``): up through
    Transposes, Reshapes, Casts, Identities and Muls / Divs by a scalar constant."""
    chain, t = [], tensor
    for _ in range(16):
        p = producer(ctx.proto, t)
        if p is None or not _onnx(p.domain):
            break
        if p.op_type in LAYOUT_OPS:
            chain.append(p)
            t = p.input[0]
            continue
        k = _scalar_side(ctx, p)
        if k is None:
            break
        chain.append(p)
        t = p.input[k]
    return t, chain[::-1]


def _regroup(atoms: list[tuple[str, int]], shape: tuple[int, ...]) -> list[list[tuple[str, int]]] | None:
    """The axes of ``shape`` as consecutive groups of ``atoms`` (row-major order kept), size-1 atoms riding along;
    None when an axis would split an atom."""
    groups, i = [], 0
    for n in shape:
        g, prod = [], 1
        if n == 1:
            if i < len(atoms) and atoms[i][1] == 1:
                g.append(atoms[i])
                i += 1
            groups.append(g)
            continue
        while prod < n and i < len(atoms):
            g.append(atoms[i])
            prod *= atoms[i][1]
            i += 1
        if prod != n:
            return None
        groups.append(g)
    rest = atoms[i:]
    if any(a[1] != 1 for a in rest):
        return None
    if rest and groups:
        groups[-1] = groups[-1] + rest
    return groups


def _propagate(ctx: FileContext, start: str, chain: list[onnx.NodeProto], heads: int,
               reshapes: dict[str, list]) -> list[list[tuple[str, int]]] | None:
    """The atom groups of the chain's last tensor, starting from ``start`` = (…, D) with D = heads·d split into the
    atoms ``h`` and ``d``; every Reshape's output groups recorded in ``reshapes``; None when the axes cannot be
    followed (a Reshape splitting an atom)."""
    shape = _value(ctx, start).shape
    if len(shape) < 2 or shape[-1] % heads or shape[-1] // heads < 1:
        return None
    groups = [[("o", n)] for n in shape[:-1]] + [[("h", heads), ("d", shape[-1] // heads)]]
    for node in chain:
        if node.op_type == "Transpose":
            perm = attribute(node, "perm", list(range(len(groups)))[::-1])
            if len(perm) != len(groups):
                return None
            groups = [groups[p] for p in perm]
        elif node.op_type == "Reshape":
            groups = _regroup([a for g in groups for a in g], ctx.values[node.output[0]].shape)
            if groups is None:
                return None
            reshapes[node.name] = groups
    return groups


def _head_axis_free(ctx: FileContext, node: onnx.NodeProto, skip: set[str], rank: int) -> bool:
    """Whether every operand of a scores / probabilities node other than ``skip`` (the data, and tensors computed
    from the probabilities themselves: a NaN guard's mask) broadcasts over the head axis (size 1 there, or of rank
    < 3): a mask, a scale — not a per-head bias or table."""
    for t in node.input:
        if not t or t in skip:
            continue
        v = _value(ctx, t)
        if v is None:
            return False
        full = (1,) * (rank - v.ndim) + v.shape
        if v.ndim >= 3 and full[rank - 3] != 1:
            return False
    return True


def _attention(ctx: FileContext, softmax: onnx.NodeProto):
    """(scores MatMul, probabilities · V MatMul, heads) of an attention around ``softmax``; None when the
    structure is not the plain one (see :func:`head_sites`)."""
    rank = ctx.values[softmax.output[0]].ndim
    if rank < 4 or _norm_axis(attribute(softmax, "axis", -1), rank) != rank - 1:
        return None
    full = ctx.values[softmax.output[0]].shape
    heads = full[-3]
    if heads < 2:
        return None
    dynamic = _dynamic(ctx)
    t, scores = softmax.input[0], None
    for _ in range(8):
        p = producer(ctx.proto, t)
        if p is None or not _onnx(p.domain):
            return None
        if p.op_type == "MatMul" and all(i in dynamic for i in p.input[:2]):
            scores = p
            break
        if p.op_type not in SCORE_OPS:
            return None
        data = [i for i in p.input if i in dynamic and i in ctx.values and ctx.values[i].shape == full]
        if len(data) != 1 or not _head_axis_free(ctx, p, {data[0]}, rank):
            return None
        t = data[0]
    if scores is None:
        return None
    derived, frontier, pv = {softmax.output[0]}, [softmax.output[0]], None
    for _ in range(4):
        nxt = []
        for t in frontier:
            for r in readers(ctx.proto, t):
                if r.op_type == "MatMul" and _onnx(r.domain) and r.input[0] == t:
                    pv = pv or r
                elif r.op_type in PROB_OPS and _onnx(r.domain) and r.output[0] in ctx.values:
                    # computed operands of the probabilities' shape come from them (a NaN guard's IsNaN mask)
                    same = {o for o in r.input if o in dynamic and o in ctx.values and ctx.values[o].shape == full}
                    if not _head_axis_free(ctx, r, derived | same, rank):
                        return None
                    derived.add(r.output[0])
                    nxt.append(r.output[0])
        frontier = nxt
        if pv is not None:
            break
    if pv is None or pv.input[1] not in dynamic:
        return None
    return scores, pv, heads


def _merge_walk_down(ctx: FileContext, tensor: str, width: int) -> list[onnx.NodeProto] | None:
    """The layout nodes from the value product's output down to (and including) the Reshape that merges the heads
    back into a last axis of ``width``; None when there is none."""
    chain, t = [], tensor
    outputs = _graph_outputs(ctx)
    for _ in range(8):
        found = readers(ctx.proto, t)
        if len(found) != 1 or t in outputs or found[0].op_type not in LAYOUT_OPS or not _onnx(found[0].domain):
            return None
        node = found[0]
        chain.append(node)
        t = node.output[0]
        shape = ctx.values[t].shape
        if node.op_type == "Reshape" and len(shape) <= 3 and shape[-1] == width:
            return chain
    return None


def _head_plan(ctx: FileContext, softmax: onnx.NodeProto):
    """(heads, head size, {Reshape name: its output's atom groups}) of the attention around ``softmax``, or
    None."""
    found = _attention(ctx, softmax)
    if found is None:
        return None
    scores, pv, heads = found
    reshapes: dict[str, list] = {}
    ends = {}
    for role, t in (("q", scores.input[0]), ("k", scores.input[1]), ("v", pv.input[1])):
        start, chain = _layout_walk_up(ctx, t)
        v = _value(ctx, start)
        if v is None or v.ndim != 3 or start not in ctx.values or not any(n.op_type == "Reshape" for n in chain):
            return None
        groups = _propagate(ctx, start, chain, heads, reshapes)
        if groups is None or len(groups) != ctx.values[t].ndim:
            return None
        ends[role] = (groups, v.shape[-1])
    width = ends["v"][1]
    if ends["q"][1] != ends["k"][1] or ends["q"][1] % heads or width % heads:
        return None
    q, v = ends["q"][0], ends["v"][0]
    if len(q) != len(v):
        return None
    merge = _merge_walk_down(ctx, pv.output[0], width)
    if merge is None:
        return None
    groups = q[:-1] + [v[-1]]
    for node in merge:
        if node.op_type == "Transpose":
            perm = attribute(node, "perm", list(range(len(groups)))[::-1])
            if len(perm) != len(groups):
                return None
            groups = [groups[p] for p in perm]
        elif node.op_type == "Reshape":
            groups = _regroup([a for g in groups for a in g], ctx.values[node.output[0]].shape)
            if groups is None:
                return None
            reshapes[node.name] = groups
    return heads, ends["q"][1] // heads, reshapes


def _new_shapes(ctx: FileContext, reshapes: dict[str, list], sizes: dict[str, int]) -> dict[str, np.ndarray] | None:
    """The Reshapes' shape constants for the atom sizes ``sizes`` (a −1 kept where it was), those that change;
    None when a shape is not a constant."""
    changed = {}
    for name, groups in reshapes.items():
        node = node_by_name(ctx.proto, name)
        old = constant(ctx.proto, node.input[1])
        if old is None or old.ndim != 1 or old.size != len(groups):
            return None
        new = np.array([-1 if int(o) == -1 else int(np.prod([sizes.get(a[0], a[1]) for a in g], dtype=np.int64))
                        for o, g in zip(old, groups)], old.dtype)
        if not np.array_equal(new, old):
            changed[name] = new
    return changed


def _splits_heads(ctx: FileContext, name: str) -> bool:
    """Whether Reshape ``name`` splits the last axis of a (…, S, D) projection into (H, d): where the head count
    enters."""
    node = node_by_name(ctx.proto, name)
    before, after = _value(ctx, node.input[0]).shape, ctx.values[node.output[0]].shape
    return len(after) == len(before) + 1 and after[:len(before) - 1] == before[:-1] \
        and after[-2] * after[-1] == before[-1]


def head_sites(ctx: FileContext) -> list[Site]:
    """Named Softmaxes over the last axis of rank-4 attention scores (H ≥ 2 heads on axis −3) computed by a MatMul
    of two tensors that each come, through Transposes, Reshapes and scalar scales, from a (…, S, D) projection, the
    probabilities (through NaN guards / Casts) multiplying a value tensor of the same kind, the product merged back
    by Transposes and a Reshape to (…, S, D); masks and scales on the scores broadcasting over the heads; every
    Reshape on the way a constant shape: ``(heads, head size)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        plan = _head_plan(ctx, n)
        if plan is not None and _new_shapes(ctx, plan[2], {"h": plan[0], "d": plan[1]}) is not None:
            sites.append(Site(n.name, plan[:2]))
    return sites


def plant_num_heads(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Every Reshape between the projections and the merge made consistent with 2H heads of d/2 channels (else
    H/2 heads of 2d).  Planted: the Reshapes splitting the projections into heads (the others changed are in
    ``extra["also_changed"]``; splits spanning more than :data:`HEAD_SPAN` computing nodes are refused)."""
    heads, size = site.detail
    softmax = node_by_name(ctx.proto, site.node)
    plan = _head_plan(ctx, softmax)
    if plan is None:
        raise NoVariant("the attention's layout cannot be followed")
    reshapes = plan[2]
    # positions among the computing nodes (Constant nodes, which a segment would not list, left out)
    order = {n.name: i for i, n in enumerate(n for n in ctx.proto.graph.node if n.op_type != "Constant")}
    options = []
    if size % 2 == 0 and size >= 4:
        options.append((2 * heads, size // 2))
    if heads % 2 == 0:
        options.append((heads // 2, size * 2))

    splits = [name for name in reshapes if _splits_heads(ctx, name)]
    if not splits:
        raise NoVariant("no Reshape splits a projection into heads")
    span = [order[name] for name in splits]
    if max(span) - min(span) + 1 > HEAD_SPAN:
        raise NoVariant(f"the head splits span {max(span) - min(span) + 1} nodes (> {HEAD_SPAN})")

    def variants():
        for h, d in options:
            changed = _new_shapes(ctx, reshapes, {"h": h, "d": d})
            if not changed or not set(splits) <= set(changed):
                continue
            out = ctx.proto
            for name, value in changed.items():
                out = with_own_constant(out, name, 1, value, "heads")
            try:
                out = drop_stale_value_info(ctx, out)
            except Exception:  # noqa: BLE001 - the variant does not run
                continue
            checked = _checked(ctx, out, [softmax.output[0]])
            yield None if checked is None else Planted(
                checked, sorted(splits, key=order.get), "attribute-mismatch",
                f"attention around Softmax {site.node} run with {h} heads of {d} channels instead of {heads} of "
                f"{size}: {len(changed)} Reshapes changed "
                f"({', '.join(f'{k} → {v.tolist()}' for k, v in changed.items())})",
                {"softmax": site.node, "heads": h, "was": heads,
                 "also_changed": sorted(set(changed) - set(splits), key=order.get)})

    return _counting(ctx, variants(), "wrong head count")


# --------------------------------------------------------------------------- a flip the model does not make

RNN_OPS = ("LSTM", "GRU", "RNN")


def _feed_of(ctx: FileContext, tensor: str) -> str | None:
    """The graph input ``tensor`` is, directly or through Casts / Identities / an input quantizer's QuantizeLinear
    and DequantizeLinear (a float16 file's input Cast, a QDQ file's input pair), else None."""
    for _ in range(4):
        if tensor in ctx.feeds:
            return tensor
        node = producer(ctx.proto, tensor)
        if node is None or node.op_type not in ("Cast", "Identity", "QuantizeLinear", "DequantizeLinear"):
            return None
        tensor = node.input[0]
    return None


def flip_sites(ctx: FileContext) -> list[Site]:
    """``("conv", input, axes)``: a float graph input of rank 3 or 4 read by a named Conv / ConvTranspose (through
    Casts or an input quantizer: the flip goes on the Conv's input; its last axis, then for rank 4 the one before);
    ``("rnn-in", input, (time,))`` and ``("rnn-out", output, (time,))``: a named LSTM / GRU / RNN's sequence input
    and its sequence output (time axis 0, or 1 with ``layout=1``)."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain):
            continue
        if n.op_type in ("Conv", "ConvTranspose") and _feed_of(ctx, n.input[0]) is not None:
            x = _value(ctx, n.input[0])
            if x is not None and x.dtype.kind == "f" and x.ndim in (3, 4):
                axes = (x.ndim - 1,) if x.ndim == 3 else (3, 2)
                sites.append(Site(n.name, ("conv", n.input[0], tuple(a for a in axes if x.shape[a] > 1))))
        elif n.op_type in RNN_OPS:
            time = 1 if attribute(n, "layout", 0) else 0
            x = _value(ctx, n.input[0])
            if x is not None and x.dtype.kind == "f" and x.shape[time] > 1:
                sites.append(Site(n.name, ("rnn-in", n.input[0], (time,))))
            y = n.output[0] if n.output else ""
            if y and y in ctx.values and ctx.values[y].shape[time] > 1 and readers(ctx.proto, y):
                sites.append(Site(n.name, ("rnn-out", y, (time,))))
    return sites


def plant_axis_flipped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Slice with step −1 along the axis inserted on the Conv's / RNN's input (the RNN's output: its readers read
    the flipped sequence).  Planted: the Slice."""
    how, tensor, axes = site.detail
    node = node_by_name(ctx.proto, site.node)
    shape = _value(ctx, tensor).shape
    if not axes:
        raise NoVariant("no axis of size > 1 to flip")

    def variants():
        for axis in axes:
            out = copy(ctx.proto)
            c = {k: _add_constant(out, f"{site.node}_flip_{k}", np.array([v], np.int64))
                 for k, v in (("starts", -1), ("ends", INT64_MIN), ("axes", axis), ("steps", -1))}

            def slice_node(src, dst):
                return helper.make_node("Slice", [src, c["starts"], c["ends"], c["axes"], c["steps"]], [dst],
                                        name=unique_name(out, f"{site.node}_flip"))

            if how == "rnn-out":
                def build(o, raw, result):
                    return [slice_node(raw, result)]

                out2, new = _after_copy(out, site.node, build)
                out, flip = out2, new[0]
            else:
                flipped = unique_name(out, f"{tensor}_flipped")
                flip = slice_node(tensor, flipped)
                target = node_by_name(out, site.node)
                target.input[0] = flipped
                insert_nodes(out, site.node, [flip], [])
            checked = _checked(ctx, out, node.output)
            cast = "" if tensor in ctx.feeds else ", cast / quantized"
            where = {"conv": f"input {tensor} (the graph input{cast}) of {node.op_type} {site.node}",
                     "rnn-in": f"{node.op_type} {site.node}'s sequence input {tensor}",
                     "rnn-out": f"{node.op_type} {site.node}'s sequence output {tensor}"}[how]
            yield None if checked is None else Planted(
                checked, [flip.name], "attribute-mismatch",
                f"{where} {list(shape)} flipped along axis {axis} (a Slice with step −1 inserted)",
                {"tensor": tensor, "axis": axis})

    return _counting(ctx, variants(), "axis flipped")


def _after_copy(out: onnx.ModelProto, node_name: str, build) -> tuple[onnx.ModelProto, list[onnx.NodeProto]]:
    """:func:`sweep_faults_thirteen._after` on an already copied model ``out`` (changed in place)."""
    target = node_by_name(out, node_name)
    result = target.output[0]
    raw = unique_name(out, f"{result}_raw")
    target.output[0] = raw
    new = build(out, raw, result)
    insert_nodes(out, node_name, [], new)
    return out, new


# --------------------------------------------------------------------------- input preprocessing applied again

IMAGENET = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def normalized_sites(ctx: FileContext) -> list[Site]:
    """Float graph inputs of rank ≥ 3 read by a named Conv / ConvTranspose (directly, through Casts or an input
    quantizer; channels on axis 1), one site per input: ``(input,)``."""
    sites, seen = [], set()
    for n in _named(ctx.proto.graph.node):
        feed = _feed_of(ctx, n.input[0]) if n.op_type in ("Conv", "ConvTranspose") and _onnx(n.domain) else None
        if feed is not None and feed not in seen:
            x = ctx.feeds[feed]
            if x.dtype.kind == "f" and x.ndim >= 3:
                seen.add(feed)
                sites.append(Site(n.name, (feed,)))
    return sites


def plant_input_normalized(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """``(x − mean) / std`` inserted on the graph input (ImageNet's per-channel statistics for three channels, else
    0.5 / 0.5), every reader of the input reading the result.  Planted: the Sub and the Div."""
    (tensor,) = site.detail
    x = ctx.feeds[tensor]
    options = []
    if x.shape[1] == 3:
        options.append((np.array(IMAGENET[0]), np.array(IMAGENET[1]), "ImageNet mean / std per channel"))
    options.append((np.array(0.5), np.array(0.5), "mean 0.5, std 0.5"))

    def variants():
        for mean, std, text in options:
            out = copy(ctx.proto)
            shape = (1, -1) + (1,) * (x.ndim - 2) if mean.ndim else ()
            m = _add_constant(out, f"{tensor}_preprocess_mean", mean.astype(x.dtype).reshape(shape))
            s = _add_constant(out, f"{tensor}_preprocess_std", std.astype(x.dtype).reshape(shape))
            centred = unique_name(out, f"{tensor}_centred")
            normed = unique_name(out, f"{tensor}_normalized")
            targets = [r.name for r in readers(out, tensor)]
            if not all(targets):
                return
            new = [helper.make_node("Sub", [tensor, m], [centred], name=unique_name(out, f"{tensor}_preprocess_sub")),
                   helper.make_node("Div", [centred, s], [normed], name=unique_name(out, f"{tensor}_preprocess_div"))]
            for name in targets:
                r = node_by_name(out, name)
                for i, t in enumerate(r.input):
                    if t == tensor:
                        r.input[i] = normed
            insert_nodes(out, _first_in_graph(out, targets), new, [])
            checked = _checked(ctx, out, [o for name in targets for o in node_by_name(ctx.proto, name).output])
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"graph input {tensor} {list(x.shape)} normalised once more ({text}) before {', '.join(targets)}",
                {"input": tensor})

    return _counting(ctx, variants(), "input normalised again")


# --------------------------------------------------------------------------- a bias added twice

BIAS_AFTER = ("MatMul", "FusedMatMul")


def _bias_vector(ctx: FileContext, node: onnx.NodeProto) -> int | None:
    """For an Add of a MatMul's output and a constant float bias along its last axis, the bias's input index."""
    if len(node.input) != 2:
        return None
    for k in (0, 1):
        b = constant(ctx.proto, node.input[k])
        made = producer(ctx.proto, node.input[1 - k])
        if not is_float_array(b) or made is None or made.op_type not in BIAS_AFTER:
            continue
        out = ctx.values[node.output[0]]
        if b.size == out.shape[-1] and b.size >= 2 and np.any(b) and all(s == 1 for s in b.shape[:-1]):
            return k
    return None


def bias_sites(ctx: FileContext) -> list[Site]:
    """``("add", k)``: a named Add of a MatMul's output and a constant bias (input k); ``("gemm",)``: a named Gemm
    with a constant float C; ``("conv",)``: a named Conv / ConvTranspose with a constant float bias."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        if n.op_type == "Add":
            k = _bias_vector(ctx, n)
            if k is not None:
                sites.append(Site(n.name, ("add", k)))
        elif n.op_type == "Gemm" and len(n.input) >= 3 and n.input[2]:
            c = constant(ctx.proto, n.input[2])
            if is_float_array(c) and np.any(c):
                sites.append(Site(n.name, ("gemm",)))
        elif n.op_type in ("Conv", "ConvTranspose") and len(n.input) >= 3 and n.input[2]:
            b = constant(ctx.proto, n.input[2])
            if is_float_array(b) and b.ndim == 1 and np.any(b):
                sites.append(Site(n.name, ("conv",)))
    return sites


def plant_bias_doubled(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """An Add of the node's bias inserted after it (the same constant for a MatMul's bias Add; β·C for a Gemm; the
    bias as (C, 1, …) for a Conv).  Planted: the new Add."""
    how = site.detail[0]
    node = node_by_name(ctx.proto, site.node)
    y = ctx.values[node.output[0]]

    def variants():
        out = copy(ctx.proto)
        source = node.input[site.detail[1]] if how == "add" else node.input[2]
        if how == "add":
            bias = node.input[site.detail[1]]
        elif how == "gemm":
            c = constant(ctx.proto, node.input[2])
            beta = float(attribute(node, "beta", 1.0))
            bias = node.input[2] if beta == 1.0 else _add_constant(out, f"{node.input[2]}_beta",
                                                                   (c * beta).astype(c.dtype))
        else:
            b = constant(ctx.proto, node.input[2])
            bias = _add_constant(out, f"{node.input[2]}_broadcast", b.reshape((-1,) + (1,) * (y.ndim - 2)))

        def build(o, raw, result):
            return [helper.make_node("Add", [raw, bias], [result], name=unique_name(o, f"{site.node}_bias_again"))]

        out, new = _after_copy(out, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "attribute-mismatch",
            f"{node.op_type} {site.node}'s bias {source} {list(constant(ctx.proto, source).shape)} added a second time "
            f"(a fused bias with the separate Add kept)",
            {"layer": site.node, "bias": source, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "bias added twice")


# --------------------------------------------------------------------------- an embedding multiplier

def _scaled_after(ctx: FileContext, tensor: str) -> bool:
    """Whether ``tensor`` (through Casts) is multiplied / divided by a scalar constant already."""
    for r in readers(ctx.proto, tensor):
        if r.op_type in ("Cast", "Identity"):
            if _scaled_after(ctx, r.output[0]):
                return True
        elif _scalar_side(ctx, r) is not None:
            return True
    return False


def embed_sites(ctx: FileContext) -> list[Site]:
    """Named Gathers along axis 0 of a 2-d float table (a constant, or a DequantizeLinear of one) by token ids (a
    graph input through Casts / Reshapes), the result not already scaled by a scalar: ``(D,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Gather" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        table = _table(ctx, n.input[0])
        if not is_float_array(table) or table.ndim != 2 or _norm_axis(attribute(n, "axis", 0), 2) != 0 \
                or table.shape[1] < 2 or not _from_input(ctx, n.input[1]) or _scaled_after(ctx, n.output[0]):
            continue
        sites.append(Site(n.name, (int(table.shape[1]),)))
    return sites


def plant_embed_scale(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Mul by √d inserted after the lookup.  Planted: the Mul."""
    (d,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype

    def variants():
        out = copy(ctx.proto)
        factor = _add_constant(out, f"{site.node}_embed_factor", np.array(math.sqrt(d), dtype))

        def build(o, raw, result):
            return [helper.make_node("Mul", [raw, factor], [result], name=unique_name(o, f"{site.node}_embed_scale"))]

        out, new = _after_copy(out, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "attribute-mismatch",
            f"token embedding {site.node} ({node.input[0]}, d = {d}) multiplied by √d = {math.sqrt(d):.4g} "
            f"(scale_embedding / an embedding normaliser the model does not have)",
            {"gather": site.node, "factor": math.sqrt(d), "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "embedding multiplier")


KINDS = (
    FaultKind("norm-uncentred", uncentred_sites, plant_norm_uncentred, "attribute-mismatch",
              "a LayerNorm written out as x / sqrt(var + eps): the mean not subtracted in the numerator",
              max_tries=40),
    FaultKind("norm-scale-before", scale_before_sites, plant_norm_scale_before, "weight-mismatch",
              "a norm's weight folded before the norm: norm(γ·x) with a unit weight instead of γ·norm(x)",
              max_tries=40),
    FaultKind("softmax-chunked", chunk_sites, plant_softmax_chunked, "attribute-mismatch",
              "a Softmax normalised per block of keys (a chunked attention without the cross-block rescaling)",
              max_tries=40),
    FaultKind("num-heads", head_sites, plant_num_heads, "attribute-mismatch",
              "attention run with the wrong head count (2H heads of d/2, else H/2 of 2d): every head Reshape changed",
              max_tries=40),
    FaultKind("axis-flipped", flip_sites, plant_axis_flipped, "attribute-mismatch",
              "an input image / sequence or an RNN's input or output flipped along its width / time axis",
              max_tries=40),
    FaultKind("input-normalized", normalized_sites, plant_input_normalized, "attribute-mismatch",
              "input preprocessing applied twice: (x − mean) / std inserted on a float graph input a Conv reads",
              max_tries=40),
    FaultKind("bias-doubled", bias_sites, plant_bias_doubled, "attribute-mismatch",
              "a layer's bias added twice (a fused bias whose separate Add was kept)", max_tries=40),
    FaultKind("embed-scale", embed_sites, plant_embed_scale, "attribute-mismatch",
              "a token embedding multiplied by √d the model does not apply (scale_embedding)", max_tries=40),
)
