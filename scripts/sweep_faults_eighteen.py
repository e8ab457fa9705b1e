"""The eighteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a hand-written port's, a converter's, a checkpoint loader's, an export wrapper's or a deployment's
mistake the earlier sets never planted:

* ``kv-swapped`` — attention run with its keys and values exchanged (a port calling ``attn(q, v, k)``, a packed
  ``qkv`` projection split in the order q, v, k, a loader mapping ``k_proj`` and ``v_proj`` the other way round):
  scores computed from the values, the keys averaged.  An attention is a MatMul / Einsum of two computed tensors
  whose scores reach a Softmax over the last axis (:func:`sweep_faults_thirteen._softmax_reached`) and a MatMul /
  Einsum reading the probabilities (through Casts, Identities and a NaN guard's Where) with a computed value
  operand; from the scores' second operand (the keys) and the value operand, each walked up through layout nodes
  (Reshape, Transpose, Expand …) and scalar scales, the deepest tensors of one shape on the two paths are exchanged
  (the projections' outputs in BERT, the rotated keys and the head-split values in LLaMA).
  ``weights-exchanged`` swaps two weights of a shape, ``scores-transposed`` computes K·Qᵀ.  Expected
  ``attribute-mismatch``.
* ``layer-dropped`` — a shape-preserving layer left out (a port that forgets the attention's output projection, an
  ``nn.Identity`` put where a converter could not map a layer, a pruning script that replaced a block's 1×1
  convolution): a MatMul / Gemm / Conv / ConvTranspose with a constant weight whose output (after its bias Add,
  where there is one) has its input's shape and dtype replaced by an Identity of the input.  ``norm-dropped``
  drops a norm, ``op-dropped`` an activation, ``bias-dropped`` only the bias.  Expected ``attribute-mismatch``
  (``weight-mismatch`` recorded as also accepted: the layer looks like an identity weight).
* ``softmax-unnormalised`` — a softmax whose normalisation is left out (a flash / online-softmax port that
  forgets the final division by the running sum ``l``, a "stable softmax" written as ``exp(x − max)``): a Softmax
  replaced by ReduceMax → Sub → Exp over its axis.  ``softmax-chunked`` normalises per block, ``softmax-kind``
  takes the log.  Expected ``attribute-mismatch``.
* ``parallel-residual`` — two sequential residual blocks run in parallel (``use_parallel_residual`` /
  ``parallel_attn`` read wrong, a GPT-J-style port of a sequential model, a stage whose blocks all read the stage
  input): for ``s = x + f(x)`` (or a post-LN ``s = N(x + f(x))``) followed by ``e = s + g(s)``, the second block's
  branch reads x instead of s: ``e = s + g(x)``.  Two residual Adds (:func:`sweep_faults_sixteen._residuals`) where
  the second's skip is the first's block end; the second branch's entry nodes rewired.  ``block-order`` exchanges
  the blocks, ``input-rewired`` rewires one input to the nearest earlier tensor.  Expected ``attribute-mismatch``.
* ``gate-complement`` — a sigmoid gate read in the other convention (a GRU / highway / CfC update gate taken as
  ``(1 − z)·h + z·n`` for ``z·h + (1 − z)·n``, a speech-enhancement mask read as the noise mask, an excitation
  weight inverted): ``1 − σ(a)`` for ``σ(a)`` where a Sigmoid / HardSigmoid gates a Mul of another computed tensor
  (not the ``x·σ(x)`` of a SiLU): a Sub from one inserted after the gate.  ``activation-kind`` changes the
  sigmoid, ``where-polarity`` inverts a boolean mask.  Expected ``attribute-mismatch``.
* ``glu-swapped`` — a gated unit's two branches exchanged (LLaMA's ``w1`` / ``w3`` — ``gate_proj`` / ``up_proj``
  — mapped the other way round, ``F.glu``'s halves taken in the other order, gMLP's spatial gating applied to the
  other half of the channels): ``F(b)·a`` for ``F(a)·b``, where a and b are siblings (two outputs of one Split, two
  Slices / Gathers of one tensor, or two MatMul / Gemm / Conv layers of one input with their bias Adds) of one shape
  and F the nodes (≤ 10: SiLU, a written-out GELU, a norm and token-mixing matrix) computing one Mul operand from
  a alone.  ``hidden-act`` changes F's activation, ``weights-exchanged`` any two weights.  Expected
  ``attribute-mismatch``.
* ``mask-after-softmax`` — an attention mask applied to the probabilities instead of the scores (``probs =
  softmax(scores).masked_fill(mask, 0)``: the kept weights not renormalised): the mask Add (of a tensor whose
  entries are 0 or ≤ −100) or the masking Where (a fill ≤ −100) before a Softmax over the last axis taken out, and
  a Where zeroing the masked probabilities inserted after the Softmax (a Greater / Not giving the kept positions).
  ``mask-value`` changes the fill, ``mask-causal`` adds a mask, ``mask-transposed`` transposes it.  Expected
  ``attribute-mismatch``.
* ``output-activation`` — probabilities returned where the model returns logits (an export wrapper or deployment
  that bakes the post-processing in: ``nn.Sequential(model, nn.Softmax(-1))``, a segmentation export with its
  softmax over the classes): a Softmax (over the classes: the channel axis of a Conv's output, else the last
  axis; a Sigmoid where that axis has one entry) inserted on a graph output computed by a layer with a constant
  weight (a MatMul / Gemm / Conv, through its bias Add, layout nodes, scalar scales, Concats and sums of such).
  ``op-doubled`` repeats an existing activation.  Expected ``attribute-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.  A planted file whose edits read a tensor made later in the node list is
re-sorted (:func:`sweep_faults_seventeen._toposorted`), so that it stays topologically sorted.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the two nodes that read the
exchanged key and value tensors; the Identity left of the layer (the node that wrote its output); the ReduceMax,
Sub and Exp that replaced the Softmax; the second branch's entry nodes (Shape nodes, whose output does not change,
aside); the inserted Sub; F's entry nodes and the gating Mul; the node that read the masked scores, the inserted
Greater / Not and the inserted Where; the inserted Softmax / Sigmoid.  Sites with more than 12 are refused.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, Planted, Site, attribute, copy, insert_nodes, node_by_name, producer,
                          readers, replace_node, unique_name)
from sweep_faults_nine import _onnx
from sweep_faults_ops import _opset
from sweep_faults_seventeen import (LAYOUT_OPS, MASK_FLOOR, SHAPE_OPS, _block_end, _scalar_scale, _sole_readers,
                                    _toposorted)
from sweep_faults_sixteen import SEGMENT, _ancestor_tensors, _block, _producers, _residuals
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting, _norm_axis, _softmax_reached
from sweep_faults_twelve import _float_output, _graph_outputs

PRODUCTS = ("MatMul", "Einsum")  # the scores' and the probabilities' products of an attention
LAYERS = ("MatMul", "Gemm", "Conv", "ConvTranspose")
CHANNEL_LAYERS = ("Conv", "ConvTranspose")


def _rewired(node: onnx.NodeProto, old: str, new: str) -> bool:
    """Every input slot of ``node`` reading ``old`` made to read ``new`` (in place); whether there was one."""
    hit = False
    for i, t in enumerate(node.input):
        if t == old:
            node.input[i] = new
            hit = True
    return hit


def _bias_constant(ctx: FileContext, add: onnx.NodeProto, tensor: str, dynamic: set[str]) -> bool:
    """``add`` is a named ONNX Add of ``tensor`` and a non-computed float operand (a bias)."""
    if add.op_type != "Add" or not add.name or not _onnx(add.domain) or len(add.input) != 2 \
            or tensor not in add.input:
        return False
    other = [i for i in add.input if i != tensor]
    if len(other) != 1 or other[0] in dynamic:
        return False
    value = _value(ctx, other[0])
    return value is not None and value.dtype.kind == "f"


# --------------------------------------------------------------------------- keys and values exchanged

KV_DEPTH = 8  # layout nodes / scalar scales walked up from an attention operand


def _probs_product(ctx: FileContext, soft: onnx.NodeProto) -> onnx.NodeProto | None:
    """The named MatMul / Einsum reading the Softmax's probabilities as its first operand (through Casts,
    Identities and the Where of a NaN guard, each the tensor's only reader but an IsNaN) with a computed second
    operand; else None."""
    outputs, dynamic = _graph_outputs(ctx), _dynamic(ctx)
    t = soft.output[0]
    for _ in range(4):
        found = [r for r in readers(ctx.proto, t) if r.op_type != "IsNaN"]
        if len(found) != 1 or t in outputs:
            return None
        r = found[0]
        if not _onnx(r.domain):
            return None
        if r.op_type in PRODUCTS and len(r.input) == 2 and r.input[0] == t and r.input[1] in dynamic and r.name:
            return r
        if r.op_type not in ("Cast", "Identity", "Where") or not r.output or r.output[0] not in ctx.values:
            return None
        t = r.output[0]
    return None


def _kv_chain(ctx: FileContext, tensor: str, dynamic: set[str]) -> list[str]:
    """``tensor`` and the tensors it is computed from through layout nodes and scalar scales, nearest first."""
    chain = [tensor]
    for _ in range(KV_DEPTH):
        p = producer(ctx.proto, chain[-1])
        if p is None or not _onnx(p.domain) or not p.name:
            break
        s = _scalar_scale(ctx, p, dynamic)
        if s is not None:
            nxt = s[0]
        elif p.op_type in LAYOUT_OPS and p.input and p.input[0] in dynamic:
            nxt = p.input[0]
        else:
            break
        chain.append(nxt)
    return chain


def _kv_pairs(ctx: FileContext, ck: list[str], cv: list[str]) -> list[tuple[int, int]]:
    """``(i, j)``: for each key tensor ``ck[i]``, deepest first, the deepest value tensor ``cv[j]`` of its shape
    and dtype whose value differs (the two paths sharing no tensor)."""
    pairs = []
    for i in reversed(range(len(ck))):
        a = _value(ctx, ck[i])
        if a is None or ck[i] in cv:
            continue
        for j in reversed(range(len(cv))):
            b = _value(ctx, cv[j])
            if b is None or cv[j] in ck or a.shape != b.shape or a.dtype != b.dtype or np.array_equal(a, b):
                continue
            pairs.append((i, j))
            break
    return pairs


def kv_sites(ctx: FileContext) -> list[Site]:
    """Named scores products (MatMul / Einsum of two computed tensors reaching a Softmax over the last axis) whose
    probabilities a value product reads, with a key / value tensor pair to exchange: ``(softmax, value product)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in PRODUCTS or not _onnx(n.domain) or len(n.input) != 2 \
                or not all(t in dynamic for t in n.input) or not _float_output(ctx, n):
            continue
        soft = _softmax_reached(ctx, n.output[0])
        pv = None if soft is None else _probs_product(ctx, soft)
        if pv is None:
            continue
        if _kv_pairs(ctx, _kv_chain(ctx, n.input[1], dynamic), _kv_chain(ctx, pv.input[1], dynamic)):
            sites.append(Site(n.name, (soft.name, pv.name)))
    return sites


