"""The seventh set of fault kinds (scripts/fault_sweep.py), written before the tool had seen any of them.

Seven kinds: an arithmetic op exchanged for its inverse on two computed tensors (Add ↔ Sub — a rotary
embedding's sign —, Mul ↔ Div), an activation exchanged for a relative (Sigmoid ↔ HardSigmoid, Relu → LeakyRelu /
Elu / Softplus, Tanh → Softsign, PRelu → Relu), a padding moved by one from one side to the other (a Conv's, a
pool's or a Pad's: TensorFlow's "same" padding put on the wrong side), a convolution kernel flipped spatially
(correlation against convolution), a normalization's scale off by one (``1 + weight`` lost or doubled: Gemma's and
Nemotron's convention), an RNN's gate blocks permuted or its direction reversed (a converter's gate order), and a
LayerNorm computed as an RMSNorm (``SimplifiedLayerNormalization``) or back.  Each follows :mod:`sweep_faults`'
conventions.  (An active Dropout — a training-mode export — was tried too and dropped: ONNX Runtime's optimizer
removes every Dropout, active or not, so such a file diverges only with optimizations off and is never counted.)
"""
from __future__ import annotations

import numpy as np
import onnx
from sweep_faults import (FaultKind, FileContext, NoVariant, Planted, Site, attribute, constant, copy, folded,
                          dead_nodes, is_float_tensor, prune, with_input_constant, node_by_name, set_attr, top_nodes,
                          weight_input, with_argument, with_initializer)
from sweep_faults_ops import _retyped, _usable


def _finite(ctx: FileContext, out: onnx.ModelProto, tensor: str) -> bool:
    return bool(np.isfinite(ctx.tensor(out, tensor)).all())


# --------------------------------------------------------------------------- arithmetic op

ARITH_SWAPS = {"Add": "Sub", "Sub": "Add", "Mul": "Div", "Div": "Mul"}


def arith_sites(ctx: FileContext) -> list[Site]:
    """Add/Sub/Mul/Div of two computed float tensors (neither a constant nor computed from constants)."""
    sites = []
    for n in top_nodes(ctx, tuple(ARITH_SWAPS), lambda d: d in ("", "ai.onnx")):
        if len(n.input) != 2 or n.output[0] not in ctx.values or not is_float_tensor(ctx, n.output[0]):
            continue
        if any(folded(ctx, t) is not None for t in n.input):
            continue
        sites.append(Site(n.name))
    return sites


