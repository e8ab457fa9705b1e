"""The nineteenth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a hand-written port's, a converter's, a checkpoint loader's or a deployment's mistake the earlier
sets never planted:

* ``softmax-sink`` — an attention given a sink it does not have (``nn.MultiheadAttention(add_zero_attn=True)`` read
  wrong, a port of a model with attention sinks / a "quiet" softmax₁ applied to one without): every query also
  attends to a zero key with a zero value, so the probabilities lose the share ``1 / (1 + Σ exp(s))``.  An
  attention Softmax is one over the last axis (≥ 2 keys) whose probabilities a MatMul / Einsum reads with a
  computed value operand (:func:`sweep_faults_eighteen._probs_product`); a Mul by ``σ(logsumexp(s))`` over the
  keys (ReduceLogSumExp → Sigmoid) is inserted after it.  ``softmax-unnormalised`` drops the normalisation,
  ``softmax-chunked`` normalises per block, ``mask-after-softmax`` zeroes probabilities.  Expected
  ``attribute-mismatch``.
* ``groups-dropped`` — a grouped / depthwise convolution run as a dense one (a port writing ``nn.Conv2d(C, C, k)``
  without ``groups=C``, a converter without grouped-convolution support) with the checkpoint kernel broadcast over
  every input channel: a Conv (ONNX or com.microsoft FusedConv) with ``group`` g > 1, a constant float kernel
  ``(Cout, Cin/g, k…)`` and a computed input gets ``group`` 1 and the kernel tiled g times along its input
  channels (then, where that does not count, also divided by g).  ``conv-dilation`` and ``stride-moved`` change other
  attributes, ``channel-pruned`` zeroes a channel.  Expected ``attribute-mismatch`` (``weight-mismatch`` recorded
  as also accepted: the kernel changes shape).
* ``rnn-gate-bias`` — a recurrent layer's biases converted in another framework's convention: TensorFlow's
  ``BasicLSTMCell`` / Keras' ``unit_forget_bias`` forget-gate bias of 1 added at run time and added again on a
  checkpoint that holds it (or left out), and a GRU's recurrent candidate bias folded into its input bias (``b_ih +
  b_hh`` summed for every gate, as an LSTM's may be — wrong for the candidate of a GRU with
  ``linear_before_reset``, where the recurrent bias sits inside ``r ⊙ (…)``).  Sites: ONNX LSTM nodes (the
  forget-gate block of ``Wb``, +1 then −1, every direction) and GRU nodes with ``linear_before_reset`` = 1 and a
  non-zero recurrent candidate bias ``Rbh`` (moved into ``Wbh``); the bias input a constant, computed from constants
  or absent (LSTM).  ``rnn-attr`` flips ``linear_before_reset``, ``rnn-layout`` exchanges gate blocks.  Expected
  ``weight-mismatch``.
* ``input-layout`` — an input buffer in the other memory layout reshaped instead of transposed (an OpenCV / PIL
  ``H × W × C`` image, a ``T × F`` feature matrix passed with ``.reshape(1, C, H, W)``, a channels-last tensor's
  ``.view``): a float graph input of rank ≥ 3 with ≥ 2 entries on axis 1 and on the axes after it is read, by every
  node, through a Transpose moving axis 1 last (the buffer a channels-last pipeline holds) and a Reshape back to the
  input's shape (then, for rank ≥ 4, the last axis moved to 1).  ``input-transposed`` exchanges an image's height and
  width, ``view-for-permute`` writes an inner Transpose as a Reshape.  Expected ``attribute-mismatch``.
* ``qkv-interleaved`` — an attention's query, key and value projections loaded from a fused ``qkv`` weight read in
  the other head layout (GPT-NeoX / BLOOM / Megatron store it per head, interleaved ``(H, 3, d)``; most ports split
  it blocked, ``(3, H, d)``; a conversion script that fuses or splits it the other way): the three weights (and
  biases) written into one blocked ``[q; k; v]`` buffer and read back as interleaved (then the other way round), so
  each projection gets head blocks of all three.  Sites: an attention Softmax (:func:`sink_sites`) whose scores
  MatMul reads queries and keys and whose value product reads values of rank 4 ``(B, H, S, d)``, H ≥ 2, each
  computed through layout nodes and scalar scales (:func:`sweep_faults_eighteen._kv_chain`) from its own MatMul /
  Gemm (its bias Add, or the Gemm's C) with a constant weight of H·d output channels, the three reading one input
  with weights of one shape; a missing bias is read as zero (a bias Add inserted where it no longer is).
  ``kv-swapped`` exchanges keys and values whole, ``weights-exchanged`` two weights, ``rows-permuted`` one weight's
  rows.  Expected ``weight-mismatch``.
* ``bottleneck-act`` — a linear layer given the activation of its block (a port building every convolution with
  a ``ConvBNAct`` helper where MobileNet's linear bottleneck, ShuffleNet's depthwise convolution or a ResNet
  block's last convolution has none): a Conv (or a com.microsoft FusedConv without a fused activation) with a
  constant kernel whose output (after the bias Add that alone reads it) goes only to other Convs' inputs or to
  residual Adds, in a file where other Convs are followed by an activation (Relu, Clip, LeakyRelu, HardSwish, Gelu
  …, a SiLU's Sigmoid and Mul, a FusedConv's fused Relu / LeakyRelu / Clip): a copy of the nearest such activation
  (then a Relu) is inserted after it.  ``op-doubled`` repeats an activation, ``output-activation``
  appends one to a graph output, ``act-before-layer`` moves one.  Expected ``attribute-mismatch``.
* ``class-offset`` — the classes (or the vocabulary) of an output head read one position off (a TF-slim ImageNet
  head with 1001 classes whose background class 0 was not dropped, a label map with / without a background entry,
  a vocabulary with a special token added or missing at its front): the output channels of the layer whose output
  is a graph output (:func:`_head`: a MatMul / Gemm with the classes on the last axis, a Conv with them on axis 1,
  through per-class bias Adds, scalar scales, Casts and — for the products — layout nodes keeping the last axis)
  rolled by one, its bias and the per-class bias Adds with them (+1, then −1).  ``vocab-swap`` exchanges two
  embedding rows, ``rows-permuted`` permutes a projection's rows within heads.  Expected ``weight-mismatch``.
* ``kernel-standardized`` — a convolution's kernel standardised the model does not standardise (a BiT / ResNetV2
  ``StdConv2d`` put where the checkpoint's layer is a plain ``nn.Conv2d``, timm's ``std_conv`` option read wrong):
  the constant float kernel of a Conv (≥ 2 entries per output channel, not already standardised) replaced by
  ``(W − mean) / sqrt(var + 1e-6)`` per output channel.  ``weightnorm-axis`` folds a weight norm along the wrong
  axis, ``weight-noise`` perturbs a weight.  Expected ``weight-mismatch``.

Each follows :mod:`sweep_faults`' conventions (``candidates`` / ``plant``, :class:`~sweep_faults.NoVariant` when no
variant works at a site) and finds its sites by graph structure and values alone, never by names.  Where a kind has
several variants at a site it takes the first, in its order of preference, whose outputs diverge from PyTorch's by
≥ 2× the tolerance (optimizations on and off), via :func:`sweep_faults_nine._pick`; a site where even the strongest
variant stays under 2× the tolerance raises :class:`~sweep_faults.NoVariant` (:func:`sweep_faults_thirteen._counting`),
so every planted fault of this set counts.  A planted file whose edits read a tensor made later in the node list is
re-sorted (:func:`sweep_faults_seventeen._toposorted`), so that it stays topologically sorted.

Planted nodes: only the nodes whose own output is wrong, changed or inserted — the inserted ReduceLogSumExp,
Sigmoid and Mul; the dense Conv; the LSTM / GRU; the inserted Transpose and Reshape; the three projections, the bias
Adds whose constant changed and the inserted bias Adds; the inserted activation node(s); the head and the bias Adds
whose constant changed; the Conv.  Sites with more than 12 are refused.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          folded, insert_nodes, is_float_array, node_by_name, producer, prune, readers, set_attr,
                          unique_name, with_input_constant, with_own_constant)
from sweep_faults_eighteen import _bias_constant, _kv_chain, _probs_product, _rewired
from sweep_faults_nine import _onnx
from sweep_faults_ops import _opset
from sweep_faults_seventeen import _scalar_scale, _sole_readers, _toposorted
from sweep_faults_sixteen import MS_DOMAIN, SEGMENT
from sweep_faults_ten import _checked, _dynamic, _named, _value
from sweep_faults_thirteen import _add_constant, _after, _counting, _norm_axis
from sweep_faults_twelve import _float_output, _graph_outputs


def _ours(node: onnx.NodeProto) -> bool:
    """An ONNX or com.microsoft node."""
    return _onnx(node.domain) or node.domain == MS_DOMAIN


def _with_value(ctx: FileContext, out: onnx.ModelProto, name: str, index: int, value: np.ndarray) -> onnx.ModelProto:
    """Copy of ``out`` whose node ``name`` reads ``value`` at input ``index``: the constant changed where it is (a
    private copy where others read it); for a tensor computed from constants (or an absent optional input) a new
    initializer, the nodes that computed the old one dropped when nothing else reads them."""
    node = node_by_name(out, name)
    if index < len(node.input) and node.input[index] and constant(out, node.input[index]) is not None:
        return with_own_constant(out, name, index, value, "planted")
    if index < len(node.input) and node.input[index]:
        done = with_input_constant(out, name, index, value)
    else:
        done = copy(out)
        target = node_by_name(done, name)
        while len(target.input) <= index:
            target.input.append("")
        target.input[index] = _add_constant(done, f"{name}_bias", np.asarray(value))
    prune(done, dead_nodes(ctx.proto))
    return done


def _forget_shape(out: onnx.ModelProto, tensor: str) -> None:
    """Drop (in place) the recorded type of an initializer whose shape changed (value_info, or its graph input)."""
    if not any(i.name == tensor for i in out.graph.initializer):
        return
    for field in (out.graph.value_info, out.graph.input):
        for vi in [vi for vi in field if vi.name == tensor]:
            field.remove(vi)


# --------------------------------------------------------------------------- an attention given a sink

def sink_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX Softmax nodes (opset ≥ 13) over the last axis (≥ 2 entries, rank ≥ 2) whose probabilities
    a value product reads (:func:`sweep_faults_eighteen._probs_product`): ``(axis, value product)``."""
    if _opset(ctx) < 13:
        return []
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type != "Softmax" or not _onnx(n.domain) or not _float_output(ctx, n):
            continue
        v = ctx.values[n.output[0]]
        if v.ndim < 2:
            continue
        axis = _norm_axis(int(attribute(n, "axis", -1)), v.ndim)
        if axis != v.ndim - 1 or v.shape[axis] < 2:
            continue
        pv = _probs_product(ctx, n)
        if pv is not None:
            sites.append(Site(n.name, (axis, pv.name)))
    return sites


