"""The eighth set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Eight kinds, each a converter's or a checkpoint loader's mistake the earlier sets never planted: two weights of the
same shape exchanged (a loader mapping parameters by shape), a bias dropped (a Conv's or Gemm's bias input removed,
a Linear's bias Add taken out), a unary op dropped (an activation or elementwise function left as an Identity: a
converter skipping what it does not know), a residual dropped (an Add of two computed tensors left as one of
them), the channels of a per-channel constant reversed (an RGB model fed BGR weights, a bias or scale reversed), a
GELU computed as the sigmoid "quick GELU" ``x·σ(1.702x)``, an RNN attribute flipped (a GRU's
``linear_before_reset``, an LSTM's ``input_forget`` or a cell ``clip``), and a unary op or normalization applied
twice (a fused activation emitted again as its own node).  Each follows :mod:`sweep_faults`' conventions.
"""
from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper, numpy_helper
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, dead_nodes,
                          folded, insert_nodes, is_float_array, is_float_tensor, node_by_name, plant, producer, prune,
                          readers, replace_node, set_attr, tanh_gelu_input, top_nodes, unique_name, with_initializer)
from sweep_faults_ops import _usable

ONNX_DOMAIN = ("", "ai.onnx")


def _finite(ctx: FileContext, out: onnx.ModelProto, tensor: str) -> bool:
    return bool(np.isfinite(ctx.tensor(out, tensor)).all())


def _order(proto: onnx.ModelProto) -> dict[str, int]:
    return {n.name: i for i, n in enumerate(proto.graph.node)}


# --------------------------------------------------------------------------- two weights exchanged

WEIGHT_OPS = ("MatMul", "Gemm", "Conv", "ConvTranspose", "FusedMatMul", "FusedGemm", "FusedConv")


def _weights(ctx: FileContext) -> list[tuple[str, str]]:
    """``(node, initializer)`` for every float weight (≥ 2 dims) a product node reads, read by that node alone."""
    found = []
    for n in top_nodes(ctx, WEIGHT_OPS):
        for t in n.input[1:2] if n.op_type != "MatMul" else n.input[:2]:
            value = constant(ctx.proto, t)
            if is_float_array(value) and value.ndim >= 2 and len(readers(ctx.proto, t)) == 1:
                found.append((n.name, t))
    return found


def exchange_sites(ctx: FileContext) -> list[Site]:
    """A weight that has a partner of the same shape and dtype (another node's) holding other numbers."""
    weights = _weights(ctx)
    sites = []
    for node, t in weights:
        value = constant(ctx.proto, t)
        partners = [(m, u) for m, u in weights if m != node and u != t and constant(ctx.proto, u).shape == value.shape
                    and constant(ctx.proto, u).dtype == value.dtype]
        if partners:
            sites.append(Site(node, (t,)))
    return sites


def plant_weights_exchanged(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The weight and another node's weight of the same shape exchanged; the earlier of the two nodes (graph
    order) is where the file first diverges."""
    (t,) = site.detail
    value = constant(ctx.proto, t)
    partners = [(m, u) for m, u in _weights(ctx) if m != site.node and u != t
                and constant(ctx.proto, u).shape == value.shape and constant(ctx.proto, u).dtype == value.dtype]
    order = _order(ctx.proto)
    for k in rng.permutation(len(partners))[:6]:
        other_node, u = partners[int(k)]
        other = constant(ctx.proto, u)
        if np.array_equal(other, value):
            continue
        out = with_initializer(with_initializer(ctx.proto, t, other), u, value)
        first = min((site.node, other_node), key=order.__getitem__)
        checked = _usable(ctx, out, node_by_name(ctx.proto, first).output[0])
        if checked is not None:
            return Planted(checked, [first], "weight-mismatch", f"{t} ↔ {u} ({list(value.shape)}) exchanged",
                           {"weight": t, "partner": u, "other_node": other_node})
    raise NoVariant("no exchange with a same-shape weight changes the output")


# --------------------------------------------------------------------------- bias dropped

def bias_dropped_sites(ctx: FileContext) -> list[Site]:
    """Conv / ConvTranspose / Gemm with a constant bias input, and a MatMul's output plus a constant 1-D bias."""
    sites = []
    for n in top_nodes(ctx, ("Conv", "ConvTranspose", "Gemm"), lambda d: d in ONNX_DOMAIN):
        if len(n.input) > 2 and n.input[2] and is_float_array(folded(ctx, n.input[2])):
            sites.append(Site(n.name, ("input",)))
    for n in top_nodes(ctx, ("Add",), lambda d: d in ONNX_DOMAIN):
        for k, t in enumerate(n.input):
            other = producer(ctx.proto, n.input[1 - k])
            value = folded(ctx, t)
            if (is_float_array(value) and value.ndim == 1 and value.size > 1 and other is not None
                    and other.op_type in ("MatMul", "FusedMatMul") and len(readers(ctx.proto, other.output[0])) == 1):
                sites.append(Site(other.name, ("add", n.name)))
                break
    return sites