def plant_kv_swapped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The chain node reading the key tensor reads the value tensor, and the other way round (deepest pair first,
    then shallower ones).  Planted: the two rewired nodes."""
    soft, pv = site.detail
    scores, probs = node_by_name(ctx.proto, site.node), node_by_name(ctx.proto, pv)
    dynamic = _dynamic(ctx)
    ck, cv = _kv_chain(ctx, scores.input[1], dynamic), _kv_chain(ctx, probs.input[1], dynamic)

    def reader(chain: list[str], i: int, head: str) -> str:
        return head if i == 0 else producer(ctx.proto, chain[i - 1]).name

    def variants():
        for i, j in _kv_pairs(ctx, ck, cv)[:3]:
            rk, rv = reader(ck, i, site.node), reader(cv, j, pv)
            if rk == rv:
                continue
            out = copy(ctx.proto)
            if not _rewired(node_by_name(out, rk), ck[i], cv[j]) or not _rewired(node_by_name(out, rv), cv[j], ck[i]) \
                    or not _toposorted(out):
                yield None
                continue
            checked = _checked(ctx, out, [scores.output[0], probs.output[0]])
            yield None if checked is None else Planted(
                checked, [rk, rv], "attribute-mismatch",
                f"attention {site.node} → Softmax {soft} → {pv} run with keys and values exchanged: {rk} reads "
                f"the values' {cv[j]} ({list(_value(ctx, cv[j]).shape)}) for the keys' {ck[i]}, {rv} the keys'",
                {"scores": site.node, "softmax": soft, "values": pv, "key_tensor": ck[i], "value_tensor": cv[j]})

    return _counting(ctx, variants(), "keys and values exchanged")


# --------------------------------------------------------------------------- a layer left out

def layer_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX MatMul / Gemm / Conv / ConvTranspose nodes with a constant weight on a computed float input whose
    output — after the bias Add that alone reads it, where there is one — has the input's shape and dtype:
    ``(layer, input)``, named by the node writing the output."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in LAYERS or not _onnx(n.domain) or len(n.input) < 2 or n.input[0] not in dynamic \
                or n.input[1] in dynamic or not _float_output(ctx, n):
            continue
        x = _value(ctx, n.input[0])
        if x is None or x.dtype.kind != "f":
            continue
        end = n
        after = _sole_readers(ctx, n.output[0])
        if len(after) == 1 and _bias_constant(ctx, after[0], n.output[0], dynamic) and _float_output(ctx, after[0]):
            end = after[0]
        y = ctx.values[end.output[0]]
        if y.shape == x.shape and y.dtype == x.dtype:
            sites.append(Site(end.name, (n.name, n.input[0])))
    return sites


def plant_layer_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node writing the layer's output made an Identity of its input (the layer pruned).  Planted: the
    Identity."""
    layer, x = site.detail
    node = node_by_name(ctx.proto, site.node)
    kind = node_by_name(ctx.proto, layer).op_type

    def variants():
        out = copy(ctx.proto)
        replace_node(out, site.node, [helper.make_node("Identity", [x], [node.output[0]], name=site.node)])
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"{kind} {layer}{' and its bias Add ' + site.node if site.node != layer else ''} "
            f"({list(_value(ctx, x).shape)} → same shape) left out: an Identity of its input {x}",
            {"layer": layer, "output_node": site.node, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "layer dropped")


