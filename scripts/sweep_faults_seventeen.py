"""The seventeenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a hand-written port's, a converter's, an export wrapper's or a deployment's mistake the earlier
sets never planted:

* ``block-order`` — two consecutive residual blocks run in the opposite order (a port that lists a block's
  sub-layers in the wrong order — the MLP before the attention —, an ``nn.ModuleList`` rebuilt from an unordered
  mapping, a MobileNet stage whose blocks are read in reverse): ``x2 = g(f(x))`` computed as ``f(g(x))``.  Two
  residual Adds (:func:`sweep_faults_sixteen._residuals`) where the second's skip is the first's output (pre-LN), or
  the output of the norm that alone reads it (post-LN: each block ends with its norm, the second's too); the second
  block's entry nodes read the first's input, the first block's entry nodes and its Add read the second block's
  result, and the first block writes what the second wrote.  ``layer-repeated`` runs one block twice,
  ``residual-dropped`` skips one, ``norm-placement`` moves a norm across its block.  Expected ``attribute-mismatch``.
* ``act-before-layer`` — an activation applied to a layer's input instead of its output (a pre-activation ↔
  post-activation port: ResNet v2's BN-ReLU-Conv order against v1's Conv-BN-ReLU, an MLP written as
  ``fc(act(x))`` for ``act(fc(x))``): an activation (Relu, Clip, Gelu, LeakyRelu, Sigmoid, Tanh, HardSwish …) that
  reads a MatMul / Gemm / Conv output (directly or through its bias Add) moved before the layer, the layer reading
  the activated input and writing what the activation wrote.  Sites where the layer's input is already activated
  (``Relu(Relu(x))``: the move would only drop the activation, ``op-dropped``'s fault) are refused.
  ``bias-after-act`` moves only the bias.  Expected ``attribute-mismatch``.
* ``skip-normed`` — the residual taken from the normalised stream (the hand-port bug ``x = self.norm(x);
  x = x + self.attn(x)``, a converter fusing the norm into the residual path): a pre-LN residual Add whose branch
  begins with a norm of its skip x (LayerNormalization / SimplifiedLayerNormalization / RMSNormalization, or a
  written-out RMSNorm / LayerNorm with its weight and bias) reads the norm's output as its skip instead of x.
  ``input-rewired`` rewires an input to the nearest earlier tensor of its shape, ``norm-placement`` moves the norm
  after the Add.  Expected ``attribute-mismatch``.
* ``norm-dropped`` — a normalisation left out (a port that forgets the final ``ln_f``, a converter that drops a
  norm it cannot map, an ``nn.Identity`` where the config asks for a norm): a LayerNormalization /
  SimplifiedLayerNormalization / RMSNormalization / InstanceNormalization / GroupNormalization /
  BatchNormalization on a computed tensor, or a written-out RMSNorm / LayerNorm (its statistics, weight and bias),
  replaced by an Identity of its input.  ``norm-affine`` drops only the weight and bias, ``norm-kind`` changes the
  norm.  Expected ``attribute-mismatch``.
* ``scale-after-softmax`` — the attention temperature applied to the probabilities instead of the scores (a port
  writing ``softmax(q·kᵀ)·v / √d``, a linear-attention rewrite that moves the scale out of the exponent): every
  scalar Mul / Div on the way to a Softmax — on the scores between the scores MatMul and the Softmax (through the
  mask's Add / Where), or on the query or key before it (through Reshapes and Transposes: SDPA's √scale on both, a
  query pre-scaled by the module; Muls by one aside) — taken out, and a Mul by their product inserted after the
  Softmax.  ``scale-constant`` changes the scale's value.  Expected ``attribute-mismatch``.
* ``pos-embed-dropped`` — position information left out (``position_embedding_type`` read as one the model does
  not use, a converter that skips the rotary embedding, a port that drops the relative position bias): an Add of a
  constant absolute position table (≥ 2 positions whose rows differ, matching the activation's last two axes), a
  rotary rotation ``t·cos + rotate(t)·sin`` or an Add of a constant non-mask bias onto attention scores replaced by
  an Identity of the activation.  ``position-offset`` shifts the table, ``rope-table`` changes its frequencies.
  Expected ``attribute-mismatch`` (``weight-mismatch`` recorded as also accepted: the table looks zeroed).
* ``input-transposed`` — an image read with its height and width exchanged (a loader taking PIL's ``(w, h)`` size
  for numpy's ``(h, w)``, an export wrapper that permutes NHWC → NCWH): a Transpose exchanging the last two axes of a
  square (H = W) float graph input inserted before a Conv that reads it (directly or through an input Cast /
  quantizer).  ``axis-flipped`` mirrors the input, ``transpose-perm`` changes an existing Transpose.  Expected
  ``attribute-mismatch``.
* ``input-shifted`` — the input fed one step late (a decoder's ``shift_tokens_right`` applied by the export wrapper
  when the caller already shifts, a streaming front end one frame behind, an off-by-one crop): a graph input
  shifted by one position along its sequence / time / width axis — ``x[…, 0], x[…, 0], x[…, 1] … x[…, n−2]`` (the
  first position repeated, as a start token is) — by two Slices and a Concat inserted before a node that reads it
  (a Gather's token ids, a Conv's image or frames along the last axis, an RNN's time axis, a MatMul's sequence
  axis).  ``position-offset`` shifts a position table, ``axis-flipped`` reverses the input.  Expected
  ``attribute-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the entry nodes of both exchanged
blocks and the two Adds (they read the other block's stream; Shape nodes, whose output does not change, aside:
the nodes inside each block compute what they should from what they are given), sites with more than 12 of them
refused; the moved activation, the layer and its bias Add (the last writes the activation's old output); the
residual Add that reads the norm's output; the Identity left of the norm (the node that wrote the norm's output);
the nodes that read the removed scales and the inserted Mul; the Identity left of the position Add / rotation;
the inserted Transpose; the inserted Concat (the Slices before it cut the input, their values are the input's own).
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, insert_nodes,
                          node_by_name, producer, readers, replace_node, unique_name)
from sweep_faults_fifteen import _feed_of
from sweep_faults_nine import _onnx
from sweep_faults_sixteen import MS_DOMAIN, PLACED_NORMS, SEGMENT, _block, _producers, _residuals
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting
from sweep_faults_twelve import _float_output, _graph_outputs

LOOPS = ("LSTM", "GRU", "RNN", "Loop", "Scan", "If")
SHAPE_OPS = ("Shape", "Size")


def _toposorted(out: onnx.ModelProto) -> bool:
    """Reorder ``out``'s nodes (in place) so that every node follows the producers of its inputs, keeping the
    order otherwise (stable); False when there is a cycle."""
    made = {o for n in out.graph.node for o in n.output if o}
    ready = {i.name for i in out.graph.input} | {i.name for i in out.graph.initializer} | {""}
    pending, order = list(out.graph.node), []
    while pending:
        rest = []
        for n in pending:
            if all(i in ready or i not in made for i in n.input):
                order.append(n)
                ready.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            return False
        pending = rest
    nodes = [onnx.NodeProto() for _ in order]
    for dst, src in zip(nodes, order):
        dst.CopyFrom(src)
    out.graph.ClearField("node")
    out.graph.node.extend(nodes)
    return True


def _sole_readers(ctx: FileContext, tensor: str) -> list[onnx.NodeProto]:
    """The readers of ``tensor`` when it is no graph output (else an empty list)."""
    return [] if tensor in _graph_outputs(ctx) else readers(ctx.proto, tensor)


# --------------------------------------------------------------------------- norms (one node or written out)

NORM_NODES = PLACED_NORMS + ("InstanceNormalization", "GroupNormalization", "BatchNormalization")
NORMISH = ("Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Div", "Sub", "Cast")


def _reduces_last(ctx: FileContext, n: onnx.NodeProto) -> bool:
    """A ReduceMean (keepdims) over the last axis alone."""
    if n.op_type != "ReduceMean" or int(attribute(n, "keepdims", 1)) != 1:
        return False
    axes = attribute(n, "axes")
    if axes is None and len(n.input) > 1 and n.input[1]:
        axes = constant(ctx.proto, n.input[1])
    v = _value(ctx, n.input[0])
    if axes is None or v is None:
        return False
    axes = [int(a) % v.ndim for a in np.atleast_1d(axes)]
    return axes == [v.ndim - 1]


def _vector(ctx: FileContext, node: onnx.NodeProto, width: int) -> bool:
    """One operand of ``node`` is a constant of ``width`` entries along the last axis (a norm's weight or bias)."""
    for t in node.input:
        c = constant(ctx.proto, t)
        if c is not None and c.dtype.kind == "f" and c.size == width and (c.ndim == 0 or c.shape[-1] == width):
            return True
    return False


def _written_norms(ctx: FileContext) -> list[tuple[str, str, list[str]]]:
    """Written-out RMSNorms / LayerNorms over the last axis: ``(x, d, span)``, d the norm's output (after its
    weight Mul and bias Add where there are), span the names of the nodes computing d from x (all in
    ``NORMISH``, their other outputs read inside the span alone)."""
    dynamic, made, outputs = _dynamic(ctx), _producers(ctx.proto), _graph_outputs(ctx)
    found, taken = [], set()
    for m in _named(ctx.proto.graph.node):
        if m.op_type not in ("Mul", "Div") or not _onnx(m.domain) or len(m.input) != 2 \
                or not all(t in dynamic for t in m.input) or not _float_output(ctx, m):
            continue
        shape = ctx.values[m.output[0]].shape
        if not shape:
            continue
        for k in (0, 1):
            p, r = m.input[k], m.input[1 - k]
            pv, rv = _value(ctx, p), _value(ctx, r)
            if pv is None or rv is None or pv.shape != shape or rv.ndim != len(shape) or rv.shape[-1] != 1 \
                    or (m.op_type == "Div" and k != 0):
                continue
            x = p
            pn = made.get(p)
            if pn is not None and pn.op_type == "Sub" and _onnx(pn.domain):
                x = pn.input[0]
            span = _block(ctx.proto, x, m.output[0], made)
            if not any(_reduces_last(ctx, s) for s in span) or not all(s.op_type in NORMISH and s.name
                                                                     for s in span):
                continue
            d, width = m.output[0], shape[-1]
            for _ in range(2):  # weight Mul, bias Add
                after = [] if d in outputs else readers(ctx.proto, d)
                if len(after) == 1 and after[0].op_type in ("Mul", "Add") and after[0].name \
                        and _float_output(ctx, after[0]) and _vector(ctx, after[0], width) \
                        and ctx.values[after[0].output[0]].shape == shape:
                    d = after[0].output[0]
                else:
                    break
            span = _block(ctx.proto, x, d, made)
            names = {s.name for s in span}
            inner = {o for s in span for o in s.output if o and o != d}
            if not all(s.name and s.op_type in NORMISH for s in span) or inner & outputs or any(
                    r.name not in names for t in inner for r in readers(ctx.proto, t)):
                continue
            if d not in taken:
                taken.add(d)
                found.append((x, d, [s.name for s in span]))
            break
    return found


def _single_norm(ctx: FileContext, n: onnx.NodeProto) -> bool:
    outputs = _graph_outputs(ctx)
    return n.op_type in NORM_NODES and (_onnx(n.domain) or n.domain == MS_DOMAIN) and _float_output(ctx, n) \
        and not any(o and (o in outputs or readers(ctx.proto, o)) for o in n.output[1:])


def _norms(ctx: FileContext) -> list[tuple[str, str, list[str]]]:
    """Every norm on a computed tensor: ``(x, d, span)`` for single norm nodes and written-out ones."""
    dynamic = _dynamic(ctx)
    found = [(n.input[0], n.output[0], [n.name]) for n in _named(ctx.proto.graph.node)
             if _single_norm(ctx, n) and n.input[0] in dynamic]
    return found + _written_norms(ctx)


# --------------------------------------------------------------------------- two residual blocks exchanged

def _block_end(ctx: FileContext, add: onnx.NodeProto) -> tuple[str, str | None]:
    """(the block's output, the norm that ends it or None): the Add's output (through Casts / Identities that alone
    read it), or the output of a single norm that alone reads it (post-LN)."""
    end = add.output[0]
    after = _sole_readers(ctx, end)
    while len(after) == 1 and after[0].op_type in ("Cast", "Identity") and after[0].name \
            and _float_output(ctx, after[0]):  # a norm's upcast of its input (also the next block's skip)
        end = after[0].output[0]
        after = _sole_readers(ctx, end)
    if len(after) == 1 and _single_norm(ctx, after[0]) and after[0].op_type != "BatchNormalization" \
            and after[0].input[0] == end and after[0].name:
        return after[0].output[0], after[0].op_type
    return end, None


def _closed(ctx: FileContext, block: list[onnx.NodeProto], end: str) -> bool:
    """The block's tensors other than ``end`` are read inside it alone and are no graph outputs."""
    names = {b.name for b in block}
    outputs = _graph_outputs(ctx)
    for b in block:
        if not b.name or b.op_type in LOOPS:
            return False
        for o in b.output:
            if o and o != end and (o in outputs or any(r.name not in names for r in readers(ctx.proto, o))):
                return False
    return True


def order_sites(ctx: FileContext) -> list[Site]:
    """Second residual Adds of consecutive pairs: ``(x, s, e, first add, k1, k2)`` — the first block computes s
    from x, the second e from s."""
    made = _producers(ctx.proto)
    res = _residuals(ctx)
    by_end = {}
    for add, k in res:
        end, norm = _block_end(ctx, add)
        by_end[end] = (add, k, norm)
    sites = []
    for add2, k2 in res:
        s = add2.input[k2]
        if s not in by_end:
            continue
        add1, k1, norm1 = by_end[s]
        e, norm2 = _block_end(ctx, add2)
        if norm1 != norm2:
            continue
        x = add1.input[k1]
        first, second = _block(ctx.proto, x, s, made), _block(ctx.proto, s, e, made)
        if not first or not second or {b.name for b in first} & {b.name for b in second}:
            continue
        if not _closed(ctx, first, s) or not _closed(ctx, second, e) or s in _graph_outputs(ctx) \
                or any(r.name not in {b.name for b in second} for r in readers(ctx.proto, s)):
            continue
        made_first = {o for b in first for o in b.output if o}
        if any(i == x or (i in made_first and i != s) for b in second for i in b.input):
            continue
        shapes = {tuple(_value(ctx, t).shape) if _value(ctx, t) is not None else None for t in (x, s, e)}
        if len(shapes) != 1 or None in shapes:
            continue
        entries = [b for b in second if s in b.input] + [b for b in first if x in b.input]
        if len([b for b in entries if b.op_type not in SHAPE_OPS]) > SEGMENT:
            continue
        sites.append(Site(add2.name, (x, s, e, add1.name, k1, k2)))
    return sites


def plant_block_order(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The second block reads x and writes a new tensor t; the first reads t and writes e; nodes re-sorted.
    Planted: the rewired entry nodes of both blocks (both Adds among them)."""
    x, s, e, add1, k1, k2 = site.detail

    def variants():
        out = copy(ctx.proto)
        first, second = _block(out, x, s), _block(out, s, e)
        t = unique_name(out, f"{e}_reordered")
        rewired = []
        for b in second:
            if s in b.input:
                rewired.append(b)
            for i, name in enumerate(b.input):
                if name == s:
                    b.input[i] = x
            for i, name in enumerate(b.output):
                if name == e:
                    b.output[i] = t
        for b in first:
            if x in b.input:
                rewired.append(b)
            for i, name in enumerate(b.input):
                if name == x:
                    b.input[i] = t
            for i, name in enumerate(b.output):
                if name == s:
                    b.output[i] = e
        planted = [b.name for b in rewired if b.op_type not in SHAPE_OPS]
        if not _toposorted(out):
            yield None
            return
        checked = _checked(ctx, out, [e])
        yield None if checked is None else Planted(
            checked, planted, "attribute-mismatch",
            f"residual blocks ending at Add {add1} ({len(first)} nodes) and Add {site.node} ({len(second)} nodes) "
            f"run in the opposite order: the second on {x}, the first on its result",
            {"adds": [add1, site.node], "first_block": [b.name for b in first],
             "second_block": [b.name for b in second]})

    return _counting(ctx, variants(), "block order")


# --------------------------------------------------------------------------- an activation before its layer

ACTIVATIONS = ("Relu", "Clip", "Gelu", "LeakyRelu", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Elu", "Selu",
               "Celu", "Softplus", "Mish", "FastGelu", "QuickGelu", "Erf")
ACT_ARITH = ("Mul", "Add", "Div", "Sub", "Pow", "Neg", "Cast")  # the written-out activations' other nodes
ACT_SPAN = 6  # nodes of a written-out activation (the erf GELU: Div, Erf, Add, Mul, Mul)
LAYERS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedConv")


def _act_span(ctx: FileContext, a: str, dynamic: set[str], made: dict) -> list[onnx.NodeProto] | None:
    """The largest activation computed from ``a`` alone: the nodes from ``a`` to one output (≤ ``ACT_SPAN``, all
    activations or elementwise arithmetic with constant operands, one of them an activation), reading every
    reader of ``a``, their other outputs read inside alone; None when there is none."""
    outputs = _graph_outputs(ctx)
    shape = _value(ctx, a).shape
    users = readers(ctx.proto, a)
    if not users or a in outputs:
        return None
    seen, frontier, order = set(), list(users), []
    for _ in range(ACT_SPAN):
        nxt = []
        for n in frontier:
            if n.name in seen or not n.name or n.op_type not in ACTIVATIONS + ACT_ARITH \
                    or not (_onnx(n.domain) or n.domain == MS_DOMAIN):
                continue
            seen.add(n.name)
            order.append(n)
            nxt += [r for o in n.output if o for r in readers(ctx.proto, o)]
        frontier = nxt
    best = None
    for end in order:
        y = end.output[0]
        if y not in ctx.values or ctx.values[y].shape != shape:
            continue
        span = _block(ctx.proto, a, y, made)
        names = {s.name for s in span}
        if not span or len(span) > ACT_SPAN or not all(s.name in seen for s in span) \
                or not any(s.op_type in ACTIVATIONS for s in span) or any(u.name not in names for u in users):
            continue
        inner = {o for s in span for o in s.output if o and o != y}
        if inner & outputs or any(r.name not in names for t in inner for r in readers(ctx.proto, t)):
            continue
        if any(i in dynamic and i != a and made.get(i) is not None and made[i].name not in names
               for s in span for i in s.input):
            continue
        if best is None or len(span) > len(best):
            best = span
    return best


def act_sites(ctx: FileContext) -> list[Site]:
    """Activations (one node, or written out: the erf / tanh GELU, x·σ(x)) of a named layer's output (a MatMul /
    Gemm / Conv with a constant weight, directly or through a bias Add of a constant), each tensor on the way read
    by the next node alone: ``(layer, bias add or "", activation nodes)``, named by the activation's last node."""
    dynamic, made = _dynamic(ctx), _producers(ctx.proto)
    sites = []
    for p in _named(ctx.proto.graph.node):
        if p.op_type not in LAYERS or not (_onnx(p.domain) or p.domain == MS_DOMAIN) or not _float_output(ctx, p) \
                or p.input[0] not in dynamic or len(p.input) < 2 or p.input[1] in dynamic:
            continue
        xv = _value(ctx, p.input[0])
        if xv is None or xv.dtype.kind != "f":
            continue
        a, bias = p.output[0], ""
        after = _sole_readers(ctx, a)
        if len(after) == 1 and after[0].op_type == "Add" and after[0].name and len(after[0].input) == 2 \
                and _onnx(after[0].domain):
            other = [i for i in after[0].input if i != a]
            c = constant(ctx.proto, other[0]) if len(other) == 1 else None
            if c is not None and c.dtype.kind == "f" and c.size == ctx.values[a].shape[
                    1 if p.op_type in ("Conv", "ConvTranspose", "FusedConv") else -1]:
                bias, a = after[0].name, after[0].output[0]
        span = _act_span(ctx, a, dynamic, made)
        if span is not None:
            sites.append(Site(span[-1].name, (p.name, bias, tuple(s.name for s in span))))
    return sites


def plant_act_before_layer(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The activation's nodes moved before the layer, reading its input and writing a new tensor the layer reads;
    the layer's last node (its bias Add, else itself) writes the activation's old output.  Planted: the moved
    activation nodes, the layer, its bias Add."""
    layer_name, bias, span = site.detail
    layer = node_by_name(ctx.proto, layer_name)
    x = layer.input[0]
    a = node_by_name(ctx.proto, bias or layer_name).output[0]
    y = node_by_name(ctx.proto, site.node).output[0]
    kinds = [node_by_name(ctx.proto, s).op_type for s in span]

    def variants():
        out = copy(ctx.proto)
        xa = unique_name(out, f"{x}_activated")
        rename = {a: x, y: xa}
        moved = []
        for name in span:
            original = node_by_name(out, name)
            m = onnx.NodeProto()
            m.CopyFrom(original)
            m.ClearField("metadata_props")
            out.graph.node.remove(original)
            moved.append(m)
        for m in moved:
            for i, o in enumerate(m.output):
                if o and o not in rename:
                    rename[o] = unique_name(out, f"{o}_early")
        for m in moved:
            for i, t in enumerate(m.input):
                m.input[i] = rename.get(t, t)
            for i, o in enumerate(m.output):
                m.output[i] = rename.get(o, o)
        node_by_name(out, layer_name).input[0] = xa
        node_by_name(out, bias or layer_name).output[0] = y
        insert_nodes(out, layer_name, moved, [])
        if not _toposorted(out):  # a moved node reading a Constant made after the layer (TorchScript's Clip bounds)
            raise NoVariant("the moved activation cannot be ordered before the layer")
        probe = ctx.tensors(out, [xa])[xa]
        if np.array_equal(probe, _value(ctx, x)):
            raise NoVariant("the layer's input is already activated: moving the activation would only drop it")
        checked = _checked(ctx, out, [y])
        what = kinds[0] if len(kinds) == 1 else f"written-out activation ({', '.join(kinds)})"
        yield None if checked is None else Planted(
            checked, [*span, layer_name] + ([bias] if bias else []), "attribute-mismatch",
            f"{what} {site.node} applied to the input of {layer.op_type} {layer_name} instead of its output "
            f"({'through bias Add ' + bias if bias else 'no bias Add'})",
            {"activation": list(span), "layer": layer_name, "bias": bias})

    return _counting(ctx, variants(), "activation before layer")


# --------------------------------------------------------------------------- the residual taken from the norm

def skip_sites(ctx: FileContext) -> list[Site]:
    """Residual Adds (:func:`sweep_faults_sixteen._residuals`) whose branch begins with a norm of the skip x (one
    node or written out) of x's shape: ``(k, d)``, d the norm's output."""
    made = _producers(ctx.proto)
    norms = {}
    for x, d, span in _norms(ctx):
        norms.setdefault(x, []).append((d, span))
    sites = []
    for add, k in _residuals(ctx):
        x, g = add.input[k], add.input[1 - k]
        names = {b.name for b in _block(ctx.proto, x, g, made)}
        for d, span in norms.get(x, []):
            dv = _value(ctx, d)
            if set(span) <= names and dv is not None and dv.shape == _value(ctx, x).shape:
                sites.append(Site(add.name, (k, d)))
                break
    return sites


def plant_skip_normed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Add's skip input set to the norm's output.  Planted: the Add."""
    k, d = site.detail
    add = node_by_name(ctx.proto, site.node)
    x = add.input[k]

    def variants():
        out = copy(ctx.proto)
        node_by_name(out, site.node).input[k] = d
        checked = _checked(ctx, out, [add.output[0]])
        yield None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"residual Add {site.node} takes its skip from the normalised stream {d} instead of {x} "
            f"(x = norm(x); x = x + f(x))", {"add": site.node, "norm_output": d, "skip": x})

    return _counting(ctx, variants(), "skip normed")


# --------------------------------------------------------------------------- a norm left out

def dropped_sites(ctx: FileContext) -> list[Site]:
    """Every norm on a computed tensor (:func:`_norms`): ``(x, d, span)``, named by the node writing d."""
    sites = []
    for x, d, span in _norms(ctx):
        sites.append(Site(producer(ctx.proto, d).name, (x, d, tuple(span))))
    return sites


def plant_norm_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node writing the norm's output made an Identity of its input (the span's other nodes pruned).
    Planted: the Identity."""
    x, d, span = site.detail
    kinds = sorted({node_by_name(ctx.proto, s).op_type for s in span})

    def variants():
        out = copy(ctx.proto)
        ident = helper.make_node("Identity", [x], [d], name=site.node)
        replace_node(out, site.node, [ident])
        checked = _checked(ctx, out, [d])
        what = kinds[0] if len(span) == 1 else f"written-out norm ({len(span)} nodes: {', '.join(kinds)})"
        yield None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"{what} {site.node} left out: an Identity of its input {x}", {"norm": list(span)})

    return _counting(ctx, variants(), "norm dropped")


# --------------------------------------------------------------------------- the scale after the Softmax

LAYOUT_OPS = ("Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Identity", "Cast")
MASK_OPS = ("Add", "Where", "Sub")


def _scalar_scale(ctx: FileContext, n: onnx.NodeProto, dynamic: set[str]) -> tuple[str, float] | None:
    """(the scaled input, its factor) for a Mul / Div of a computed tensor by a scalar constant."""
    if n.op_type not in ("Mul", "Div") or not _onnx(n.domain) or len(n.input) != 2 or not n.name:
        return None
    for k in (0, 1):
        c = constant(ctx.proto, n.input[1 - k])
        if n.input[k] in dynamic and c is not None and c.size == 1 and c.dtype.kind == "f" \
                and (n.op_type == "Mul" or k == 0):
            f = float(c.reshape(-1)[0])
            if f == 0 or not math.isfinite(f):
                return None
            return n.input[k], (f if n.op_type == "Mul" else 1 / f)
    return None


def scale_sites(ctx: FileContext) -> list[Site]:
    """Named Softmaxes over the last axis whose scores come from a MatMul (through mask Adds / Wheres and scalar
    Muls / Divs) with the scalar scales on the way found: ``(scales, product)``, each scale a named node read by
    one node."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        v = ctx.values[n.output[0]]
        if v.ndim < 3 or int(attribute(n, "axis", -1)) % v.ndim != v.ndim - 1:
            continue
        scales, t, matmul = [], n.input[0], None
        for _ in range(6):
            p = producer(ctx.proto, t)
            if p is None:
                break
            if p.op_type == "MatMul":
                matmul = p
                break
            s = _scalar_scale(ctx, p, dynamic)
            if s is not None:
                if s[1] != 1:  # (a Mul by one — SDPA's √scale of an explicit scale 1 — scales nothing)
                    scales.append((p.name, s[1]))
                t = s[0]
            elif p.op_type in MASK_OPS and p.op_type != "Where":
                live = [i for i in p.input if i in dynamic]
                if not live:
                    break
                t = next((i for i in live if (q := producer(ctx.proto, i)) is not None and q.op_type != "Where"),
                         live[0])
            elif p.op_type == "Where" and len(p.input) == 3:
                t = p.input[1] if p.input[1] in dynamic else p.input[2]
            else:
                break
        if matmul is None:
            continue
        for operand in matmul.input[:2]:
            t = operand
            for _ in range(6):
                p = producer(ctx.proto, t)
                if p is None:
                    break
                s = _scalar_scale(ctx, p, dynamic)
                if s is not None:
                    if s[1] != 1:
                        scales.append((p.name, s[1]))
                    t = s[0]
                    continue
                if p.op_type not in LAYOUT_OPS:
                    break
                t = p.input[0]
        if not scales:
            continue
        product = float(np.prod([f for _, f in scales]))
        if abs(product - 1) < 1e-3 or any(len(_sole_readers(ctx, node_by_name(ctx.proto, s).output[0])) != 1
                                          for s, _ in scales):
            continue
        sites.append(Site(n.name, (tuple(s for s, _ in scales), product)))
    return sites