def plant_bias_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The bias gone: the node's bias input removed, or the bias Add's readers reading the product directly."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    if site.detail[0] == "input":
        target = node_by_name(out, site.node)
        gone = target.input[2]
        del target.input[2:]
        text = f"{node.op_type} bias input {gone} removed"
        watched = node.output[0]
    else:
        add = node_by_name(out, site.detail[1])
        product, result = node.output[0], add.output[0]
        if any(o.name == result for o in out.graph.output):
            raise NoVariant("the bias Add computes a graph output")
        for n in out.graph.node:
            for i, t in enumerate(n.input):
                if t == result:
                    n.input[i] = product
        out.graph.node.remove(add)
        text = f"{node.op_type}'s bias Add {site.detail[1]} removed"
        watched = product
    prune(out, dead_nodes(ctx.proto))
    checked = _usable(ctx, out, watched) if site.detail[0] == "input" else (None if ctx.problem(out) else out)
    if checked is None:
        raise NoVariant("the model without the bias does not run or does not change")
    return Planted(checked, [site.node], "weight-mismatch", text)


# --------------------------------------------------------------------------- unary op dropped / doubled

UNARY = ("Relu", "Sigmoid", "Tanh", "Sqrt", "Exp", "Neg", "Reciprocal", "Softplus", "Softsign", "HardSigmoid",
         "HardSwish", "LeakyRelu", "Elu", "Selu", "Celu", "Abs", "Erf", "Log", "Sin", "Cos", "Gelu", "Mish",
         "ThresholdedRelu", "Softmax", "LogSoftmax")


def unary_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, UNARY, lambda d: d in ONNX_DOMAIN)
            if n.output[0] in ctx.values and is_float_tensor(ctx, n.output[0])]


def plant_op_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The op left as an Identity of its input (its attributes dropped)."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    target.op_type, target.domain = "Identity", ""
    del target.input[1:]
    target.ClearField("attribute")
    checked = _usable(ctx, out, node.output[0])
    if checked is None or not _finite(ctx, checked, node.output[0]):
        raise NoVariant("the model without the op does not run, change or stay finite")
    return Planted(checked, [site.node], "attribute-mismatch", f"{node.op_type} dropped (an Identity)")


DOUBLED = UNARY + ("LayerNormalization", "SimplifiedLayerNormalization", "InstanceNormalization")


def doubled_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, DOUBLED, lambda d: d in ONNX_DOMAIN)
            if n.output[0] in ctx.values and is_float_tensor(ctx, n.output[0]) and all(not o for o in n.output[1:])]