# --------------------------------------------------------------------------- a softmax left unnormalised

def softmax_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Softmax nodes (opset ≥ 13) of a float tensor with ≥ 2 entries on their axis: ``(axis,)``."""
    if _opset(ctx) < 13:
        return []
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        v = ctx.values[n.output[0]]
        if not v.ndim:
            continue
        axis = _norm_axis(int(attribute(n, "axis", -1)), v.ndim)
        if v.shape[axis] >= 2:
            sites.append(Site(n.name, (axis,)))
    return sites


def plant_softmax_unnormalised(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Softmax replaced by ReduceMax (keepdims) → Sub → Exp over its axis; the Exp keeps its name and output.
    Planted: the three nodes."""
    (axis,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    x, y = node.input[0], node.output[0]

    def variants():
        out = copy(ctx.proto)
        top, shifted = unique_name(out, f"{x}_rowmax"), unique_name(out, f"{x}_shifted")
        name_max = unique_name(out, f"{site.node}_max")
        if _opset(ctx) >= 18:
            axes = _add_constant(out, f"{site.node}_axes", np.array([axis], np.int64))
            rmax = helper.make_node("ReduceMax", [x, axes], [top], name=name_max, keepdims=1)
        else:
            rmax = helper.make_node("ReduceMax", [x], [top], name=name_max, axes=[axis], keepdims=1)
        sub = helper.make_node("Sub", [x, top], [shifted], name=unique_name(out, f"{site.node}_shift"))
        exp = helper.make_node("Exp", [shifted], [y], name=site.node)
        replace_node(out, site.node, [rmax, sub, exp])
        checked = _checked(ctx, out, [y])
        yield None if checked is None else Planted(
            checked, [rmax.name, sub.name, site.node], "attribute-mismatch",
            f"Softmax {site.node} ({list(ctx.values[y].shape)}, axis {axis}) left unnormalised: exp(x − max) "
            f"without the division by its sum", {"softmax": site.node, "axis": axis})

    return _counting(ctx, variants(), "softmax unnormalised")


# --------------------------------------------------------------------------- sequential blocks run in parallel

def parallel_sites(ctx: FileContext) -> list[Site]:
    """Second residual Adds of consecutive pairs (:func:`sweep_faults_sixteen._residuals`; the first block ends at
    its Add, or at the norm that alone reads it) whose branch reads the first block's end s through ≤ 12 entry
    nodes (Shape nodes aside): ``(x, s, entries, first add)``, x the first block's input, of s's shape."""
    made = _producers(ctx.proto)
    res = _residuals(ctx)
    by_end = {}
    for add, k in res:
        by_end.setdefault(_block_end(ctx, add)[0], (add, k))
    sites = []
    for add2, k2 in res:
        s = add2.input[k2]
        if s not in by_end or by_end[s][0].name == add2.name:
            continue
        add1, k1 = by_end[s]
        x = add1.input[k1]
        xv, sv = _value(ctx, x), _value(ctx, s)
        if xv is None or sv is None or xv.shape != sv.shape or xv.dtype != sv.dtype:
            continue
        branch = _block(ctx.proto, s, add2.input[1 - k2], made)
        entries = [b for b in branch if s in b.input]
        counted = [b for b in entries if b.op_type not in SHAPE_OPS]
        if not counted or len(counted) > SEGMENT or not all(b.name for b in entries):
            continue
        sites.append(Site(add2.name, (x, s, tuple(b.name for b in entries), add1.name)))
    return sites


def plant_parallel_residual(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The second branch's entry nodes read x instead of s.  Planted: the entry nodes (Shape nodes aside)."""
    x, s, entries, add1 = site.detail

    def variants():
        out = copy(ctx.proto)
        for name in entries:
            _rewired(node_by_name(out, name), s, x)
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [node_by_name(ctx.proto, site.node).output[0]])
        planted = [n for n in entries if node_by_name(ctx.proto, n).op_type not in SHAPE_OPS]
        yield None if checked is None else Planted(
            checked, planted, "attribute-mismatch",
            f"residual blocks ending at Add {add1} and Add {site.node} run in parallel: the second block's branch "
            f"reads the first block's input {x} instead of its output {s} (x + f(x) + g(x))",
            {"adds": [add1, site.node], "entries": list(entries)})

    return _counting(ctx, variants(), "parallel residual")


# --------------------------------------------------------------------------- a gate in the other convention

GATES = ("Sigmoid", "HardSigmoid")


def gate_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Sigmoid / HardSigmoid nodes (float) read by a Mul of another computed tensor that is not the
    gate's own input (a SiLU's x·σ(x) is no gate): ``(gated muls,)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in GATES or not _onnx(n.domain) or not _float_output(ctx, n) or n.input[0] not in dynamic:
            continue
        muls = [r.name for r in readers(ctx.proto, n.output[0])
                if r.op_type == "Mul" and _onnx(r.domain) and len(r.input) == 2 and n.input[0] not in r.input
                and all(t in dynamic for t in r.input) and r.input[0] != r.input[1]]
        if muls:
            sites.append(Site(n.name, (tuple(muls),)))
    return sites