def plant_scale_after_softmax(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The scale nodes taken out (their reader reads the unscaled tensor), a Mul by the product inserted after the
    Softmax.  Planted: the scale nodes' readers and the Mul."""
    scales, product = site.detail
    node = node_by_name(ctx.proto, site.node)
    dtype = ctx.values[node.output[0]].dtype
    dynamic = _dynamic(ctx)

    def variants():
        def build(o, raw, result):
            c = _add_constant(o, f"{site.node}_late_scale", np.array(product, dtype))
            return [helper.make_node("Mul", [raw, c], [result], name=unique_name(o, f"{site.node}_scaled"))]

        out, new = _after(ctx, site.node, build)
        rewired = []
        for name in scales:
            s = node_by_name(out, name)
            src = _scalar_scale(ctx, node_by_name(ctx.proto, name), dynamic)[0]
            for r in readers(out, s.output[0]):
                for i, t in enumerate(r.input):
                    if t == s.output[0]:
                        r.input[i] = src
                rewired.append(r.name)
            out.graph.node.remove(s)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [*dict.fromkeys(rewired), new[0].name], "attribute-mismatch",
            f"attention scale {product:.4g} ({', '.join(scales)}) taken out of the scores and applied after "
            f"Softmax {site.node}: softmax(q·kᵀ)·{product:.4g}", {"softmax": site.node, "scales": list(scales),
                                                               "factor": product})

    return _counting(ctx, variants(), "scale after softmax")