def plant_op_doubled(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The op applied a second time to its own output (same attributes and constant inputs): its readers read
    the second application."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    first = unique_name(out, f"{node.output[0]}_once")
    name = unique_name(out, f"{node.name}_again")
    target = node_by_name(out, site.node)
    target.output[0] = first
    again = helper.make_node(node.op_type, [first, *node.input[1:]], [node.output[0]], name=name, domain=node.domain)
    again.attribute.extend(node.attribute)
    insert_nodes(out, site.node, [], [again])
    checked = _usable(ctx, out, node.output[0])
    if checked is None or not _finite(ctx, checked, node.output[0]):
        raise NoVariant("the op applied twice does not run, change the output or stay finite")
    return Planted(checked, [name], "attribute-mismatch", f"{node.op_type} applied twice ({name} added)")


# --------------------------------------------------------------------------- residual dropped

def _value(ctx: FileContext, tensor: str) -> np.ndarray:
    return ctx.values[tensor] if tensor in ctx.values else ctx.feeds[tensor]


def residual_sites(ctx: FileContext) -> list[Site]:
    """Adds of two computed float tensors of the output's shape (neither constant nor computed from constants)."""
    sites = []
    for n in top_nodes(ctx, ("Add",), lambda d: d in ONNX_DOMAIN):
        if len(n.input) != 2 or n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        if any(t not in ctx.values and t not in ctx.feeds or folded(ctx, t) is not None for t in n.input):
            continue
        shape = ctx.values[n.output[0]].shape
        keep = [k for k, t in enumerate(n.input) if _value(ctx, t).shape == shape]
        if keep:
            sites.append(Site(n.name, tuple(keep)))
    return sites


def plant_residual_dropped(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The Add left as an Identity of one operand (the residual or the branch lost)."""
    node = node_by_name(ctx.proto, site.node)
    for k in rng.permutation(list(site.detail)):
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        kept = target.input[int(k)]
        target.op_type = "Identity"
        del target.input[:]
        target.input.append(kept)
        prune(out, dead_nodes(ctx.proto))
        checked = _usable(ctx, out, node.output[0])
        if checked is not None:
            return Planted(checked, [site.node], "attribute-mismatch",
                           f"Add → Identity of input {int(k)} ({node.input[1 - int(k)]} dropped)")
    raise NoVariant("dropping either operand does not change the output")


# --------------------------------------------------------------------------- channels reversed

def channel_sites(ctx: FileContext) -> list[Site]:
    """Conv kernels with several input channels per group (axis 1), and per-channel 1-D float constants (biases,
    norm scales) read by Conv / Gemm / norms / Add / Mul."""
    sites = []
    for n in top_nodes(ctx, ("Conv", "ConvTranspose"), lambda d: d in ONNX_DOMAIN):
        value = constant(ctx.proto, n.input[1])
        if is_float_array(value) and value.ndim >= 3 and value.shape[1] > 1 and len(readers(ctx.proto, n.input[1])) == 1:
            sites.append(Site(n.name, (1, 1)))
    per_channel = ("Conv", "ConvTranspose", "Gemm", "Add", "Mul", "LayerNormalization", "BatchNormalization",
                   "InstanceNormalization", "GroupNormalization", "SimplifiedLayerNormalization")
    for n in top_nodes(ctx, per_channel, lambda d: d in ONNX_DOMAIN):
        for k, t in enumerate(n.input):
            value = constant(ctx.proto, t)
            if k == 0 and n.op_type not in ("Add", "Mul") or not is_float_array(value):
                continue
            if value.ndim >= 1 and max(value.shape) == value.size > 2 and len(readers(ctx.proto, t)) == 1:
                sites.append(Site(n.name, (k, int(np.argmax(value.shape)))))
    return sites


def plant_channel_reverse(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The constant reversed along its channel axis (a Conv's input channels: an RGB model given BGR weights)."""
    k, axis = site.detail
    node = node_by_name(ctx.proto, site.node)
    source = node.input[k]
    value = constant(ctx.proto, source)
    reversed_ = np.ascontiguousarray(np.flip(value, axis))
    out = _usable(ctx, with_initializer(ctx.proto, source, reversed_), node.output[0])
    if out is None:
        raise NoVariant("the reversed constant does not change the output")
    return Planted(out, [site.node], "weight-mismatch",
                   f"{source} {list(value.shape)} reversed along axis {axis}", {"weight": source})


# --------------------------------------------------------------------------- quick GELU

QUICK = 1.702


def quick_sites(ctx: FileContext) -> list[Site]:
    sites = [Site(n.name, ("op",)) for n in top_nodes(ctx, ("Gelu",), lambda d: d in ONNX_DOMAIN)]
    sites += [Site(n.name, ("erf",)) for n in top_nodes(ctx, ("Erf",)) if plant._is_gelu_erf(ctx.proto, n)]
    sites += [Site(n.name, ("tanh", x)) for n in top_nodes(ctx, ("Tanh",))
              if (x := tanh_gelu_input(ctx.proto, n)) is not None]
    return sites


def _const(out: onnx.ModelProto, base: str, value: float, dtype) -> str:
    name = unique_name(out, base)
    out.graph.initializer.append(numpy_helper.from_array(np.array(value, dtype), name))
    return name


def plant_gelu_quick(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The GELU computed as ``x·σ(1.702x)``: a Gelu op replaced by Mul(x, Sigmoid(1.702x)); a decomposed erf
    GELU's ``Erf(u)`` (u = x/√2) by ``Tanh(0.851·√2·u)``, a decomposed tanh GELU's ``Tanh`` by ``Tanh(0.851x)`` —
    both turn ``x/2·(1 + ·)`` into exactly the sigmoid form."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    y = node.output[0]
    if site.detail[0] == "op":
        x = node.input[0]
        dtype = ctx.dtype(x)
        c = _const(out, f"{node.name}_quick", QUICK, dtype)
        z, s = unique_name(out, f"{y}_quick_in"), unique_name(out, f"{y}_quick_sig")
        new = [helper.make_node("Mul", [x, c], [z], name=f"{node.name}_quick_0_Mul"),
               helper.make_node("Sigmoid", [z], [s], name=f"{node.name}_quick_1_Sigmoid"),
               helper.make_node("Mul", [x, s], [y], name=f"{node.name}_quick_2_Mul")]
        text = f"Gelu → x·Sigmoid({QUICK}x)"
    else:
        u = node.input[0] if site.detail[0] == "erf" else site.detail[1]
        factor = QUICK / 2 * (math.sqrt(2) if site.detail[0] == "erf" else 1.0)
        dtype = ctx.dtype(node.input[0])
        c = _const(out, f"{node.name}_quick", factor, dtype)
        z = unique_name(out, f"{y}_quick_in")
        new = [helper.make_node("Mul", [u, c], [z], name=f"{node.name}_quick_0_Mul"),
               helper.make_node("Tanh", [z], [y], name=f"{node.name}_quick_1_Tanh")]
        text = f"{site.detail[0]} GELU → quick GELU x·σ({QUICK}x)"
    replace_node(out, site.node, new)
    checked = _usable(ctx, out, y)
    if checked is None:
        raise NoVariant("the quick GELU does not run or change the output")
    return Planted(checked, [n.name for n in new], "gelu-approximation", text)


# --------------------------------------------------------------------------- RNN attributes

def rnn_attr_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("GRU", "LSTM", "RNN"), lambda d: d in ONNX_DOMAIN)]


def plant_rnn_attr(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A GRU's ``linear_before_reset`` flipped (PyTorch's GRU is 1), an LSTM's ``input_forget`` coupled, or a
    cell ``clip`` below the pre-activations' range."""
    node = node_by_name(ctx.proto, site.node)
    variants = []
    if node.op_type == "GRU":
        old = int(attribute(node, "linear_before_reset", 0))
        variants.append(("linear_before_reset", 1 - old, f"GRU linear_before_reset {old} → {1 - old}"))
    if node.op_type == "LSTM" and not attribute(node, "input_forget", 0):
        variants.append(("input_forget", 1, "LSTM input_forget 0 → 1 (input and forget gates coupled)"))
    if attribute(node, "clip") is None:
        clip = float(rng.choice([0.5, 1.0, 2.0]))
        variants.append(("clip", clip, f"{node.op_type} clip {clip:g} added"))
    order = rng.permutation(len(variants))
    for k in order:
        name, value, text = variants[int(k)]
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), name, value)
        checked = _usable(ctx, out, next(o for o in node.output if o))
        if checked is not None:
            return Planted(checked, [site.node], "attribute-mismatch", text)
    raise NoVariant("no attribute change runs and changes the output")