def plant_softmax_sink(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Softmax writes a new tensor; a Mul by Sigmoid(ReduceLogSumExp(scores)) over its axis (keepdims) writes
    its output: ``exp(s) / (1 + Σ exp(s))``, a zero logit's share taken.  Planted: the three inserted nodes."""
    axis, pv = site.detail
    node = node_by_name(ctx.proto, site.node)
    x = node.input[0]

    def variants():
        def build(o, raw, result):
            lse, kept = unique_name(o, f"{x}_logsumexp"), unique_name(o, f"{x}_kept_share")
            name = unique_name(o, f"{site.node}_sink_logsumexp")
            if _opset(ctx) >= 18:
                axes = _add_constant(o, f"{site.node}_sink_axes", np.array([axis], np.int64))
                reduce = helper.make_node("ReduceLogSumExp", [x, axes], [lse], name=name, keepdims=1)
            else:
                reduce = helper.make_node("ReduceLogSumExp", [x], [lse], name=name, axes=[axis], keepdims=1)
            share = helper.make_node("Sigmoid", [lse], [kept], name=unique_name(o, f"{site.node}_sink_share"))
            return [reduce, share, helper.make_node("Mul", [raw, kept], [result],
                                                    name=unique_name(o, f"{site.node}_sink"))]

        out, new = _after(ctx, site.node, build)
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [n.name for n in new], "attribute-mismatch",
            f"attention Softmax {site.node} ({list(ctx.values[node.output[0]].shape)}, axis {axis}, read by {pv}) "
            f"given a sink: a zero logit with a zero value added to its normalisation (add_zero_attn), the "
            f"probabilities scaled by σ(logsumexp(scores))", {"softmax": site.node, "values": pv, "axis": axis})

    return _counting(ctx, variants(), "softmax sink")