# --------------------------------------------------------------------------- position information dropped

MASK_FLOOR = -100.0  # a bias with an entry at or below it is a mask (Swin's -100, -1e4, -inf), not a position bias


def _into_softmax(ctx: FileContext, tensor: str) -> bool:
    """``tensor`` reaches a Softmax through at most three scalar / mask / layout nodes."""
    frontier = [tensor]
    for _ in range(4):
        nxt = []
        for t in frontier:
            for r in readers(ctx.proto, t):
                if r.op_type == "Softmax":
                    return True
                if r.op_type in MASK_OPS + LAYOUT_OPS + ("Mul", "Div"):
                    nxt += [o for o in r.output if o]
        frontier = nxt
    return False


def position_sites(ctx: FileContext) -> list[Site]:
    """``("table", a)``: a named Add of a computed float tensor a and a non-computed float table whose last two axes
    match a's (≥ 2 positions, rows differing) that does not feed a Softmax; ``("bias", a)``: an Add of a
    non-computed non-mask float bias onto scores that feed a Softmax; ``("rotary", t)``: an Add of ``t·C1`` and
    ``u·C2`` (C1, C2 non-computed, u computed from t within five nodes)."""
    dynamic = _dynamic(ctx)
    made = _producers(ctx.proto)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Add" or not _onnx(n.domain) or len(n.input) != 2 or not _float_output(ctx, n):
            continue
        live = [i for i in n.input if i in dynamic]
        shape = ctx.values[n.output[0]].shape
        if len(live) == 1:
            a = live[0]
            table = _value(ctx, next(i for i in n.input if i != a))
            av = _value(ctx, a)
            if table is None or av is None or av.shape != shape or table.dtype.kind != "f" or table.ndim < 2 \
                    or len(shape) < 2 or tuple(table.shape[-2:]) != tuple(shape[-2:]) or shape[-2] < 2 \
                    or shape[-1] < 2:
                continue
            if np.any(table <= MASK_FLOOR) or not np.isfinite(table).all():
                continue
            if _into_softmax(ctx, n.output[0]):
                sites.append(Site(n.name, ("bias", a)))
            elif table.reshape(-1, *table.shape[-2:]).std(axis=-2).max() > 0:
                sites.append(Site(n.name, ("table", a)))
        elif len(live) == 2:
            muls = [made.get(i) for i in n.input]
            if not all(m is not None and m.op_type == "Mul" and len(m.input) == 2 for m in muls):
                continue
            parts = []
            for m in muls:
                d = [i for i in m.input if i in dynamic]
                if len(d) != 1:
                    break
                parts.append(d[0])
            if len(parts) != 2:
                continue
            for k in (0, 1):
                t, u = parts[k], parts[1 - k]
                near, frontier = set(), {u}
                for _ in range(5):
                    frontier = {i for f in frontier if f in made for i in made[f].input if i in dynamic}
                    near |= frontier
                tv = _value(ctx, t)
                if t in near and tv is not None and tv.shape == shape:
                    sites.append(Site(n.name, ("rotary", t)))
                    break
    return sites