KINDS = (
    FaultKind("weights-exchanged", exchange_sites, plant_weights_exchanged, "weight-mismatch",
              "two product weights of the same shape exchanged (a loader mapping parameters by shape)"),
    FaultKind("bias-dropped", bias_dropped_sites, plant_bias_dropped, "weight-mismatch",
              "a Conv's / Gemm's bias input removed, or a MatMul's bias Add taken out"),
    FaultKind("op-dropped", unary_sites, plant_op_dropped, "attribute-mismatch",
              "an activation or elementwise function left as an Identity"),
    FaultKind("op-doubled", doubled_sites, plant_op_doubled, "attribute-mismatch",
              "an activation, elementwise function or normalization applied a second time"),
    FaultKind("residual-dropped", residual_sites, plant_residual_dropped, "attribute-mismatch",
              "an Add of two computed tensors left as one of them (a skip connection or a branch lost)"),
    FaultKind("channel-reverse", channel_sites, plant_channel_reverse, "weight-mismatch",
              "a Conv kernel's input channels (RGB ↔ BGR) or a per-channel constant reversed"),
    FaultKind("gelu-quick", quick_sites, plant_gelu_quick, "gelu-approximation",
              "a GELU computed as the sigmoid approximation x·σ(1.702x)"),
    FaultKind("rnn-attr", rnn_attr_sites, plant_rnn_attr, "attribute-mismatch",
              "a GRU's linear_before_reset flipped, an LSTM's input_forget set, or a cell clip added"),
)
