"""The tenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's, a checkpoint loader's or a graph rewriter's mistake the earlier sets never
planted: a TopK's ``largest`` or ``sorted`` flipped (ArgMax ↔ ArgMin, or ``select_last_index`` flipped: a router
taking the worst experts), one activation input of a node rewired to another tensor of the same shape and dtype
computed earlier (an in-place aliasing bug: a residual Add reading the previous block's output), two rows of an
embedding table exchanged (a tokenizer / vocabulary mismatch), a rotary position table computed with the wrong
``rope_theta`` (or a folded cos / sin or sinusoidal table one position off), a per-channel vector (LayerScale
gamma, a norm's scale or bias, a folded bias) replaced by its mean (per-channel → per-tensor), one float32 node's
output rounded through bfloat16, a LoRA merged into a weight with the wrong alpha (``W += s·B@A``, rank 2–4) and a
constant square mask or position bias transposed in its last two axes.  Each follows :mod:`sweep_faults`'
conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no variant works at a site, a
changed shared constant first given a private copy where the kind says so) and finds its sites by graph structure
and values alone, never by names.

Where a kind has several variants at a site (the other attribute, another earlier tensor, another pair of rows,
another theta, a larger LoRA scale), it plants the first, in its order of preference, whose outputs diverge from
PyTorch's by ≥ 2× the tolerance (optimizations on and off: the sweep's count), else the strongest one
(:func:`sweep_faults_nine._pick`).  Expected causes use the earlier sets' vocabulary: attribute changes and graph
rewiring (as ``residual-dropped``, ``op-dropped``) expect ``attribute-mismatch``; changed tables and weights
``weight-mismatch``; the bfloat16 round trip ``precision`` (as ``node-float16``); the transposed mask
``attribute-mismatch`` as ``mask-value`` does, with ``weight-mismatch`` recorded as also accepted in its ``extra``.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          folded, insert_nodes, is_float_array, node_by_name, producer, prune, quantized_source,
                          ratio, readers, set_attr, unique_name, weight_input, with_argument, with_initializer,
                          with_own_constant)
from sweep_faults_nine import _finite_outputs, _onnx, _pick
from sweep_faults_ops import _usable

PRODUCT_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv")


def _named(nodes) -> list[onnx.NodeProto]:
    """The nodes that have a name (a planted node must be named; an unnamed one is skipped)."""
    return [n for n in nodes if n.name]


def _dynamic(ctx: FileContext) -> set[str]:
    """Tensors that depend on the graph inputs (the feeds and every node output computed from them)."""
    found = set(ctx.feeds)
    for n in ctx.proto.graph.node:
        if any(t in found for t in n.input if t):
            found.update(o for o in n.output if o)
    return found


def _value(ctx: FileContext, tensor: str) -> np.ndarray | None:
    if tensor in ctx.values:
        return ctx.values[tensor]
    if tensor in ctx.feeds:
        return ctx.feeds[tensor]
    return constant(ctx.proto, tensor)


def _changes_any(ctx: FileContext, out: onnx.ModelProto, tensors) -> bool:
    got = ctx.tensors(out, [t for t in tensors if t])
    for t, v in got.items():
        old = ctx.values.get(t)
        if old is None or v.shape != old.shape or not np.array_equal(v, old, equal_nan=True):
            return True
    return False


def _checked(ctx: FileContext, out: onnx.ModelProto, tensors) -> onnx.ModelProto | None:
    """``out`` when it runs (optimizations on and off, PyTorch's output shapes), changes one of ``tensors`` and
    keeps the graph outputs finite; else None."""
    if ctx.problem(out) or not _changes_any(ctx, out, tensors) or not _finite_outputs(ctx, out):
        return None
    return out


# --------------------------------------------------------------------------- TopK / ArgMax attributes

def topk_sites(ctx: FileContext) -> list[Site]:
    """TopK, ArgMax and ArgMin nodes whose outputs the clean file computes."""
    return [Site(n.name) for n in _named(ctx.proto.graph.node)
            if n.op_type in ("TopK", "ArgMax", "ArgMin") and _onnx(n.domain)
            and any(o in ctx.values for o in n.output if o)]


def plant_topk_attr(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """TopK: ``largest`` or ``sorted`` flipped; ArgMax ↔ ArgMin or ``select_last_index`` flipped.  The variants
    in a seeded order; the first whose outputs count, else the strongest."""
    node = node_by_name(ctx.proto, site.node)
    if node.op_type == "TopK":
        options = [("largest", int(attribute(node, "largest", 1))), ("sorted", int(attribute(node, "sorted", 1)))]
        options = [options[int(i)] for i in rng.permutation(2)]
    else:
        options = [("op", node.op_type), ("select_last_index", int(attribute(node, "select_last_index", 0)))]

    def variants():
        for name, old in options:
            out = copy(ctx.proto)
            target = node_by_name(out, site.node)
            if name == "op":
                new = "ArgMin" if old == "ArgMax" else "ArgMax"
                target.op_type = new
                text = f"{old} → {new}"
            else:
                set_attr(target, name, 1 - old)
                text = f"{node.op_type} {name} {old} → {1 - old}"
            checked = _checked(ctx, out, node.output)
            yield None if checked is None else Planted(checked, [site.node], "attribute-mismatch", text)

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant(f"no flipped attribute of the {node.op_type} runs, changes its output and stays finite")
    return planted


# --------------------------------------------------------------------------- an input rewired

REWIRE_SKIP_OPS = ("Shape", "Size", "Constant", "ConstantOfShape")
REWIRE_VARIANTS = 3  # earlier tensors tried, nearest first


def rewire_sites(ctx: FileContext) -> list[Site]:
    """Float activation inputs (depending on the graph inputs; neither initializers nor constants) of named
    nodes that read their values (not Shape / Size)."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type in REWIRE_SKIP_OPS or not any(o in ctx.values for o in n.output if o):
            continue
        for k, t in enumerate(n.input):
            value = _value(ctx, t) if t in dynamic else None
            if value is not None and value.dtype.kind == "f" and value.size > 1 and t not in n.input[:k]:
                sites.append(Site(n.name, (k,)))
    return sites


def _earlier(ctx: FileContext, node: onnx.NodeProto, k: int) -> list[str]:
    """Tensors computed before ``node`` (graph inputs, outputs of nodes earlier in the graph's topological order)
    that depend on the graph inputs, have input ``k``'s shape and dtype, are no input of the node, differ
    from input ``k``'s value beyond the tolerance (not a copy or cast of it) and are not on the chain of
    one-activation-input nodes that computed it (that would be an op dropped, not a rewiring): nearest first."""
    dynamic = _dynamic(ctx)
    old = _value(ctx, node.input[k])
    chain, t = set(), node.input[k]
    for _ in range(64):
        maker = producer(ctx.proto, t)
        live = [] if maker is None else [i for i in maker.input if i in dynamic]
        if len(set(live)) != 1:
            break
        t = live[0]
        chain.add(t)
    found = []
    for n in ctx.proto.graph.node:
        if n.name == node.name:
            break
        found += [o for o in n.output if o]
    found = list(ctx.feeds) + found
    picked = []
    for t in reversed(found):
        if t in node.input or t not in dynamic or t in chain:
            continue
        v = _value(ctx, t)
        if v is None or v.shape != old.shape or v.dtype != old.dtype:
            continue
        if ratio(v, old, ctx.atol, ctx.rtol) <= 1.0:
            continue
        picked.append(t)
        if len(picked) == REWIRE_VARIANTS:
            break
    return picked


def plant_input_rewired(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Input ``k`` of the node reads another tensor of the same shape and dtype computed earlier (the nearest
    earlier one first, up to three): the first whose outputs count, else the strongest.  Nodes left dead are
    dropped."""
    (k,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    old = node.input[k]
    choices = _earlier(ctx, node, k)
    if not choices:
        raise NoVariant("no earlier tensor of the same shape and dtype that differs")

    def variants():
        for t in choices:
            out = copy(ctx.proto)
            node_by_name(out, site.node).input[k] = t
            prune(out, dead_nodes(ctx.proto))
            checked = _checked(ctx, out, node.output)
            maker = producer(ctx.proto, t)
            where = "a graph input" if maker is None else f"{maker.op_type} {maker.name}"
            shape = list(_value(ctx, old).shape)
            yield None if checked is None else Planted(
                checked, [site.node], "attribute-mismatch",
                f"{node.op_type} input {k} rewired from {old} to {t} (computed earlier by {where}; {shape})",
                {"old_input": old, "new_input": t})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no rewired input runs, changes the output and stays finite")
    return planted


# --------------------------------------------------------------------------- embedding rows exchanged

VOCAB_PAIRS = 3  # pairs of rows tried


def _table_source(ctx: FileContext, node: onnx.NodeProto, k: int) -> tuple[str, str] | None:
    """('float', tensor) for a float constant table of ≥ 2 dims at input ``k``; ('int', tensor) for the integer
    table behind a per-tensor DequantizeLinear that only this node reads; else None."""
    t = node.input[k]
    value = constant(ctx.proto, t)
    if is_float_array(value) and value.ndim >= 2:
        return "float", t
    q = quantized_source(ctx.proto, node, k)
    if q is not None and constant(ctx.proto, q).ndim >= 2:
        dq = producer(ctx.proto, t)
        scale = constant(ctx.proto, dq.input[1])
        if scale is not None and scale.size == 1:
            return "int", q
    return None


#: ops token ids may pass through between a graph input and the Gather
ID_PASS_OPS = ("Cast", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity")


def _from_input(ctx: FileContext, tensor: str) -> bool:
    """Whether ``tensor`` is a graph input, or one through ``ID_PASS_OPS`` alone (token ids, not indices
    computed from activations such as an argmax or a router's TopK)."""
    for _ in range(8):
        if tensor in ctx.feeds:
            return True
        node = producer(ctx.proto, tensor)
        if node is None or node.op_type not in ID_PASS_OPS:
            return False
        tensor = node.input[0]
    return False


def vocab_sites(ctx: FileContext) -> list[Site]:
    """Gathers along axis 0 of a 2-D constant table (float, or int8 behind a per-tensor DequantizeLinear) by
    integer indices that are a graph input (through Cast / Reshape / Unsqueeze ... alone), and com.microsoft
    EmbedLayerNormalization's word embedding."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type == "Gather" and _onnx(n.domain) and attribute(n, "axis", 0) == 0:
            table, ids = 0, 1
        elif n.op_type == "EmbedLayerNormalization":
            table, ids = 2, 0
        else:
            continue
        if len(n.input) <= max(table, ids) or not _from_input(ctx, n.input[ids]):
            continue
        idx = _value(ctx, n.input[ids])
        source = _table_source(ctx, n, table)
        if source is None or constant(ctx.proto, source[1]).ndim != 2:
            continue
        if idx is None or idx.dtype.kind not in "iu" or not idx.size:
            continue
        sites.append(Site(n.name, (table, ids, *source)))
    return sites


def plant_vocab_swap(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Two rows of the table exchanged, at least one of them (both where the input uses two) a row the sweep's
    input looks up: up to three seeded pairs, the first whose outputs count, else the strongest.  A float table
    read by other nodes too (tied embeddings) is given a private copy."""
    table, ids, kind, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    rows = value.shape[0]
    used = np.unique(_value(ctx, node.input[ids]).reshape(-1).astype(np.int64) % rows)
    pairs, seen = [], set()
    for _ in range(20):
        if len(pairs) == VOCAB_PAIRS:
            break
        if used.size >= 2:
            a, b = (int(x) for x in rng.choice(used, 2, replace=False))
        else:
            a, b = int(used[0]), int(rng.integers(rows))
        key = (min(a, b), max(a, b))
        if a == b or key in seen or np.array_equal(value[a], value[b]):
            continue
        seen.add(key)
        pairs.append((a, b))
    if not pairs:
        raise NoVariant("no two different rows to exchange")

    def variants():
        for a, b in pairs:
            new = value.copy()
            new[[a, b]] = value[[b, a]]
            if kind == "float":
                out = with_own_constant(ctx.proto, site.node, table, new, "rows_swapped")
            else:
                out = with_initializer(ctx.proto, source, new)
            checked = _checked(ctx, out, node.output)
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{node.op_type} table {source} {list(value.shape)} ({value.dtype}): rows {a} and {b} exchanged "
                f"({used.size} distinct rows used by the input)", {"weight": source, "rows": [a, b]})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("no exchanged pair of rows changes the output")
    return planted


# --------------------------------------------------------------------------- rotary / sinusoidal table

ROPE_DEPTH = 10  # nodes downstream of inv_freq within which both a Cos and a Sin must be
THETA = 10000.0
THETA_WRONG = (500000.0, 1000.0)
UNIT_TOL = 1e-2  # cos² + sin² within this of 1


def _downstream_ops(proto: onnx.ModelProto, tensor: str, depth: int) -> set[str]:
    reading: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for t in n.input:
            reading.setdefault(t, []).append(n)
    ops, frontier, seen = set(), [tensor], {tensor}
    for _ in range(depth):
        nxt = []
        for t in frontier:
            for n in reading.get(t, ()):
                ops.add(n.op_type)
                for o in n.output:
                    if o and o not in seen:
                        seen.add(o)
                        nxt.append(o)
        frontier = nxt
    return ops


def _vector(value: np.ndarray | None) -> bool:
    """A float constant with one axis of size ≥ 2 and every other axis of size 1."""
    return is_float_array(value) and value.size >= 2 and max(value.shape) == value.size


def _constants(proto: onnx.ModelProto) -> list[str]:
    """Every initializer and Constant output (graph order)."""
    return [i.name for i in proto.graph.initializer] + [n.output[0] for n in proto.graph.node
                                                        if n.op_type == "Constant"]


def _unit(a: np.ndarray, b: np.ndarray) -> bool:
    with np.errstate(all="ignore"):
        s = a.astype(np.float64) ** 2 + b.astype(np.float64) ** 2
    return a.size >= 4 and bool(np.all(np.abs(s - 1) <= UNIT_TOL))


def _position_axis(shape: tuple[int, ...]) -> int | None:
    """The positions' axis of a table: the one before the last, else the longest non-last axis of size > 1."""
    if len(shape) < 2:
        return None
    if shape[-2] > 1:
        return len(shape) - 2
    sizes = [(s, a) for a, s in enumerate(shape[:-1]) if s > 1]
    return max(sizes)[1] if sizes else None


def rope_sites(ctx: FileContext) -> list[Site]:
    """inv_freq: a positive float vector constant (entries in (0, 1]) with both a Cos and a Sin within
    ``ROPE_DEPTH`` nodes downstream.  Folded angles: a float constant of ≥ 2 dims with a Cos and a Sin within two
    nodes downstream (TorchScript's folded positions × inv_freq).  Folded tables: a pair of float constants of one
    shape, ≥ 2 dims, with cos² + sin² = 1 everywhere (cos / sin caches), or one whose last axis' halves (or even /
    odd entries) are such a pair (a sinusoidal position table).  None read by a MatMul / Gemm / Conv."""
    proto = ctx.proto
    names = _constants(proto)
    sites = []
    values = {}
    for t in names:
        value = constant(proto, t)
        users = _named(readers(proto, t))
        if not users or any(r.op_type in PRODUCT_OPS for r in readers(proto, t)) or not is_float_array(value):
            continue
        values[t] = value
        if _vector(value) and np.all(value > 0) and np.all(value <= 1 + 1e-6):
            if {"Cos", "Sin"} <= _downstream_ops(proto, t, ROPE_DEPTH):
                sites.append(Site(users[0].name, ("inv_freq", t)))
        elif value.ndim >= 2 and _position_axis(value.shape) is not None and np.all(np.isfinite(value)) \
                and {"Cos", "Sin"} <= _downstream_ops(proto, t, 2):
            sites.append(Site(users[0].name, ("angles", t)))
    tables = [t for t, v in values.items() if v.ndim >= 2 and _position_axis(v.shape) is not None
              and np.all(np.abs(v) <= 1 + 1e-3)]
    paired = set()
    for i, c in enumerate(tables):
        for s in tables[i + 1:]:
            if values[c].shape == values[s].shape and _unit(values[c], values[s]):
                first = [_named(readers(proto, t))[0].name for t in (c, s)]
                sites.append(Site(first[0], ("pair", c, s, first[1])))
                paired.update((c, s))
    for t in tables:
        v = values[t]
        d = v.shape[-1]
        if t in paired or d < 4 or d % 2:
            continue
        if _unit(v[..., :d // 2], v[..., d // 2:]) or _unit(v[..., 0::2], v[..., 1::2]):
            sites.append(Site(_named(readers(proto, t))[0].name, ("sinusoidal", t)))
    return sites


def _theta(inv_freq: np.ndarray) -> tuple[float, str]:
    """The base θ of a geometric inv_freq (θ^(−2i/d), d = 2·len), else the assumed 10000."""
    v = inv_freq.reshape(-1).astype(np.float64)
    if v.size >= 3 and abs(v[0] - 1) < 1e-6 and 0 < v[1] < 1:
        steps = v[1:] / v[:-1]
        if np.all(np.abs(steps / steps[0] - 1) < 1e-3):
            return float(v[1] ** (-v.size)), "estimated from the table"
    return THETA, "assumed"


def plant_rope_table(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """inv_freq: replaced by inv_freq ** (ln θ' / ln θ) (θ' = 500000, else 1000), every reader of it reading the
    new one (planted: those readers).  Folded tables: rolled by one position along the positions' axis (a
    position offset), each changed table given a private copy at its first reader (planted: those readers)."""
    what = site.detail[0]
    if what == "inv_freq":
        source = site.detail[1]
        value = constant(ctx.proto, source)
        theta, how = _theta(value)
        users = [r.name for r in readers(ctx.proto, source)]
        outputs = [o for r in readers(ctx.proto, source) for o in r.output]

        def variants():
            for wrong in THETA_WRONG:
                power = math.log(wrong) / math.log(theta)
                new = (value.astype(np.float64) ** power).astype(value.dtype)
                checked = _checked(ctx, with_initializer(ctx.proto, source, new), outputs)
                yield None if checked is None else Planted(
                    checked, users, "weight-mismatch",
                    f"rotary inv_freq {source} {list(value.shape)} computed with rope_theta {wrong:g} instead of "
                    f"{theta:g} ({how}): inv_freq ** {power:.4f}", {"weight": source, "theta": [theta, wrong]})

        planted = _pick(ctx, variants())
        if planted is None:
            raise NoVariant("the re-based inv_freq does not change the output")
        return planted
    if what == "angles":
        return _rope_angles(ctx, site)
    tables = [site.detail[1], site.detail[2]] if what == "pair" else [site.detail[1]]
    users = [site.node, site.detail[3]] if what == "pair" else [site.node]
    out = ctx.proto
    shown = []
    for t, user in zip(tables, users):
        value = constant(ctx.proto, t)
        axis = _position_axis(value.shape)
        new = np.ascontiguousarray(np.roll(value, 1, axis=axis))
        reader = node_by_name(out, user)
        out = with_own_constant(out, user, list(reader.input).index(t), new, "rolled")
        shown.append(f"{t} {list(value.shape)}")
    outputs = [o for u in users for o in node_by_name(ctx.proto, u).output]
    checked = _checked(ctx, out, outputs)
    if checked is None:
        raise NoVariant("the rolled table does not change the output")
    kind = "cos / sin tables" if what == "pair" else "sinusoidal position table"
    readers_ = sorted(set(users), key=users.index)
    return Planted(checked, readers_, "weight-mismatch",
                   f"{kind} {', '.join(shown)} rolled by one position (a position offset), in private copies read "
                   f"by {', '.join(readers_)} only",
                   {"weight": tables[0], "tables": tables})


def _rope_angles(ctx: FileContext, site: Site) -> Planted:
    """A folded angle table ``A[p] = p·f`` (linear in the position, ``A[0] = 0``) recomputed with another
    rope_theta: ``p·f ** (ln θ' / ln θ)`` (θ' = 500000, else 1000); a table that is not linear in the position
    rolled by one position.  Changed where it is: every reader (the Cos and the Sin) reads it; planted: those."""
    source = site.detail[1]
    value = constant(ctx.proto, source)
    axis = _position_axis(value.shape)
    users = [r.name for r in readers(ctx.proto, source)]
    outputs = [o for r in readers(ctx.proto, source) for o in r.output]
    v = value.astype(np.float64)
    n = value.shape[axis]
    step = np.take(v, [1], axis=axis)
    positions = np.arange(n, dtype=np.float64).reshape([n if a == axis else 1 for a in range(v.ndim)])
    linear = bool(np.allclose(v, positions * step, rtol=1e-4, atol=1e-4 * max(float(np.abs(v).max()), 1.0)))
    if not linear:
        new = np.ascontiguousarray(np.roll(value, 1, axis=axis))
        checked = _checked(ctx, with_initializer(ctx.proto, source, new), outputs)
        if checked is None:
            raise NoVariant("the rolled angle table does not change the output")
        return Planted(checked, users, "weight-mismatch",
                       f"rotary angle table {source} {list(value.shape)} (not linear in the position) rolled by one "
                       f"position along axis {axis} (a position offset)", {"weight": source})
    freqs = np.sort(np.unique(step[step > 0]))[::-1]
    theta, how = _theta(freqs)

    def variants():
        for wrong in THETA_WRONG:
            power = math.log(wrong) / math.log(theta)
            scale = np.where(step > 0, np.abs(step) ** (power - 1), 1.0)
            new = (v * scale).astype(value.dtype)
            checked = _checked(ctx, with_initializer(ctx.proto, source, new), outputs)
            yield None if checked is None else Planted(
                checked, users, "weight-mismatch",
                f"rotary angle table {source} {list(value.shape)} (positions × inv_freq, folded) computed with "
                f"rope_theta {wrong:g} instead of {theta:g} ({how}): inv_freq ** {power:.4f}",
                {"weight": source, "theta": [theta, wrong]})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the re-based angle table does not change the output")
    return planted


# --------------------------------------------------------------------------- per-channel vector collapsed

#: normalization inputs that are per-channel vectors (scale, bias)
NORM_VECTORS = {"LayerNormalization": (1, 2), "SimplifiedLayerNormalization": (1,), "RMSNormalization": (1,),
                "SkipLayerNormalization": (2, 3, 4), "SkipSimplifiedLayerNormalization": (2, 3),
                "BatchNormalization": (1, 2), "InstanceNormalization": (1, 2), "GroupNormalization": (1, 2)}
COLLAPSE_MIN_SIZE = 4
FLAT_SPREAD = 1e-3  # a vector whose range is within this share of its largest magnitude is nearly constant


def _spread(value: np.ndarray) -> bool:
    v = value.astype(np.float64)
    top = float(np.abs(v).max()) if v.size else 0.0
    finite = bool(np.all(np.isfinite(v))) and not np.any(v <= -1e4)  # no mask
    return finite and top > 0 and float(np.ptp(v)) > FLAT_SPREAD * top


def vector_sites(ctx: FileContext) -> list[Site]:
    """Per-channel float vector constants (one axis ≥ 4, the others 1; not nearly constant) that a Mul or Add
    applies to an activation, and the scale / bias vectors of normalizations."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type in ("Mul", "Add") and _onnx(n.domain) and len(n.input) == 2:
            ks = [k for k in (0, 1) if folded(ctx, n.input[1 - k]) is None]
        elif n.op_type in NORM_VECTORS:
            ks = [k for k in NORM_VECTORS[n.op_type] if k < len(n.input) and n.input[k]]
        else:
            continue
        for k in ks:
            value = constant(ctx.proto, n.input[k])
            if _vector(value) and value.size >= COLLAPSE_MIN_SIZE and _spread(value):
                sites.append(Site(n.name, (k,)))
    return sites


def plant_vector_collapsed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The vector replaced by its mean, same shape (the node reads a private copy when the constant is shared)."""
    (k,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, node.input[k])
    mean = float(value.astype(np.float64).mean())
    new = np.full(value.shape, mean, value.dtype)
    out = _checked(ctx, with_own_constant(ctx.proto, site.node, k, new, "collapsed"), node.output)
    if out is None:
        raise NoVariant("the collapsed vector does not change the output")
    v = value.astype(np.float64)
    return Planted(out, [site.node], "weight-mismatch",
                   f"{node.op_type} input {k} {node.input[k]} {list(value.shape)} ({value.dtype}, range "
                   f"{v.min():.3g}…{v.max():.3g}) replaced by its mean {mean:.4g} (per-channel → per-tensor)",
                   {"weight": node.input[k]})


# --------------------------------------------------------------------------- output rounded through bfloat16

#: nodes whose output only moves or copies values (rounding it is rounding what they read)
BF16_SKIP_OPS = ("Constant", "ConstantOfShape", "Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                 "Flatten", "Transpose", "Expand", "Shape", "Size", "Slice", "Split", "Concat", "Gather",
                 "GatherElements", "GatherND", "Tile", "Pad", "DequantizeLinear", "QuantizeLinear")


def _bf16(value: np.ndarray) -> np.ndarray:
    """float32 rounded to bfloat16 (round to nearest even) and back."""
    bits = np.ascontiguousarray(value, np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return rounded.astype(np.uint32).view(np.float32)


def bf16_sites(ctx: FileContext) -> list[Site]:
    """Named nodes computing a float32 output (not data movement) that bfloat16 does not represent exactly."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type in BF16_SKIP_OPS or not n.output or n.output[0] not in ctx.values:
            continue
        value = ctx.values[n.output[0]]
        if value.dtype == np.float32 and value.size and not np.array_equal(_bf16(value), value, equal_nan=True):
            sites.append(Site(n.name))
    return sites


def plant_cast_bf16(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Cast to BFLOAT16 and a Cast back to FLOAT inserted after the node: the node writes a new tensor, the
    second Cast writes the old one (every reader, a graph output too, reads the round-tripped value).  Planted:
    the Cast to bfloat16, the node that rounds (the node before it computes as it did; node-float16, by contrast,
    makes the node itself compute in float16)."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    result = target.output[0]
    raw = unique_name(out, f"{result}_fp32")
    half = unique_name(out, f"{result}_bf16")
    target.output[0] = raw
    down = helper.make_node("Cast", [raw], [half], name=unique_name(out, f"{site.node}_to_bf16"),
                            to=TensorProto.BFLOAT16)
    up = helper.make_node("Cast", [half], [result], name=unique_name(out, f"{site.node}_from_bf16"),
                          to=TensorProto.FLOAT)
    insert_nodes(out, site.node, [], [down, up])
    problem = ctx.problem(out)
    if problem:
        raise NoVariant(f"ONNX Runtime does not run the bfloat16 round trip: {problem}")
    if not ctx.changes(out, result):
        raise NoVariant("the bfloat16 round trip gives the float32 result")
    clean_on = ctx.run(ctx.proto, True)
    if all(np.array_equal(a, b, equal_nan=True) for a, b in zip(ctx.run(out, True), clean_on)):
        raise NoVariant("with optimizations on ONNX Runtime removes the round trip (outputs unchanged)")
    local = ctx.local_ratio(out, result)
    return Planted(out, [down.name], "precision",
                   f"{node.op_type} output {result} rounded through bfloat16 (Cast pair after it; local "
                   f"{local:.3g}× tol)", {"local_ratio": local})


# --------------------------------------------------------------------------- a LoRA merged with the wrong alpha

LORA_REL = 0.03  # ‖ΔW‖ / ‖W‖
LORA_SCALES = (1, 3, 10)  # the update scaled up until the outputs count


def lora_sites(ctx: FileContext) -> list[Site]:
    """Float weights (≥ 2 dims, read by this node alone) of MatMul / Gemm / Conv nodes, not all zero."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in PRODUCT_OPS:
            continue
        for k, src in weight_input(ctx.proto, n):
            value = constant(ctx.proto, src)
            if src == n.input[k] and is_float_array(value) and np.any(value) and min(_matrix_shape(n, k, value)) >= 2:
                sites.append(Site(n.name, (k, src)))
    return sites


def _matrix_shape(node: onnx.NodeProto, k: int, value: np.ndarray) -> tuple[int, int]:
    """The (rows, columns) the update is low-rank in: a MatMul's last two axes (K × N), a Gemm's matrix, a
    Conv's kernel flattened to out × (in·kh·kw) (ConvTranspose: in × rest)."""
    if "MatMul" in node.op_type:
        return value.shape[-2], value.shape[-1]
    return value.shape[0], int(np.prod(value.shape[1:]))


def _lora_delta(node: onnx.NodeProto, k: int, value: np.ndarray, rank: int,
                rng: np.random.Generator) -> np.ndarray:
    """B @ A of the given rank (Gaussian, seeded) in the weight's layout, normalized to ‖ΔW‖ = 1."""
    rows, cols = _matrix_shape(node, k, value)
    batch = int(value.size // (rows * cols))
    b = rng.standard_normal((batch, rows, rank))
    a = rng.standard_normal((batch, rank, cols))
    delta = (b @ a).reshape(value.shape)
    return delta / np.linalg.norm(delta)


def plant_lora_merge(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """W += s·(B@A), rank 2–4 (seeded), s such that ‖ΔW‖/‖W‖ = 3 %, else ×3, ×10 where the outputs do not count:
    the first that counts, else the strongest."""
    k, source = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = constant(ctx.proto, source)
    rows, cols = _matrix_shape(node, k, value)
    rank = int(min(rng.integers(2, 5), rows, cols))
    unit = _lora_delta(node, k, value, rank, rng)
    norm = float(np.linalg.norm(value.astype(np.float64)))

    def variants():
        for factor in LORA_SCALES:
            rel = LORA_REL * factor
            new = (value.astype(np.float64) + rel * norm * unit).astype(value.dtype)
            checked = _checked(ctx, with_initializer(ctx.proto, source, new), node.output)
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{node.op_type} weight {source} {list(value.shape)} ({value.dtype}) += rank-{rank} update B@A "
                f"({rows}×{rank} @ {rank}×{cols}; ‖ΔW‖/‖W‖ = {rel:.0%})", {"weight": source, "rank": rank,
                                                                         "relative_norm": rel})

    planted = _pick(ctx, variants())
    if planted is None:
        raise NoVariant("the merged update does not change the output")
    return planted


# --------------------------------------------------------------------------- a constant mask transposed

#: ops a constant table may pass through (from its first input) before the Add / Where reading it
MASK_PASS_OPS = ("Cast", "Identity", "Unsqueeze", "Squeeze", "Expand", "Slice")
MASK_DIFF_MIN = 0.01  # share of the entries the transpose must change


def _constant_root(ctx: FileContext, tensor: str, through: tuple[str, ...] = MASK_PASS_OPS) -> str | None:
    """The initializer / Constant output ``tensor`` is, or comes from through ``through`` ops (their other inputs
    constant too); None when it is computed (a Trilu, arithmetic, anything depending on the inputs)."""
    for _ in range(6):
        if constant(ctx.proto, tensor) is not None:
            return tensor
        node = producer(ctx.proto, tensor)
        if node is None or node.op_type not in through or not _onnx(node.domain):
            return None
        if any(folded(ctx, t) is None for t in node.input[1:] if t):
            return None
        tensor = node.input[0]
    return None


def mask_sites(ctx: FileContext) -> list[Site]:
    """Constant (initializer / Constant, possibly through Cast / Unsqueeze / Expand / Slice) tensors square in
    their last two axes, not (nearly) symmetric, that an Add adds to an activation or a Where reads (condition
    or branch), whose source no MatMul / Gemm / Conv reads."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain) or n.output[0] not in ctx.values:
            continue
        if n.op_type == "Add" and len(n.input) == 2:
            ks = [k for k in (0, 1) if folded(ctx, n.input[1 - k]) is None]
        elif n.op_type == "Where":
            ks = [0, 1, 2]
        else:
            continue
        for k in ks:
            root = _constant_root(ctx, n.input[k])
            if root is None or any(r.op_type in PRODUCT_OPS for r in readers(ctx.proto, root)):
                continue
            value = folded(ctx, n.input[k])
            if value is None or value.ndim < 2 or value.shape[-1] != value.shape[-2] or value.shape[-1] < 2:
                continue
            if value.dtype.kind not in "fb":
                continue
            if float(np.mean(value != np.swapaxes(value, -1, -2))) >= MASK_DIFF_MIN:
                sites.append(Site(n.name, (k, root)))
    return sites


def plant_mask_transposed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node reads the table transposed in its last two axes (a private constant; the constants that made
    the old one dropped when nothing else reads them)."""
    k, root = site.detail
    node = node_by_name(ctx.proto, site.node)
    value = folded(ctx, node.input[k])
    new = np.ascontiguousarray(np.swapaxes(value, -1, -2))
    out = with_argument(ctx, site.node, k, new)
    out = _usable(ctx, out, node.output[0])
    if out is None or not _finite_outputs(ctx, out):
        raise NoVariant("the transposed table does not run, change the output or keep it finite")
    what = {0: "Where condition", 1: "Where X branch", 2: "Where Y branch"}.get(k) if node.op_type == "Where" \
        else f"Add input {k}"
    share = float(np.mean(value != new))
    return Planted(out, [site.node], "attribute-mismatch",
                   f"{what} {node.input[k]} {list(value.shape)} ({value.dtype}; from constant {root}) transposed in "
                   f"its last two axes ({share:.0%} of the entries change)",
                   {"weight": root, "also_accepted": "weight-mismatch"})


KINDS = (
    FaultKind("topk-attr", topk_sites, plant_topk_attr, "attribute-mismatch",
              "a TopK's largest or sorted flipped, or ArgMax ↔ ArgMin / select_last_index flipped"),
    FaultKind("input-rewired", rewire_sites, plant_input_rewired, "attribute-mismatch",
              "a node's activation input rewired to another earlier tensor of its shape and dtype (in-place alias)"),
    FaultKind("vocab-swap", vocab_sites, plant_vocab_swap, "weight-mismatch",
              "two rows of an embedding table exchanged, rows the input looks up"),
    FaultKind("rope-table", rope_sites, plant_rope_table, "weight-mismatch",
              "rotary inv_freq re-based to rope_theta 500000 (or 1000), or a folded cos/sin or sinusoidal table "
              "rolled by one position"),
    FaultKind("vector-collapsed", vector_sites, plant_vector_collapsed, "weight-mismatch",
              "a per-channel scale / bias vector (Mul / Add / norm) replaced by its mean"),
    FaultKind("cast-bf16", bf16_sites, plant_cast_bf16, "precision",
              "one float32 node's output rounded through bfloat16 (Cast pair inserted after it)"),
    FaultKind("lora-merge", lora_sites, plant_lora_merge, "weight-mismatch",
              "a MatMul/Gemm/Conv weight += a rank 2–4 update of 3 % its norm (×3, ×10 where needed to count)"),
    FaultKind("mask-transposed", mask_sites, plant_mask_transposed, "attribute-mismatch / weight-mismatch",
              "a constant square mask or position bias read by Add / Where transposed in its last two axes"),
)