def plant_pos_embed_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Add replaced by an Identity of the activation (the rotation's nodes pruned).  Planted: the Identity."""
    how, a = site.detail
    node = node_by_name(ctx.proto, site.node)

    def variants():
        out = copy(ctx.proto)
        replace_node(out, site.node, [helper.make_node("Identity", [a], [node.output[0]], name=site.node)])
        checked = _checked(ctx, out, [node.output[0]])
        what = {"table": "absolute position table added", "bias": "position bias added to the scores",
                "rotary": "rotary rotation"}[how]
        yield None if checked is None else Planted(
            checked, [site.node], "attribute-mismatch",
            f"{what} at Add {site.node} ({list(ctx.values[node.output[0]].shape)}) left out: an Identity of {a}",
            {"add": site.node, "form": how, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "position dropped")


# --------------------------------------------------------------------------- an image read transposed

def transposed_sites(ctx: FileContext) -> list[Site]:
    """Named Convs reading a square (H = W > 1) rank-4 float graph input (directly or through Casts / an input
    quantizer): ``(tensor,)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("Conv", "ConvTranspose") or not _onnx(n.domain) or _feed_of(ctx, n.input[0]) is None:
            continue
        x = _value(ctx, n.input[0])
        if x is not None and x.dtype.kind == "f" and x.ndim == 4 and x.shape[2] == x.shape[3] > 1:
            sites.append(Site(n.name, (n.input[0],)))
    return sites


def plant_input_transposed(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Transpose (perm 0, 1, 3, 2) inserted on the Conv's input.  Planted: the Transpose."""
    (tensor,) = site.detail
    node = node_by_name(ctx.proto, site.node)

    def variants():
        out = copy(ctx.proto)
        swapped = unique_name(out, f"{tensor}_hw_swapped")
        t = helper.make_node("Transpose", [tensor], [swapped], name=unique_name(out, f"{site.node}_hw_swap"),
                             perm=[0, 1, 3, 2])
        node_by_name(out, site.node).input[0] = swapped
        insert_nodes(out, site.node, [t], [])
        checked = _checked(ctx, out, node.output)
        yield None if checked is None else Planted(
            checked, [t.name], "attribute-mismatch",
            f"input {tensor} ({list(_value(ctx, tensor).shape)}) of {node.op_type} {site.node} read with its height "
            f"and width exchanged (a Transpose 0, 1, 3, 2 inserted)", {"conv": site.node, "input": tensor})

    return _counting(ctx, variants(), "input transposed")


# --------------------------------------------------------------------------- the input one step late

def shifted_sites(ctx: FileContext) -> list[Site]:
    """Named nodes reading a graph input (directly or through Casts / an input quantizer) with ≥ 3 positions on
    the axis: a Gather's indices (last axis), a Conv's input of rank ≥ 3 (last axis), an LSTM / GRU / RNN's
    sequence (time axis), a MatMul's first input of rank ≥ 3 (axis −2): ``(tensor, input index, axis)``."""
    sites = []
    for n in _named(ctx.proto.graph.node):
        if not _onnx(n.domain):
            continue
        if n.op_type == "Gather" and len(n.input) > 1:
            k = 1
        elif n.op_type in ("Conv", "ConvTranspose", "LSTM", "GRU", "RNN", "MatMul", "Gemm"):
            k = 0
        else:
            continue
        tensor = n.input[k]
        if _feed_of(ctx, tensor) is None:
            continue
        x = _value(ctx, tensor)
        if x is None or x.ndim < 2:
            continue
        if n.op_type in ("LSTM", "GRU", "RNN"):
            axis = 1 if attribute(n, "layout", 0) else 0
        elif n.op_type in ("MatMul", "Gemm"):
            if x.ndim < 3:
                continue
            axis = x.ndim - 2
        elif n.op_type in ("Conv", "ConvTranspose") and x.ndim < 3:
            continue
        else:
            axis = x.ndim - 1
        if x.shape[axis] >= 3:
            sites.append(Site(n.name, (tensor, k, axis)))
    return sites


def plant_input_shifted(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Slice [0:1] and Slice [0:n−1] along the axis, concatenated, read by the node.  Planted: the Concat."""
    tensor, k, axis = site.detail
    node = node_by_name(ctx.proto, site.node)
    n = _value(ctx, tensor).shape[axis]

    def variants():
        out = copy(ctx.proto)
        c = {key: _add_constant(out, f"{site.node}_shift_{key}", np.array([v], np.int64))
             for key, v in (("zero", 0), ("one", 1), ("last", n - 1), ("axis", axis))}
        head, body, shifted = (unique_name(out, f"{tensor}_{s}") for s in ("first", "early", "shifted"))
        new = [helper.make_node("Slice", [tensor, c["zero"], c["one"], c["axis"]], [head],
                                name=unique_name(out, f"{site.node}_shift_first")),
               helper.make_node("Slice", [tensor, c["zero"], c["last"], c["axis"]], [body],
                                name=unique_name(out, f"{site.node}_shift_early"))]
        cat = helper.make_node("Concat", [head, body], [shifted], name=unique_name(out, f"{site.node}_shift"),
                               axis=axis)
        node_by_name(out, site.node).input[k] = shifted
        insert_nodes(out, site.node, [*new, cat], [])
        checked = _checked(ctx, out, node.output)
        yield None if checked is None else Planted(
            checked, [cat.name], "attribute-mismatch",
            f"input {tensor} ({list(_value(ctx, tensor).shape)}) of {node.op_type} {site.node} shifted by one "
            f"position along axis {axis} (the first position repeated, the last dropped)",
            {"node": site.node, "input": tensor, "axis": axis})

    return _counting(ctx, variants(), "input shifted")


KINDS = (
    FaultKind("block-order", order_sites, plant_block_order, "attribute-mismatch",
              "two consecutive residual blocks run in the opposite order: g(f(x)) computed as f(g(x))", max_tries=40),
    FaultKind("act-before-layer", act_sites, plant_act_before_layer, "attribute-mismatch",
              "an activation applied to a layer's input instead of its output (pre- ↔ post-activation)",
              max_tries=40),
    FaultKind("skip-normed", skip_sites, plant_skip_normed, "attribute-mismatch",
              "a pre-LN residual taken from the normalised stream: x = norm(x); x = x + f(x)", max_tries=40),
    FaultKind("norm-dropped", dropped_sites, plant_norm_dropped, "attribute-mismatch",
              "a normalisation (one node or written out) left out: an Identity of its input", max_tries=40),
    FaultKind("scale-after-softmax", scale_sites, plant_scale_after_softmax, "attribute-mismatch",
              "the attention scale taken out of the scores and applied to the Softmax's output", max_tries=40),
    FaultKind("pos-embed-dropped", position_sites, plant_pos_embed_dropped, "attribute-mismatch",
              "an absolute position table, a rotary rotation or a position bias on the scores left out",
              max_tries=40),
    FaultKind("input-transposed", transposed_sites, plant_input_transposed, "attribute-mismatch",
              "a square image input read with its height and width exchanged", max_tries=40),
    FaultKind("input-shifted", shifted_sites, plant_input_shifted, "attribute-mismatch",
              "a graph input fed one position late along its sequence / time / width axis", max_tries=40),
)