def plant_arith_op(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The node computes the inverse operation (a sign or a division lost), output finite."""
    node = node_by_name(ctx.proto, site.node)
    new = ARITH_SWAPS[node.op_type]
    out = _usable(ctx, _retyped(ctx, site.node, new), node.output[0])
    if out is None or not _finite(ctx, out, node.output[0]):
        raise NoVariant(f"{new} does not run, change the output or stay finite")
    return Planted(out, [site.node], "attribute-mismatch", f"{node.op_type} → {new}")


# --------------------------------------------------------------------------- activation kind

ACTIVATION_SWAPS = {
    "Sigmoid": [("HardSigmoid", {"alpha": 1.0 / 6.0, "beta": 0.5})],
    "HardSigmoid": [("Sigmoid", {})],
    "Relu": [("LeakyRelu", {"alpha": 0.1}), ("Elu", {"alpha": 1.0}), ("Softplus", {})],
    "LeakyRelu": [("Relu", {})], "Elu": [("Relu", {})], "Softplus": [("Relu", {})], "Selu": [("Elu", {})],
    "Tanh": [("Softsign", {})], "Softsign": [("Tanh", {})], "HardSwish": [("HardSigmoid", {})],
}
OWN_ATTRS = ("alpha", "beta", "gamma")


def activation_sites(ctx: FileContext) -> list[Site]:
    sites = [Site(n.name) for n in top_nodes(ctx, tuple(ACTIVATION_SWAPS), lambda d: d in ("", "ai.onnx"))]
    prelu = [Site(n.name) for n in top_nodes(ctx, ("PRelu",))]
    return sites + prelu


def plant_activation_kind(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """Another activation of the family in its place (its own constants replaced by the new one's)."""
    node = node_by_name(ctx.proto, site.node)
    if node.op_type == "PRelu":
        out = copy(ctx.proto)
        target = node_by_name(out, site.node)
        target.op_type = "Relu"
        del target.input[1:]
        variants = [(out, "PRelu → Relu (the slope lost)")]
    else:
        choices = ACTIVATION_SWAPS[node.op_type]
        order = rng.permutation(len(choices))
        variants = [(_retyped(ctx, site.node, choices[k][0], drop=OWN_ATTRS, add=choices[k][1]),
                     f"{node.op_type} → {choices[k][0]}") for k in order]
    for out, text in variants:
        out = _usable(ctx, out, node.output[0])
        if out is not None and _finite(ctx, out, node.output[0]):
            return Planted(out, [site.node], "attribute-mismatch", text)
    raise NoVariant("no other activation runs and changes the output")


# --------------------------------------------------------------------------- padding side

PADDED = ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool")


def pad_shift_sites(ctx: FileContext) -> list[Site]:
    """Convs and pools with explicit pads, and Pads with constant pads, that pad some axis."""
    sites = []
    for n in top_nodes(ctx, PADDED):
        if attribute(n, "auto_pad", "NOTSET") == "NOTSET" and any(attribute(n, "pads") or []):
            sites.append(Site(n.name, ("attr",)))
    for n in top_nodes(ctx, ("Pad",)):
        pads = folded(ctx, n.input[1]) if len(n.input) > 1 else attribute(n, "pads")
        if pads is not None and np.asarray(pads).any() and len(n.input) < 4:
            sites.append(Site(n.name, ("input",) if len(n.input) > 1 else ("attr",)))
    return sites


def _shifted(pads: list[int], rng: np.random.Generator) -> list[list[int]]:
    """Variants of ``pads`` with one element moved from one side of an axis to the other (total kept)."""
    rank = len(pads) // 2
    found = []
    for i in rng.permutation(rank):
        i = int(i)
        b, e = pads[i], pads[i + rank]
        for db in ((-1, 1) if rng.random() < 0.5 else (1, -1)):
            if b + db >= 0 and e - db >= 0 and b + e > 0:
                new = list(pads)
                new[i], new[i + rank] = b + db, e - db
                found.append(new)
    return found


def plant_pad_shift(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """One padded element moved from one side of an axis to the other: the output keeps its shape, shifted."""
    node = node_by_name(ctx.proto, site.node)
    as_input = site.detail[0] == "input"
    old = folded(ctx, node.input[1]) if as_input else np.asarray(attribute(node, "pads"))
    for new in _shifted([int(p) for p in old.reshape(-1)], rng):
        if as_input:
            out = with_argument(ctx, site.node, 1, np.array(new, old.dtype).reshape(old.shape))
        else:
            out = copy(ctx.proto)
            set_attr(node_by_name(out, site.node), "pads", new)
        out = _usable(ctx, out, node.output[0])
        if out is not None:
            return Planted(out, [site.node], "attribute-mismatch",
                           f"{node.op_type} pads {old.reshape(-1).tolist()} → {new}")
    raise NoVariant("no shifted padding runs and changes the output")


# --------------------------------------------------------------------------- kernel flip

def kernel_flip_sites(ctx: FileContext) -> list[Site]:
    sites = []
    for n in top_nodes(ctx, ("Conv", "ConvTranspose")):
        for k, source in weight_input(ctx.proto, n):
            value = constant(ctx.proto, source)
            if k == 1 and value is not None and value.ndim >= 3 and any(s > 1 for s in value.shape[2:]):
                sites.append(Site(n.name, (source,)))
    return sites


def plant_kernel_flip(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The kernel flipped along its spatial axes (a convolution taken for a correlation)."""
    (source,) = site.detail
    value = constant(ctx.proto, source)
    axes = tuple(a for a in range(2, value.ndim) if value.shape[a] > 1)
    out = with_initializer(ctx.proto, source, np.ascontiguousarray(np.flip(value, axes)))
    out = _usable(ctx, out, node_by_name(ctx.proto, site.node).output[0])
    if out is None:
        raise NoVariant("the flipped kernel gives the same output (a symmetric kernel)")
    return Planted(out, [site.node], "weight-mismatch", f"kernel {source} {list(value.shape)} flipped on axes "
                   f"{list(axes)}", {"weight": source})


# --------------------------------------------------------------------------- norm scale off by one

NORMS = ("LayerNormalization", "GroupNormalization", "InstanceNormalization", "BatchNormalization",
         "SimplifiedLayerNormalization", "SkipLayerNormalization", "SkipSimplifiedLayerNormalization")


def _scale_index(node: onnx.NodeProto) -> int:
    return 2 if node.op_type.startswith("Skip") else 1


def scale_offset_sites(ctx: FileContext) -> list[Site]:
    sites = []
    for n in top_nodes(ctx, NORMS):
        k = _scale_index(n)
        value = constant(ctx.proto, n.input[k]) if len(n.input) > k else None
        if value is not None and value.dtype.kind == "f":
            sites.append(Site(n.name))
    return sites


def plant_scale_offset(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The norm's scale one more or one less (``1 + weight`` lost or applied twice), a private copy."""
    node = node_by_name(ctx.proto, site.node)
    k = _scale_index(node)
    old = constant(ctx.proto, node.input[k])
    for step in rng.permutation([1.0, -1.0]):
        out = with_argument(ctx, site.node, k, (old.astype(np.float64) + step).astype(old.dtype))
        out = _usable(ctx, out, node.output[0])
        if out is not None:
            return Planted(out, [site.node], "weight-mismatch",
                           f"{node.op_type} scale {node.input[k]} {float(step):+g}", {"weight": node.input[k]})
    raise NoVariant("no offset scale changes the output")


# --------------------------------------------------------------------------- RNN gates and direction

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, tuple(GATES))]


def _permuted_gates(value: np.ndarray, gates: int, pair: tuple[int, int]) -> np.ndarray:
    """``value`` [dirs, gates·H, ...] (or a bias [dirs, 2·gates·H]) with gate blocks ``pair`` exchanged."""
    out = value.copy()
    halves = 2 if value.ndim == 2 else 1
    h = value.shape[1] // (gates * halves)
    for half in range(halves):
        base = half * gates * h
        i, j = (base + p * h for p in pair)
        out[:, i:i + h], out[:, j:j + h] = value[:, j:j + h], value[:, i:i + h]
    return out


def _gates_variant(ctx: FileContext, node: onnx.NodeProto, rng: np.random.Generator):
    gates = GATES[node.op_type]
    values = {k: folded(ctx, node.input[k]) for k in (1, 2, 3) if len(node.input) > k and node.input[k]}
    if gates < 2 or any(v is None or v.dtype.kind != "f" for v in values.values()):
        return None
    pair = tuple(int(p) for p in rng.choice(gates, 2, replace=False))
    out = ctx.proto
    for k, v in values.items():
        out = with_input_constant(out, node.name, k, _permuted_gates(v, gates, pair))
    prune(out, dead_nodes(ctx.proto))
    return out, "weight-mismatch", f"{node.op_type} gate blocks {pair} exchanged in W, R and B"


def plant_rnn_layout(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """The RNN's gate blocks exchanged in its weights (a converter's gate order), or a one-direction RNN run in
    the other direction."""
    node = node_by_name(ctx.proto, site.node)
    variants = []
    if attribute(node, "direction", b"forward") in (b"forward", "forward", b"reverse", "reverse"):
        old = attribute(node, "direction", b"forward")
        old = old.decode() if isinstance(old, bytes) else old
        new = "reverse" if old == "forward" else "forward"
        out = copy(ctx.proto)
        set_attr(node_by_name(out, site.node), "direction", new)
        variants.append((out, "attribute-mismatch", f"{node.op_type} direction {old} → {new}"))
    gates = _gates_variant(ctx, node, rng)
    if gates is not None:
        variants.append(gates)
    if len(variants) > 1 and rng.random() < 0.5:
        variants.reverse()
    for out, expected, text in variants:
        out = _usable(ctx, out, next(o for o in node.output if o))
        if out is not None:
            return Planted(out, [site.node], expected, text)
    raise NoVariant("no gate order or direction changes the output")


# --------------------------------------------------------------------------- LayerNorm ↔ RMSNorm

def norm_kind_sites(ctx: FileContext) -> list[Site]:
    return [Site(n.name) for n in top_nodes(ctx, ("LayerNormalization", "SimplifiedLayerNormalization"),
                                            lambda d: d in ("", "ai.onnx"))]


def plant_norm_kind(ctx: FileContext, site: Site, rng: np.random.Generator) -> Planted:
    """A LayerNormalization computed as an RMSNorm (no mean subtracted, no bias), or an RMSNorm as a
    LayerNormalization (the mean subtracted)."""
    node = node_by_name(ctx.proto, site.node)
    out = copy(ctx.proto)
    target = node_by_name(out, site.node)
    if node.op_type == "LayerNormalization":
        target.op_type = "SimplifiedLayerNormalization"
        del target.input[2:]
        text = "LayerNormalization → SimplifiedLayerNormalization (RMSNorm)"
    else:
        target.op_type = "LayerNormalization"
        text = "SimplifiedLayerNormalization → LayerNormalization"
    del target.output[1:]
    out = _usable(ctx, out, node.output[0])
    if out is None:
        raise NoVariant("the other norm does not run or change the output")
    return Planted(out, [site.node], "attribute-mismatch", text)


KINDS = (
    FaultKind("arith-op", arith_sites, plant_arith_op, "attribute-mismatch",
              "Add ↔ Sub, Mul ↔ Div of two computed tensors"),
    FaultKind("activation-kind", activation_sites, plant_activation_kind, "attribute-mismatch",
              "Sigmoid ↔ HardSigmoid, Relu → LeakyRelu / Elu / Softplus, Tanh ↔ Softsign, PRelu → Relu, ..."),
    FaultKind("pad-shift", pad_shift_sites, plant_pad_shift, "attribute-mismatch",
              "a Conv's, pool's or Pad's padding moved by one element from one side of an axis to the other"),
    FaultKind("kernel-flip", kernel_flip_sites, plant_kernel_flip, "weight-mismatch",
              "a convolution kernel flipped along its spatial axes"),
    FaultKind("scale-offset", scale_offset_sites, plant_scale_offset, "weight-mismatch",
              "a normalization's scale ±1 (1 + weight lost or doubled)"),
    FaultKind("rnn-layout", rnn_sites, plant_rnn_layout, "weight-mismatch / attribute-mismatch",
              "an LSTM's / GRU's gate blocks exchanged (W, R, B), or its direction reversed"),
    FaultKind("norm-kind", norm_kind_sites, plant_norm_kind, "attribute-mismatch",
              "LayerNormalization ↔ SimplifiedLayerNormalization (RMSNorm)"),
)