# --------------------------------------------------------------------------- a grouped convolution run dense

GROUPED = ("Conv", "FusedConv")


def _convs(ctx: FileContext):
    """``(node, kernel)`` of the named Conv / FusedConv nodes on a computed input with a float output and a
    constant float kernel of rank ≥ 3."""
    dynamic = _dynamic(ctx)
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in GROUPED or not _ours(n) or len(n.input) < 2 or n.input[0] not in dynamic \
                or not _float_output(ctx, n):
            continue
        w = constant(ctx.proto, n.input[1])
        if is_float_array(w) and w.ndim >= 3:
            yield n, w


def groups_sites(ctx: FileContext) -> list[Site]:
    """Named Conv / FusedConv nodes with ``group`` > 1, a constant float kernel (rank ≥ 3) and a computed input:
    ``(groups,)``."""
    groups = ((n, int(attribute(n, "group", 1))) for n, _ in _convs(ctx))
    return [Site(n.name, (g,)) for n, g in groups if g > 1]


def plant_groups_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """``group`` set to 1, the kernel tiled g times along its input channels (then also divided by g).  Planted:
    the Conv."""
    (g,) = site.detail
    node = node_by_name(ctx.proto, site.node)
    w = constant(ctx.proto, node.input[1])
    tiled = np.tile(w, (1, g) + (1,) * (w.ndim - 2))

    def variants():
        for value, how in ((tiled, "broadcast over every input channel"),
                           ((tiled.astype(np.float64) / g).astype(w.dtype), "broadcast and divided by the groups")):
            out = with_own_constant(ctx.proto, site.node, 1, value, "dense")
            conv = node_by_name(out, site.node)
            set_attr(conv, "group", 1)
            _forget_shape(out, conv.input[1])
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, [site.node], "attribute-mismatch",
                f"{node.op_type} {site.node} with group={g} run as a dense convolution (group=1): its kernel "
                f"{list(w.shape)} {how} ({list(value.shape)})",
                {"conv": site.node, "groups": g, "how": how, "also_accepted": "weight-mismatch"})

    return _counting(ctx, variants(), "groups dropped")


# --------------------------------------------------------------------------- recurrent biases in another convention

def _bias_value(ctx: FileContext, node: onnx.NodeProto) -> np.ndarray | None:
    """The RNN's bias input B when it is a constant or computed from constants; else None."""
    if len(node.input) < 4 or not node.input[3]:
        return None
    return folded(ctx, node.input[3])


def rnn_bias_sites(ctx: FileContext) -> list[Site]:
    """Named ONNX LSTM nodes (bias constant, computed from constants or absent) and GRU nodes with
    ``linear_before_reset`` = 1 whose recurrent candidate bias is non-zero, on a computed sequence:
    ``(op, hidden, directions)``."""
    dynamic = _dynamic(ctx)
    sites = []
    for n in _named(ctx.proto.graph.node):
        if n.op_type not in ("LSTM", "GRU") or not _onnx(n.domain) or not n.input or n.input[0] not in dynamic:
            continue
        hidden = int(attribute(n, "hidden_size", 0) or 0)
        dirs = 2 if attribute(n, "direction", "forward") == "bidirectional" else 1
        gates = 8 if n.op_type == "LSTM" else 6
        b = _bias_value(ctx, n)
        if hidden < 1 or (b is not None and (b.dtype.kind != "f" or b.shape != (dirs, gates * hidden))):
            continue
        if len(n.input) > 3 and n.input[3] and b is None:
            continue
        if n.op_type == "GRU" and (not int(attribute(n, "linear_before_reset", 0)) or b is None
                                   or not np.any(b[:, 5 * hidden:6 * hidden])):
            continue
        sites.append(Site(n.name, (n.op_type, hidden, dirs)))
    return sites