def plant_gate_complement(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Sub ``1 − z`` inserted after the gate (every reader of the gate reads it).  Planted: the Sub."""
    (muls,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype

    def variants():
        def build(o, raw, result):
            one = _add_constant(o, f"{site.node}_one", np.array(1, dtype))
            return [helper.make_node("Sub", [one, raw], [result], name=unique_name(o, f"{site.node}_complement"))]

        out, new = _after(ctx, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [new[0].name], "attribute-mismatch",
            f"{node.op_type} gate {site.node} ({list(ctx.values[node.output[0]].shape)}, gating {', '.join(muls)}) "
            f"read in the other convention: 1 − z for z", {"gate": site.node, "muls": list(muls)})

    return _counting(ctx, variants(), "gate complement")


# --------------------------------------------------------------------------- a gated unit's branches exchanged

GLU_SPAN = 10  # nodes of the gate's function F (a written-out tanh GELU: 8; gMLP's spatial gating: 4)
SIBLING_OPS = ("MatMul", "Gemm", "Conv", "Slice", "Gather")


def _siblings(ctx: FileContext, b: str, dynamic: set[str]) -> list[str]:
    """Tensors computed like ``b`` from the same tensor: the other outputs of b's Split; the outputs of the other
    MatMul / Gemm / Conv / Slice / Gather nodes reading the input b's producer reads (after the bias Add that alone
    reads them, where there is one)."""
    pb = producer(ctx.proto, b)
    if pb is None or not _onnx(pb.domain):
        return []
    if pb.op_type == "Split":
        return [o for o in pb.output if o and o != b]
    base = pb
    if pb.op_type == "Add" and len(pb.input) == 2:
        live = [i for i in pb.input if i in dynamic]
        q = producer(ctx.proto, live[0]) if len(live) == 1 else None
        if q is not None and _bias_constant(ctx, pb, live[0], dynamic) and q.op_type in SIBLING_OPS[:3]:
            base = q
    if base.op_type not in SIBLING_OPS or not base.input or base.input[0] not in dynamic:
        return []
    found = []
    for r in readers(ctx.proto, base.input[0]):
        if r.name == base.name or r.op_type != base.op_type or r.input[0] != base.input[0] or not r.output:
            continue
        t = r.output[0]
        after = _sole_readers(ctx, t)
        if len(after) == 1 and _bias_constant(ctx, after[0], t, dynamic):
            t = after[0].output[0]
        found.append(t)
    return found


def glu_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Muls ``F(a)·b`` of two computed float tensors of the output's shape: b and a siblings
    (:func:`_siblings`) of one shape and dtype, F the nodes computing the other operand p from a (≤ ``GLU_SPAN``,
    named, their other outputs read inside F alone, none computed from b): ``(b, a, p, F's entry nodes)``."""
    dynamic, made, outputs = _dynamic(ctx), _producers(ctx.proto), _graph_outputs(ctx)
    sites = []
    for m in _named(ctx.proto.graph.node):
        if m.op_type != "Mul" or not _onnx(m.domain) or len(m.input) != 2 or m.input[0] == m.input[1] \
                or not all(t in dynamic for t in m.input) or not _float_output(ctx, m):
            continue
        shape = ctx.values[m.output[0]].shape
        found = None
        for k in (0, 1):
            p, b = m.input[k], m.input[1 - k]
            bv = _value(ctx, b)
            if bv is None or bv.shape != shape:
                continue
            up = _ancestor_tensors(ctx.proto, p, made)
            if b in up:
                continue
            for a in _siblings(ctx, b, dynamic):
                av = _value(ctx, a)
                if a not in up or av is None or av.shape != bv.shape or av.dtype != bv.dtype:
                    continue
                span = _block(ctx.proto, a, p, made)
                names = {s.name for s in span}
                inner = {o for s in span for o in s.output if o and o != p}
                if not span or len(span) > GLU_SPAN or not all(s.name and _onnx(s.domain) for s in span) \
                        or inner & outputs or any(r.name not in names for t in inner for r in readers(ctx.proto, t)):
                    continue
                entries = [s.name for s in span if a in s.input]
                if len(entries) + 1 <= SEGMENT:
                    found = (b, a, p, tuple(entries))
                    break
            if found:
                break
        if found:
            sites.append(Site(m.name, found))
    return sites


def plant_glu_swapped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """F's entry nodes read b instead of a, the Mul reads a instead of b: ``F(b)·a``; nodes re-sorted.  Planted: F's
    entry nodes and the Mul."""
    b, a, p, entries = site.detail
    node = node_by_name(ctx.proto, site.node)

    def variants():
        out = copy(ctx.proto)
        for name in entries:
            _rewired(node_by_name(out, name), a, b)
        _rewired(node_by_name(out, site.node), b, a)
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [node.output[0]])
        kinds = sorted({n.op_type for n in _block(ctx.proto, a, p)})
        yield None if checked is None else Planted(
            checked, [*entries, site.node], "attribute-mismatch",
            f"gated unit at Mul {site.node} ({list(ctx.values[node.output[0]].shape)}) with its branches exchanged: "
            f"F({b})·{a} for F({a})·{b} (F: {', '.join(kinds)})",
            {"mul": site.node, "gated": a, "other": b, "f_entries": list(entries)})

    return _counting(ctx, variants(), "gated branches exchanged")


# --------------------------------------------------------------------------- the mask applied after the softmax

MASK_DEPTH = 6  # scalar scales / Casts between a mask and its Softmax


def _is_mask(value: np.ndarray | None) -> bool:
    """A float tensor whose entries are 0 or ≤ ``MASK_FLOOR`` (−inf included), both present."""
    if value is None or value.dtype.kind != "f" or not value.size or np.isnan(value).any():
        return False
    masked = value <= MASK_FLOOR
    return bool(masked.any()) and bool(np.all(masked | (value == 0))) and bool((value == 0).any())