def plant_rnn_gate_bias(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """LSTM: 1 added to (then taken from) the forget gate's input bias ``Wb_f`` of every direction; GRU: the
    recurrent candidate bias ``Rbh`` moved into ``Wbh``.  Planted: the node."""
    op, hidden, dirs = site.detail
    node = node_by_name(ctx.proto, site.node)
    b = _bias_value(ctx, node)
    if b is None:  # an LSTM without a bias: all zero
        dtype = _value(ctx, node.input[1]).dtype if _value(ctx, node.input[1]) is not None else np.float32
        b = np.zeros((dirs, 8 * hidden), dtype)
    h = hidden

    def variants():
        if op == "LSTM":
            plans = []
            for delta in (1.0, -1.0):
                new = b.astype(np.float64)
                new[:, 2 * h:3 * h] += delta  # ONNX gate order i, o, f, c
                plans.append((new, f"forget-gate bias {delta:+g} (TensorFlow's forget_bias "
                                   f"{'added on a checkpoint holding it' if delta > 0 else 'left out'})"))
        else:
            new = b.astype(np.float64)
            new[:, 2 * h:3 * h] += new[:, 5 * h:6 * h]  # ONNX gate order z, r, h; Wb then Rb
            new[:, 5 * h:6 * h] = 0
            plans = [(new, "recurrent candidate bias Rbh folded into the input bias Wbh (b_ih + b_hh summed, "
                           "outside r ⊙ (…))")]
        for value, how in plans:
            out = _with_value(ctx, ctx.proto, site.node, 3, value.astype(b.dtype))
            checked = _checked(ctx, out, [o for o in node.output if o])
            yield None if checked is None else Planted(
                checked, [site.node], "weight-mismatch",
                f"{op} {site.node} (hidden {h}, {dirs} direction{'s' if dirs > 1 else ''}) with its biases in "
                f"another framework's convention: {how}", {"rnn": site.node, "how": how})

    return _counting(ctx, variants(), "recurrent gate bias")


# --------------------------------------------------------------------------- an input buffer in the other layout

def _layout_perms(rank: int) -> list[tuple[int, ...]]:
    """Axis 1 moved last (a channels-last buffer); for rank ≥ 4 also the last axis moved to 1."""
    perms = [(0, *range(2, rank), 1)]
    if rank >= 4:
        perms.append((0, rank - 1, *range(1, rank - 1)))
    return perms


def layout_sites(ctx: FileContext) -> list[Site]:
    """Float graph inputs of rank ≥ 3 with ≥ 2 entries on axis 1 and on the axes after it, read by a named node:
    ``(input,)``, the site named by its first reader."""
    sites, seen = [], set()
    for n in ctx.proto.graph.node:
        for t in n.input:
            if t not in ctx.feeds or t in seen:
                continue
            seen.add(t)
            x = ctx.feeds[t]
            if n.name and x.dtype.kind == "f" and x.ndim >= 3 and x.shape[1] >= 2 and int(np.prod(x.shape[2:])) >= 2:
                sites.append(Site(n.name, (t,)))
    return sites


def plant_input_layout(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A Transpose (axis 1 moved last) and a Reshape to the input's shape inserted on the input, every reader
    rewired to it.  Planted: the Transpose and the Reshape."""
    (feed,) = site.detail
    x = ctx.feeds[feed]
    first = [r.output[0] for r in readers(ctx.proto, feed) if r.output]

    def variants():
        for perm in _layout_perms(x.ndim):
            out = copy(ctx.proto)
            moved, read = unique_name(out, f"{feed}_other_layout"), unique_name(out, f"{feed}_as_read")
            shape = _add_constant(out, f"{feed}_read_shape", np.array([0, *x.shape[1:]], np.int64))
            for n in out.graph.node:
                _rewired(n, feed, read)
            t = helper.make_node("Transpose", [feed], [moved], name=unique_name(out, f"{site.node}_layout"),
                                 perm=list(perm))
            r = helper.make_node("Reshape", [moved, shape], [read], name=unique_name(out, f"{site.node}_layout_view"))
            insert_nodes(out, site.node, [t, r], [])
            if not _toposorted(out):
                yield None
                continue
            checked = _checked(ctx, out, first)
            held = [x.shape[i] for i in perm]
            yield None if checked is None else Planted(
                checked, [t.name, r.name], "attribute-mismatch",
                f"input {feed} {list(x.shape)} fed as a buffer in another layout ({held}: axes {list(perm)}) "
                f"reshaped to {list(x.shape)} instead of transposed", {"input": feed, "perm": list(perm)})

    return _counting(ctx, variants(), "input layout")


# --------------------------------------------------------------------------- output heads

HEAD_PRODUCTS = ("MatMul", "Gemm", "FusedMatMul", "FusedGemm")
HEAD_CONVS = ("Conv", "FusedConv")
HEAD_PASS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Cast")
HEAD_DEPTH = 8


def _class_axis(value: np.ndarray, classes: int, rank: int, axis: int) -> int | None:
    """The axis of a broadcast per-class constant (``axis`` of a rank-``rank`` output) holding the classes, when
    its other axes have one entry; else None."""
    k = value.ndim - (rank - axis)
    if k < 0 or value.shape[k] != classes or any(s != 1 for i, s in enumerate(value.shape) if i != k):
        return None
    return k


def _weight_axis(node: onnx.NodeProto, w: np.ndarray) -> int | None:
    """The axis of the layer's weight holding its output channels."""
    if node.op_type in HEAD_CONVS:
        return 0
    if w.ndim < 2:
        return None
    if node.op_type in ("Gemm", "FusedGemm", "FusedMatMul") and int(attribute(node, "transB", 0)):
        return w.ndim - 2
    return w.ndim - 1


def _head(ctx: FileContext, tensor: str, dynamic: set[str]) -> tuple | None:
    """``(layer, class count, bias adds)`` for a graph output computed by a layer with a constant (or
    constant-computed) float weight: a MatMul / Gemm with the classes on the last axis (through its per-class bias
    Adds, scalar scales and layout nodes keeping the last axis), or a Conv with them on axis 1 (through per-class
    bias Adds, scalar scales, Casts and Identities); bias adds ``(name, input index, axis)``; else None."""
    rank = ctx.values[tensor].ndim if tensor in ctx.values else 0
    if rank < 2:
        return None
    classes = ctx.values[tensor].shape[-1]
    adds, t, layout = [], tensor, False
    for _ in range(HEAD_DEPTH):
        p = producer(ctx.proto, t)
        if p is None or not p.name or not _ours(p) or t not in ctx.values:
            return None
        v = ctx.values[t]
        if p.op_type in HEAD_PRODUCTS + HEAD_CONVS:
            if len(p.input) < 2 or p.input[0] not in dynamic or p.input[1] in dynamic:
                return None
            w = folded(ctx, p.input[1])
            if not is_float_array(w) or (p.op_type in HEAD_CONVS and (layout or v.ndim < 3)):
                return None
            axis = _weight_axis(p, w)
            out_axis = 1 if p.op_type in HEAD_CONVS else v.ndim - 1
            if p.op_type in HEAD_CONVS:
                classes = v.shape[1]
                adds = [(a, k, _class_axis(_value(ctx, node_by_name(ctx.proto, a).input[k]), classes, rank, 1))
                        for a, k, _ in adds]
                if any(ax is None for _, _, ax in adds):
                    return None
            if axis is None or w.shape[axis] != classes or v.shape[out_axis] != classes or classes < 2:
                return None
            return p, classes, tuple(adds)
        if p.op_type == "Add" and len(p.input) == 2 and _onnx(p.domain):
            live = [i for i in p.input if i in dynamic]
            if len(live) != 1 or not _bias_constant(ctx, p, live[0], dynamic):
                return None
            k = 1 - list(p.input).index(live[0])
            c = _value(ctx, p.input[k])
            if c.ndim > v.ndim:
                return None
            adds.append((p.name, k, _class_axis(c, classes, v.ndim, v.ndim - 1)))
            t = live[0]
            continue
        s = _scalar_scale(ctx, p, dynamic)
        if s is not None:
            t = s[0]
            continue
        if p.op_type in HEAD_PASS and p.input and p.input[0] in dynamic and p.input[0] in ctx.values:
            before = ctx.values[p.input[0]]
            if p.op_type not in ("Identity", "Cast"):
                if not before.ndim or before.shape[-1] != v.shape[-1]:
                    return None
                layout = True
            t = p.input[0]
            continue
        return None
    return None


def _heads(ctx: FileContext) -> list[tuple[str, tuple]]:
    """``(graph output, head)`` for each float graph output computed by a named layer (:func:`_head`) whose per-class
    bias Adds all hold one vector over the classes."""
    dynamic, found, seen = _dynamic(ctx), [], set()
    for o in ctx.proto.graph.output:
        v = ctx.values.get(o.name)
        if v is None or v.dtype.kind != "f":
            continue
        head = _head(ctx, o.name, dynamic)
        if head is None or head[0].name in seen or any(ax is None for _, _, ax in head[2]):
            continue
        seen.add(head[0].name)
        found.append((o.name, head))
    return found


# --------------------------------------------------------------------------- q, k, v read from an interleaved layout

QKV_LAYERS = ("MatMul", "Gemm")


def _projection(ctx: FileContext, tensor: str, dynamic: set[str]) -> tuple | None:
    """``(layer, bias)`` when ``tensor`` (the deepest of an attention operand's layout chain) is a MatMul / Gemm
    output with a constant float weight of rank 2 on a computed input, or its bias Add's output; bias ``(node, input
    index)`` of the bias Add or of the Gemm's constant C, else None."""
    p = producer(ctx.proto, tensor)
    bias = None
    if p is not None and p.op_type == "Add" and _onnx(p.domain) and p.name and len(p.input) == 2:
        live = [i for i in p.input if i in dynamic]
        if len(live) == 1 and _bias_constant(ctx, p, live[0], dynamic):
            bias, p = (p.name, 1 - list(p.input).index(live[0])), producer(ctx.proto, live[0])
    if p is None or p.op_type not in QKV_LAYERS or not _onnx(p.domain) or not p.name or len(p.input) < 2 \
            or p.input[0] not in dynamic or len(_sole_readers(ctx, p.output[0])) != 1:
        return None
    if p.op_type == "Gemm" and len(p.input) > 2 and p.input[2]:
        if bias is not None or not is_float_array(constant(ctx.proto, p.input[2])):
            return None
        bias = (p.name, 2)
    w = constant(ctx.proto, p.input[1])
    if not is_float_array(w) or w.ndim != 2:
        return None
    return p, bias


def _out_axis(layer: onnx.NodeProto) -> int:
    return 0 if layer.op_type == "Gemm" and int(attribute(layer, "transB", 0)) else 1


def qkv_sites(ctx: FileContext) -> list[Site]:
    """Attention Softmaxes (:func:`sink_sites`) whose scores product reads queries and keys and whose value product
    reads values of rank 4 ``(B, H, S, d)`` (H ≥ 2) computed through layout nodes and scalar scales from three
    distinct projections (:func:`_projection`) of one input, their weights of one shape and dtype with H·d output
    channels: ``((q layer, bias node, bias input), (k …), (v …), H, d)``, bias node "" where there is none."""
    dynamic = _dynamic(ctx)
    sites = []
    for s in sink_sites(ctx):
        soft, pv = node_by_name(ctx.proto, s.node), node_by_name(ctx.proto, s.detail[1])
        t, scores = soft.input[0], None
        for _ in range(8):
            p = producer(ctx.proto, t)
            if p is None:
                break
            if p.op_type == "MatMul" and _onnx(p.domain) and len(p.input) == 2 and all(i in dynamic for i in p.input):
                scores = p
                break
            live = [i for i in p.input if i in dynamic]
            if len(live) != 1:
                break
            t = live[0]
        if scores is None:
            continue
        q, v = _value(ctx, scores.input[0]), _value(ctx, pv.input[1])
        if q is None or v is None or q.ndim != 4 or v.ndim != 4 or q.shape[1] < 2 or v.shape[1] != q.shape[1]:
            continue
        heads, d = q.shape[1], q.shape[3]
        found = []
        for operand in (scores.input[0], scores.input[1], pv.input[1]):
            proj = _projection(ctx, _kv_chain(ctx, operand, dynamic)[-1], dynamic)
            if proj is None:
                break
            found.append(proj)
        if len(found) != 3 or len({f[0].name for f in found}) != 3 or len({f[0].input[0] for f in found}) != 1:
            continue
        ws = [constant(ctx.proto, f[0].input[1]) for f in found]
        axes = [_out_axis(f[0]) for f in found]
        if len({(w.shape[a], w.shape[1 - a], w.dtype) for w, a in zip(ws, axes)}) != 1 \
                or ws[0].shape[axes[0]] != heads * d:
            continue
        sites.append(Site(s.node, (*((f[0].name, *(f[1] or ("", -1))) for f in found), heads, d)))
    return sites


def _interleaved(blocks: list[np.ndarray], heads: int, d: int, variant: int) -> list[np.ndarray]:
    """The q, k, v blocks (output channels first) written into one fused buffer and read back in the other layout:
    a blocked ``(3, H, d)`` buffer read as interleaved ``(H, 3, d)`` (variant 0), an interleaved one read as blocked
    (variant 1)."""
    rest = blocks[0].shape[1:]
    fused = np.stack([b.reshape(heads, d, *rest) for b in blocks])  # (3, H, d, …)
    if variant == 0:
        parts = fused.reshape(heads, 3, d, *rest).swapaxes(0, 1)
    else:
        parts = fused.swapaxes(0, 1).reshape(3, heads, d, *rest)
    return [np.ascontiguousarray(parts[i].reshape(heads * d, *rest)) for i in range(3)]


def plant_qkv_interleaved(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The three projections' weights (and biases: a missing one read as zero, a bias Add inserted where it is no
    longer zero) replaced by their fused ``[q; k; v]`` read in the other head layout.  Planted: the projections,
    the bias Adds whose constant changed and the inserted bias Adds."""
    *projs, heads, d = site.detail
    layers = [node_by_name(ctx.proto, p) for p, _, _ in projs]
    axes = [_out_axis(n) for n in layers]
    ws = [constant(ctx.proto, n.input[1]) for n in layers]
    biases = [(a, k, _value(ctx, node_by_name(ctx.proto, a).input[k])) if a else None for _, a, k in projs]
    size = heads * d
    flat = [np.zeros(size, ws[0].dtype) if b is None else np.broadcast_to(b[2], b[2].shape).reshape(-1)
            for b in biases]
    if any(f.size != size for f in flat):
        raise NoVariant("a bias is not one vector over the output channels")
    names = ("queries", "keys", "values")

    def variants():
        for variant in (0, 1):
            new_w = _interleaved([w if a == 0 else w.T for w, a in zip(ws, axes)], heads, d, variant)
            new_b = _interleaved(flat, heads, d, variant)
            out, planted = ctx.proto, []
            for n, a, b, nb, bias in zip(layers, axes, new_w, new_b, biases):
                out = with_own_constant(out, n.name, 1, np.ascontiguousarray(b if a == 0 else b.T), "interleaved")
                planted.append(n.name)
                nb = nb.reshape(-1).astype(ws[0].dtype)
                if bias is not None:
                    name, k, old = bias
                    value = nb.reshape(old.shape)
                    if not np.array_equal(value, old):
                        out = with_own_constant(out, name, k, value, "interleaved")
                        if name not in planted:
                            planted.append(name)
                elif np.any(nb):
                    out = copy(out)
                    target = node_by_name(out, n.name)
                    raw = unique_name(out, f"{target.output[0]}_unbiased")
                    result = target.output[0]
                    target.output[0] = raw
                    c = _add_constant(out, f"{n.name}_interleaved_bias", nb)
                    add = helper.make_node("Add", [raw, c], [result], name=unique_name(out, f"{n.name}_bias"))
                    insert_nodes(out, n.name, [], [add])
                    planted.append(add.name)
            checked = _checked(ctx, out, [n.output[0] for n in layers])
            how = "blocked (3, H, d) read as interleaved (H, 3, d)" if variant == 0 else "interleaved read as blocked"
            if checked is None or len(planted) > SEGMENT:
                yield None
                continue
            yield Planted(
                checked, planted, "weight-mismatch",
                f"attention at Softmax {site.node}: the {', '.join(names)} projections "
                f"{', '.join(n.name for n in layers)} ({heads} heads of {d}) loaded from their fused [q; k; v] in the "
                f"other head layout ({how})",
                {"softmax": site.node, "projections": [n.name for n in layers], "heads": heads, "variant": variant})

    return _counting(ctx, variants(), "qkv interleaved")


# --------------------------------------------------------------------------- the classes read one position off

def offset_sites(ctx: FileContext) -> list[Site]:
    """Heads (:func:`_heads`) with ≥ 2 classes and ≤ 11 bias Adds: ``(output, classes, bias adds)``."""
    return [Site(layer.name, (output, classes, adds)) for output, (layer, classes, adds) in _heads(ctx)
            if 1 + len(adds) <= SEGMENT]


def plant_class_offset(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The head's weight (its output channels), its own bias (Gemm C, Conv B) and the per-class bias Adds rolled by
    one class (+1, then −1).  Planted: the head and the bias Adds whose constant changed."""
    output, classes, adds = site.detail
    node = node_by_name(ctx.proto, site.node)
    w = folded(ctx, node.input[1])
    axis = _weight_axis(node, w)

    def variants():
        for shift in (1, -1):
            out = _with_value(ctx, ctx.proto, site.node, 1, np.roll(w, shift, axis=axis))
            if len(node.input) > 2 and node.input[2]:
                b = folded(ctx, node.input[2])
                if b is not None and b.ndim >= 1 and b.shape[-1] == classes:
                    out = _with_value(ctx, out, site.node, 2, np.roll(b, shift, axis=-1))
            planted = [site.node]
            for a, k, ax in adds:
                c = _value(ctx, node_by_name(ctx.proto, a).input[k])
                rolled = np.roll(c, shift, axis=ax)
                if not np.array_equal(rolled, c):
                    out = with_own_constant(out, a, k, rolled, "rolled")
                    planted.append(a)
            checked = _checked(ctx, out, [node.output[0]])
            yield None if checked is None else Planted(
                checked, planted, "weight-mismatch",
                f"output head {node.op_type} {site.node} (output {output}, {classes} classes) read one class off: "
                f"its output channels{' and bias Adds ' + ', '.join(a for a, _, _ in adds) if adds else ''} rolled "
                f"by {shift:+d} (class i computed with row i{-shift:+d})",
                {"head": site.node, "output": output, "shift": shift, "bias_adds": [a for a, _, _ in adds]})

    return _counting(ctx, variants(), "class offset")


# --------------------------------------------------------------------------- a linear bottleneck activated

ACTS = ("Relu", "Clip", "LeakyRelu", "HardSwish", "Gelu", "Elu", "Selu", "Celu", "Softplus", "Mish", "PRelu")
FUSED_ACTS = ("Relu", "LeakyRelu", "Clip")  # a com.microsoft FusedConv's activations copied as nodes


def _conv_end(ctx: FileContext, conv: onnx.NodeProto, dynamic: set[str]) -> onnx.NodeProto:
    """The Conv, or the bias Add that alone reads its output."""
    after = _sole_readers(ctx, conv.output[0])
    if len(after) == 1 and _bias_constant(ctx, after[0], conv.output[0], dynamic) and _float_output(ctx, after[0]):
        return after[0]
    return conv


def _activation(ctx: FileContext, tensor: str) -> list[onnx.NodeProto] | None:
    """The activation that alone reads ``tensor``: ``[node]`` (an ONNX ``ACTS`` node; a PRelu with a scalar slope),
    ``[sigmoid, mul]`` (a SiLU written out); else None."""
    after = _sole_readers(ctx, tensor)
    if len(after) == 1 and after[0].op_type in ACTS and _onnx(after[0].domain) and after[0].input[0] == tensor:
        if after[0].op_type == "PRelu":
            slope = constant(ctx.proto, after[0].input[1])
            if slope is None or slope.size != 1:
                return None
        return after
    if len(after) == 2:
        sig = [r for r in after if r.op_type == "Sigmoid" and _onnx(r.domain)]
        mul = [r for r in after if r.op_type == "Mul" and _onnx(r.domain)]
        if sig and mul and sorted(mul[0].input) == sorted([tensor, sig[0].output[0]]):
            return [sig[0], mul[0]]
    return None


def _layer_input(ctx: FileContext, r: onnx.NodeProto, tensor: str, dynamic: set[str]) -> bool:
    """``r`` is a Conv reading ``tensor`` as its input with a constant kernel, or a residual Add of ``tensor`` and
    another computed tensor of its shape."""
    if not _ours(r):
        return False
    if r.op_type in GROUPED and _ours(r):
        return r.input[0] == tensor and len(r.input) > 1 and r.input[1] not in dynamic and tensor not in r.input[1:]
    if r.op_type == "Add" and len(r.input) == 2 and r.input[0] != r.input[1]:
        other = r.input[1] if r.input[0] == tensor else r.input[0]
        return other in dynamic and other in ctx.values and ctx.values[other].shape == ctx.values[tensor].shape
    return False


def bottleneck_sites(ctx: FileContext) -> list[Site]:
    """Named Convs (ONNX, or com.microsoft FusedConv without a fused activation) with a constant float kernel and a
    computed input whose output (after its bias Add) is read only by Convs (as their input) and residual Adds, in a
    file where other such Convs are activated (a FusedConv's fused Relu / LeakyRelu / Clip counts):
    ``(conv, template)``, the template the names of the nearest activation's nodes (or of that FusedConv), named by
    the Conv's end node."""
    dynamic, outputs = _dynamic(ctx), _graph_outputs(ctx)
    convs = [n for n in _named(ctx.proto.graph.node)
             if n.op_type in GROUPED and _ours(n) and len(n.input) > 1 and n.input[0] in dynamic
             and is_float_array(constant(ctx.proto, n.input[1])) and _float_output(ctx, n)]
    acted = {}
    for i, c in enumerate(convs):
        if c.op_type == "FusedConv":
            if attribute(c, "activation"):
                if attribute(c, "activation") in FUSED_ACTS:
                    acted[i] = (c.name,)
                continue
        act = _activation(ctx, _conv_end(ctx, c, dynamic).output[0])
        if act is not None and all(a.name for a in act):
            acted[i] = tuple(a.name for a in act)
    if not acted:
        return []
    sites = []
    for i, c in enumerate(convs):
        if i in acted:
            continue
        end = _conv_end(ctx, c, dynamic)
        t = end.output[0]
        after = _sole_readers(ctx, t)
        if t in outputs or not after or not all(_layer_input(ctx, r, t, dynamic) for r in after):
            continue
        nearest = min(acted, key=lambda j: (abs(j - i), j > i))
        sites.append(Site(end.name, (c.name, acted[nearest])))
    return sites


def plant_bottleneck_act(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A copy of the template activation (then a Relu) inserted after the Conv's end node.  Planted: the inserted
    node(s)."""
    conv, template = site.detail
    node = node_by_name(ctx.proto, site.node)
    nodes = [node_by_name(ctx.proto, n) for n in template]

    def variants():
        plans = [nodes] + ([] if nodes[0].op_type == "Relu" and len(nodes) == 1 else [None])
        for plan in plans:
            def build(o, raw, result):
                if plan is None:
                    return [helper.make_node("Relu", [raw], [result], name=unique_name(o, f"{site.node}_act"))]
                if len(plan) == 2:  # SiLU: Sigmoid, Mul
                    gate = unique_name(o, f"{result}_gate")
                    return [helper.make_node("Sigmoid", [raw], [gate], name=unique_name(o, f"{site.node}_act_gate")),
                            helper.make_node("Mul", [raw, gate], [result], name=unique_name(o, f"{site.node}_act"))]
                if plan[0].op_type == "FusedConv":  # the activation fused into a Conv, as a node
                    act, params = attribute(plan[0], "activation"), list(attribute(plan[0], "activation_params", []))
                    name = unique_name(o, f"{site.node}_act")
                    if act == "Clip":
                        dtype = ctx.values[node.output[0]].dtype
                        bounds = [_add_constant(o, f"{site.node}_act_{k}", np.array(v, dtype))
                                  for k, v in zip(("min", "max"), params[:2])]
                        return [helper.make_node("Clip", [raw, *bounds], [result], name=name)]
                    extra = {"alpha": params[0]} if act == "LeakyRelu" and params else {}
                    return [helper.make_node(act, [raw], [result], name=name, **extra)]
                a = onnx.NodeProto()
                a.CopyFrom(plan[0])
                a.input[0], a.output[0], a.name = raw, result, unique_name(o, f"{site.node}_act")
                del a.metadata_props[:]
                return [a]

            out, new = _after(ctx, site.node, build)
            if not _toposorted(out):
                yield None
                continue
            checked = _checked(ctx, out, [node.output[0]])
            kind = "SiLU" if len(new) == 2 else new[0].op_type
            yield None if checked is None else Planted(
                checked, [n.name for n in new], "attribute-mismatch",
                f"linear layer Conv {conv} ({list(ctx.values[node.output[0]].shape)}, read by "
                f"{', '.join(sorted({r.op_type for r in readers(ctx.proto, node.output[0])}))}) given its block's "
                f"activation: a {kind} inserted after {site.node}", {"conv": conv, "activation": kind})

    return _counting(ctx, variants(), "bottleneck activated")


# --------------------------------------------------------------------------- a kernel standardised

WS_EPS = 1e-6
WS_TOL = 1e-3  # a kernel whose per-channel mean is within this of 0 and variance of 1 is standardised already


def standardized_sites(ctx: FileContext) -> list[Site]:
    """Named Conv / FusedConv nodes with a constant float kernel (≥ 2 entries per output channel, not standardised
    already) on a computed input."""
    sites = []
    for n, w in _convs(ctx):
        if int(np.prod(w.shape[1:])) < 2:
            continue
        flat = w.astype(np.float64).reshape(w.shape[0], -1)
        if np.all(np.abs(flat.mean(1)) < WS_TOL) and np.all(np.abs(flat.var(1) - 1) < WS_TOL):
            continue
        sites.append(Site(n.name))
    return sites


def plant_kernel_standardized(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The kernel replaced by ``(W − mean) / sqrt(var + 1e-6)`` per output channel.  Planted: the Conv."""
    node = node_by_name(ctx.proto, site.node)
    w = constant(ctx.proto, node.input[1])
    flat = w.astype(np.float64).reshape(w.shape[0], -1)
    std = (flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + WS_EPS)
    value = std.reshape(w.shape).astype(w.dtype)
    if not np.all(np.isfinite(value)):
        raise NoVariant("the standardised kernel is not finite")

    def variants():
        out = with_own_constant(ctx.proto, site.node, 1, value, "standardized")
        checked = _checked(ctx, out, [node.output[0]])
        yield None if checked is None else Planted(
            checked, [site.node], "weight-mismatch",
            f"{node.op_type} {site.node} kernel {list(w.shape)} standardised per output channel (a StdConv2d for a "
            f"plain convolution): (W − mean) / sqrt(var + {WS_EPS:g}), std {flat.std(1).mean():.3g} → 1",
            {"conv": site.node})

    return _counting(ctx, variants(), "kernel standardised")


KINDS = (
    FaultKind("softmax-sink", sink_sites, plant_softmax_sink, "attribute-mismatch",
              "an attention given a sink: a zero key with a zero value (add_zero_attn), probabilities × σ(logsumexp)",
              max_tries=40),
    FaultKind("groups-dropped", groups_sites, plant_groups_dropped, "attribute-mismatch",
              "a grouped / depthwise Conv run dense (group=1) with its kernel broadcast over every input channel",
              max_tries=40),
    FaultKind("rnn-gate-bias", rnn_bias_sites, plant_rnn_gate_bias, "weight-mismatch",
              "an LSTM's forget-gate bias ±1 (TensorFlow's forget_bias), or a GRU's recurrent candidate bias folded "
              "into its input bias", max_tries=40),
    FaultKind("input-layout", layout_sites, plant_input_layout, "attribute-mismatch",
              "an input buffer in the other layout (channels last, H × W × C) reshaped to the input's shape instead "
              "of transposed", max_tries=40),
    FaultKind("qkv-interleaved", qkv_sites, plant_qkv_interleaved, "weight-mismatch",
              "q, k, v projections loaded from a fused [q; k; v] read in the other head layout: (3, H, d) ↔ "
              "(H, 3, d)",
              max_tries=40),
    FaultKind("bottleneck-act", bottleneck_sites, plant_bottleneck_act, "attribute-mismatch",
              "a linear Conv (a linear bottleneck, a depthwise or a block's last Conv) given its block's activation",
              max_tries=40),
    FaultKind("class-offset", offset_sites, plant_class_offset, "weight-mismatch",
              "an output head's classes read one position off: its output channels (and bias) rolled by one",
              max_tries=40),
    FaultKind("kernel-standardized", standardized_sites, plant_kernel_standardized, "weight-mismatch",
              "a Conv kernel standardised per output channel (a StdConv2d for a plain convolution)", max_tries=40),
)