def _mask_of(ctx: FileContext, soft: onnx.NodeProto, dynamic: set[str]) -> tuple | None:
    """``(form, mask node, reader, scores, mask)`` for the mask before the Softmax (through scalar scales and
    Casts, each tensor read by the next node alone): form ``"add"`` (scores + mask), ``"where"`` (Where(keep,
    scores, fill)) or ``"where-not"`` (Where(masked, fill, scores)); the reader reads the mask node's output."""
    outputs = _graph_outputs(ctx)
    t, reader = soft.input[0], soft
    for _ in range(MASK_DEPTH):
        p = producer(ctx.proto, t)
        if p is None or not p.name or not _onnx(p.domain) or t in outputs or len(readers(ctx.proto, t)) != 1:
            return None
        if p.op_type == "Add" and len(p.input) == 2:
            for k in (0, 1):
                if p.input[k] in dynamic and _is_mask(_value(ctx, p.input[1 - k])) \
                        and not _is_mask(_value(ctx, p.input[k])):
                    return "add", p.name, reader.name, p.input[k], p.input[1 - k]
            return None
        if p.op_type == "Where" and len(p.input) == 3:
            x, y = _value(ctx, p.input[1]), _value(ctx, p.input[2])
            for form, fill, kept, s in (("where", y, x, p.input[1]), ("where-not", x, y, p.input[2])):
                if fill is not None and kept is not None and fill.dtype.kind == "f" and fill.size \
                        and bool(np.all(fill <= MASK_FLOOR)) and not bool(np.all(kept <= MASK_FLOOR)) \
                        and s in dynamic:
                    return form, p.name, reader.name, s, p.input[0]
            return None
        s = _scalar_scale(ctx, p, dynamic)
        if s is not None:
            t, reader = s[0], p
        elif p.op_type in ("Cast", "Identity"):
            t, reader = p.input[0], p
        else:
            return None
    return None


def mask_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Softmax nodes over the last axis (float, rank ≥ 2) with a mask before them (:func:`_mask_of`)
    that masks some of the positions: ``(form, mask node, reader, scores, mask)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        rank = ctx.values[n.output[0]].ndim
        if rank < 2 or _norm_axis(int(attribute(n, "axis", -1)), rank) != rank - 1:
            continue
        found = _mask_of(ctx, n, dynamic)
        if found is not None:
            sites.append(Site(n.name, found))
    return sites


def plant_mask_after_softmax(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The reader of the masked scores reads the unmasked scores (the mask node removed); a Where(keep, p, 0)
    inserted after the Softmax, keep from a Greater(mask, −1) (the Add form), the Where's condition or its Not.
    Planted: the reader, the Greater / Not, the Where."""
    form, mask_node, reader, scores, mask = site.detail
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype
    masked = node_by_name(ctx.proto, mask_node).output[0]

    def variants():
        def build(o, raw, result):
            made, keep = [], mask
            if form == "add":
                keep = unique_name(o, f"{mask}_kept")
                floor = _add_constant(o, f"{site.node}_mask_floor", np.array(-1, _value(ctx, mask).dtype))
                made.append(helper.make_node("Greater", [mask, floor], [keep],
                                             name=unique_name(o, f"{site.node}_kept")))
            elif form == "where-not":
                keep = unique_name(o, f"{mask}_kept")
                made.append(helper.make_node("Not", [mask], [keep], name=unique_name(o, f"{site.node}_kept")))
            zero = _add_constant(o, f"{site.node}_masked_zero", np.array(0, dtype))
            made.append(helper.make_node("Where", [keep, raw, zero], [result],
                                         name=unique_name(o, f"{site.node}_masked_after")))
            return made

        out, new = _after(ctx, site.node, build)
        _rewired(node_by_name(out, reader), masked, scores)
        if not readers(out, masked):
            out.graph.node.remove(node_by_name(out, mask_node))
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [reader, *(n.name for n in new)], "attribute-mismatch",
            f"mask {mask} ({form}: {mask_node}) applied to the probabilities of Softmax {site.node} instead of its "
            f"scores: masked weights zeroed after the softmax, the kept ones not renormalised",
            {"softmax": site.node, "mask_node": mask_node, "form": form})

    return _counting(ctx, variants(), "mask after softmax")


# --------------------------------------------------------------------------- probabilities for logits

LOGIT_PASS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity", "Cast")
LOGIT_DEPTH = 6


def _logits(ctx: FileContext, tensor: str, dynamic: set[str], depth: int = LOGIT_DEPTH) -> str | None:
    """The op type of the layer ``tensor`` comes from when it is a layer's output (a MatMul / Gemm / Conv /
    ConvTranspose with a constant weight; through its bias Add, layout nodes, scalar scales, Concats and sums of
    such; "" when layout nodes are on the way); else None."""
    p = producer(ctx.proto, tensor)
    if p is None or depth < 0 or not _onnx(p.domain):
        return None
    if p.op_type in LAYERS:
        return p.op_type if len(p.input) > 1 and p.input[0] in dynamic and p.input[1] not in dynamic else None
    s = _scalar_scale(ctx, p, dynamic)
    if s is not None:
        return _logits(ctx, s[0], dynamic, depth - 1)
    if p.op_type in LOGIT_PASS:
        return "" if _logits(ctx, p.input[0], dynamic, depth - 1) is not None else None
    if p.op_type in ("Add", "Concat"):
        live = [i for i in p.input if i in dynamic]
        if p.op_type == "Add" and len(live) == 1 and not _bias_constant(ctx, p, live[0], dynamic):
            return None
        kinds = {_logits(ctx, i, dynamic, depth - 1) for i in live}
        if not live or None in kinds:
            return None
        return kinds.pop() if len(kinds) == 1 and p.op_type == "Add" else ""
    return None


def output_sites(ctx: FileContext) -> list[Site]:
    """Float graph outputs (rank ≥ 2) written by a named ONNX node that are a layer's output (:func:`_logits`):
    ``(output, axis)``, the axis the classes are on (1 for a Conv's output of rank ≥ 3, else the last)."""
    dynamic = _dynamic(ctx)
    sites = []
    for o in ctx.proto.graph.output:
        p = producer(ctx.proto, o.name)
        v = ctx.values.get(o.name)
        if p is None or not p.name or v is None or v.dtype.kind != "f" or v.ndim < 2:
            continue
        kind = _logits(ctx, o.name, dynamic)
        if kind is None:
            continue
        axis = 1 if kind in CHANNEL_LAYERS and v.ndim >= 3 else v.ndim - 1
        sites.append(Site(p.name, (o.name, axis)))
    return sites


def plant_output_activation(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The writer of the output writes a new tensor (its other readers read it), a Softmax over the classes' axis
    (a Sigmoid where it has one entry) writes the output.  Planted: the inserted node."""
    output, axis = site.detail
    v = ctx.values[output]

    def variants():
        out = copy(ctx.proto)
        raw = unique_name(out, f"{output}_logits")
        writer = node_by_name(out, site.node)
        for i, t in enumerate(writer.output):
            if t == output:
                writer.output[i] = raw
        for r in readers(out, output):
            _rewired(r, output, raw)
        if v.shape[axis] >= 2:
            act = helper.make_node("Softmax", [raw], [output], name=unique_name(out, f"{site.node}_probabilities"),
                                   axis=axis)
        else:
            act = helper.make_node("Sigmoid", [raw], [output], name=unique_name(out, f"{site.node}_probability"))
        insert_nodes(out, site.node, [], [act])
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [output])
        yield None if checked is None else Planted(
            checked, [act.name], "attribute-mismatch",
            f"graph output {output} ({list(v.shape)}) of {site.node} returned as probabilities: a {act.op_type}"
            f"{f' over axis {axis}' if act.op_type == 'Softmax' else ''} appended to the logits",
            {"output": output, "writer": site.node, "activation": act.op_type, "axis": axis})

    return _counting(ctx, variants(), "output activation")


KINDS = (
    FaultKind("kv-swapped", kv_sites, plant_kv_swapped, "attribute-mismatch",
              "attention run with its keys and values exchanged (attn(q, v, k), a qkv split in the order q, v, k)",
              max_tries=40),
    FaultKind("layer-dropped", layer_sites, plant_layer_dropped, "attribute-mismatch",
              "a shape-preserving MatMul / Gemm / Conv layer (with its bias) left out: an Identity of its input",
              max_tries=40),
    FaultKind("softmax-unnormalised", softmax_sites, plant_softmax_unnormalised, "attribute-mismatch",
              "a Softmax without its normalisation: exp(x − max) (an online softmax missing the final 1/l)",
              max_tries=40),
    FaultKind("parallel-residual", parallel_sites, plant_parallel_residual, "attribute-mismatch",
              "two sequential residual blocks run in parallel: s + g(x) for s + g(s), s = x + f(x)", max_tries=40),
    FaultKind("gate-complement", gate_sites, plant_gate_complement, "attribute-mismatch",
              "a sigmoid gate read in the other convention: 1 − z for z (a GRU / highway update gate, a mask)",
              max_tries=40),
    FaultKind("glu-swapped", glu_sites, plant_glu_swapped, "attribute-mismatch",
              "a gated unit's branches exchanged: F(b)·a for F(a)·b (gate_proj / up_proj swapped, GLU halves)",
              max_tries=40),
    FaultKind("mask-after-softmax", mask_sites, plant_mask_after_softmax, "attribute-mismatch",
              "an attention mask applied to the probabilities (zeroed, not renormalised) instead of the scores",
              max_tries=40),
    FaultKind("output-activation", output_sites, plant_output_activation, "attribute-mismatch",
              "a Softmax (Sigmoid) appended to a logits output: probabilities returned where the model returns "
              "logits", max_tries=40),
)
