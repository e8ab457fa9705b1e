"""Fusion awareness for the align stage: modules whose own output the ONNX graph does not hold.

Exporters and optimizers compute several PyTorch modules in one ONNX node: a
BatchNorm folded into the preceding Conv, Conv+BatchNorm+ReLU as one FusedConv,
a layer scale or an attention scale folded into a MatMul's weights.  Such a
module has no tensor of its own to compare; it is reported ``fused`` into the
node that computes it, but only where the graph shows it:

* **into a neighbour** — the module's nearest consumer is aligned, and the
  nodes computing that consumer's tensor include an op that can compute the
  module (the module→op table :data:`HOST_OPS`);
* **with a scale after it** — a tensor holds exactly the module's value times a
  factor per channel, and that tensor also holds a later activation's value
  (the arithmetic between the two was folded into the module's node); or it
  holds the module's value times one factor (an attention scale folded into a
  projection).

The values decide; a module is never declared fused for its position alone.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..records import Activation, MatchMethod, ModuleKind, TensorPair
from ..records.graph import CARRIER_OPS, GraphIndex, NodeInfo
from .similarity import PLAIN_FACTOR, distance, fit_scale, fits, kind
from .state import AlignInputs, AlignmentState, Claim, pair_to, shared_pair
from .structure import lower_bound, reaches

#: a neighbour's value computed by another module's node: near it, not merely nearer
FUSED_MAX_REL = 0.2
#: outputs this far (relative L2) from PyTorch's: values downstream of a fault no longer tell a fold
FOLD_GATE_REL = 1e-5
#: residual of a fitted scale: float noise only (the folded weights round differently)
SCALE_MAX_REL = 1e-4
#: a scale fitted on a sample of the elements leaving more than this is not worth fitting on all of them
SCREEN_MAX_REL = 1e-2
#: a graph output holding the model's output within float noise (float16 included) can host a fused module
OUTPUT_MAX_REL = 1e-2
#: a structural pair this confident matched within float noise (a loose pair is less)
EXACT_CONFIDENCE = 0.99
#: how many same-sized tensors after a module's inputs are tried for a single folded scale
SCALE_CANDIDATES = 8

#: ops that can compute (part of) a module of each family, ONNX Runtime's fused contrib ops included
HOST_OPS: dict[str, frozenset[str]] = {
    "conv": frozenset({"Conv", "ConvTranspose", "FusedConv", "NhwcConv", "NhwcFusedConv", "QLinearConv",
                       "ConvInteger"}),
    "linear": frozenset({"MatMul", "Gemm", "FusedMatMul", "FusedGemm", "MatMulInteger", "QLinearMatMul",
                         "DynamicQuantizeMatMul", "MatMulNBits", "MatMulIntegerToFloat", "Attention",
                         "MultiHeadAttention", "GroupQueryAttention", "PackedAttention", "Einsum", "Conv",
                         "FusedConv", "QLinearConv"}),
    "batchnorm": frozenset({"BatchNormalization", "Conv", "ConvTranspose", "FusedConv", "NhwcFusedConv",
                            "QLinearConv", "Gemm", "MatMul", "FusedMatMul", "Mul", "Add"}),
    "layernorm": frozenset({"LayerNormalization", "SkipLayerNormalization", "SimplifiedLayerNormalization",
                            "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "RMSNormalization",
                            "ReduceMean", "Div", "Sqrt"}),
    "groupnorm": frozenset({"GroupNormalization", "InstanceNormalization", "GroupNorm", "SkipGroupNorm",
                            "ReduceMean"}),
    "relu": frozenset({"Relu", "Clip", "LeakyRelu", "PRelu", "Max", "Min", "FusedConv", "NhwcFusedConv", "FusedGemm",
                       "FusedMatMul", "QLinearConv", "QLinearLeakyRelu"}),
    "gelu": frozenset({"Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Erf", "Tanh"}),
    "sigmoid": frozenset({"Sigmoid", "HardSigmoid", "HardSwish", "QuickGelu", "FusedConv", "QLinearSigmoid", "Mul"}),
    "tanh": frozenset({"Tanh", "FusedConv"}),
    "embedding": frozenset({"Gather", "GatherND", "GatherElements", "EmbedLayerNormalization"}),
}
#: families whose output may have a scale folded in, and the channel axis the scale runs along
SCALED_FAMILIES = {"linear": -1, "embedding": -1, "conv": 1}



#: the family of each module kind told by class ancestry (a subclass of Conv2d is a conv whatever its name)
KIND_FAMILIES = {ModuleKind.CONV: "conv", ModuleKind.LINEAR: "linear", ModuleKind.BATCHNORM: "batchnorm"}


def family(module_type: str, kind: ModuleKind = ModuleKind.OTHER) -> str | None:
    """The :data:`HOST_OPS` family of a module (by its kind, else its class name), None when unknown."""
    if kind in KIND_FAMILIES:
        return KIND_FAMILIES[kind]
    t = module_type
    if t.startswith(("Conv", "LazyConv")) and t != "Conv1D":
        return "conv"
    if t.endswith("Linear") or t == "Conv1D":  # transformers' Conv1D is a transposed Linear
        return "linear"
    if "BatchNorm" in t:
        return "batchnorm"
    if "LayerNorm" in t or "RMSNorm" in t:
        return "layernorm"
    if t in ("GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"):
        return "groupnorm"
    if t in ("ReLU", "ReLU6", "LeakyReLU", "Hardtanh", "PReLU"):
        return "relu"
    if "GELU" in t or "Gelu" in t:
        return "gelu"
    if t in ("SiLU", "Sigmoid", "Hardswish", "Hardsigmoid", "Swish"):
        return "sigmoid"
    if t == "Tanh":
        return "tanh"
    if t in ("Embedding", "EmbeddingBag"):
        return "embedding"
    return None


def host_node(module_type: str, nodes: list[NodeInfo], kind: ModuleKind = ModuleKind.OTHER) -> NodeInfo | None:
    """The first of ``nodes`` that can compute a module of this type; any node for an unknown type."""
    fam = family(module_type, kind)
    if fam is None:
        return nodes[0] if nodes else None
    return next((n for n in nodes if n.op_type in HOST_OPS[fam]), None)


def pair_into_producer(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """A module whose paired tensor is nearer the next module's value than its own: both are
    computed by one node (an optimizer fused Conv+BN+ReLU); the next module takes the tensor."""
    acts, values = x.acts, x.values
    draft = state.draft()
    for b in acts:
        if b.index in draft or b.passthrough or b.module in x.scopes.boundary or len(b.inputs) != 1:
            continue
        a = acts[b.inputs[0]]
        pa = draft.get(a.index)
        if pa is None or pa.tensor is None or pa.method is MatchMethod.FUSED:
            continue
        v = values.get(pa.tensor)
        if v is None or not fits(v, b.value):
            continue
        if distance(v, b.value) < distance(v, a.value) and distance(v, b.value) <= FUSED_MAX_REL \
                or _folded_norm(a, b, x) and not _normalized_after(pa.tensor, x.graph):
            note = f"{a.name} and {b.name} are computed by one ONNX node"
            draft.claim(pair_to(b, x.graph, pa.tensor, MatchMethod.FUSED, pa.confidence, note))
            draft.claim(TensorPair(a, None, pa.node, pa.op_type, MatchMethod.FUSED, pa.confidence,
                                   f"folded into {pa.node} with {b.name}"), replaces=True)
    return draft.claims


def _normalized_after(tensor: str, graph) -> bool:
    """Whether a BatchNormalization node reads ``tensor`` (through Q/DQ pairs and casts): the BatchNorm after the
    convolution has a node of its own, so it was not folded into the convolution's."""
    return any(n.op_type == "BatchNormalization" for n in graph.readers_through(tensor, CARRIER_OPS, hops=3))


def _folded_norm(a: Activation, b: Activation, x: AlignInputs) -> bool:
    """Whether ``b`` is a BatchNorm right after the Conv or Linear ``a``, with no node of its own, in a file whose
    outputs diverge: the exporter folded it into ``a``'s node, whose tensor is ``b``'s — downstream of a fault
    no value says so (both are far from it), and pairing ``a`` there blames the fold on a fault before it."""
    return (x.output_divergence > FOLD_GATE_REL and family(b.module_type, b.kind) == "batchnorm"
            and family(a.module_type, a.kind) in ("conv", "linear"))


def pair_into_consumers(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Leaf modules with no tensor of their own, computed inside the node of an aligned consumer.

    The consumer's tensor must be backed by its name or its value (a graph
    output only when it holds the model's output), and the nodes computing it
    must include an op that can compute the module.  Walks in reverse call
    order, so a chain (Conv → BatchNorm → ReLU fused into one FusedConv)
    resolves from the aligned end.
    """
    acts, graph, values = x.acts, x.graph, x.values
    draft = state.draft()
    consumers: dict[int, list[Activation]] = defaultdict(list)
    for a in acts:
        for i in a.inputs:
            consumers[i].append(a)
    stops = {p.tensor for p in draft.values() if p.cuttable and p.tensor in graph.producer}
    hosts: dict[int, str] = {}  # fused activation -> the tensor whose nodes compute it
    for a in reversed(acts):
        if a.index in draft or a.passthrough or a.module in x.scopes.boundary or not (a.is_leaf and a.module):
            continue
        for b in consumers.get(a.index, ()):
            pb = draft.get(b.index)
            tensor = hosts.get(b.index) if pb is None or pb.tensor is None else (
                pb.tensor if _backed(pb, graph, values) else None)
            if pb is None or tensor is None:
                continue
            seg = [graph.nodes[i] for i in graph.segment(tensor, frozenset(stops - {tensor}))]
            node = host_node(a.module_type, seg, a.kind)
            if node is None:
                continue
            rule = f" by {node.rewrite_rule}" if node.rewrite_rule else ""
            draft.claim(TensorPair(a, None, node.name, node.op_type, MatchMethod.FUSED, pb.confidence,
                                   f"no ONNX node of its own; folded into {node.name} ({node.op_type}){rule} "
                                   f"with {b.name}"))
            hosts[a.index] = tensor
            if pb.method in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME) and rule:
                draft.claim(TensorPair(pb.activation, pb.tensor, pb.node, pb.op_type, MatchMethod.FUSED,
                                       pb.confidence, f"computed together with {a.name}{rule}"), replaces=True)
            break
    return draft.claims


def _backed(p: TensorPair, graph: GraphIndex, values) -> bool:
    """Whether a pair's tensor is known to compute its activation: by scope, by value, or an
    agreeing graph output (a diverging output says nothing about what computes it)."""
    if p.tensor not in graph.producer:
        return False
    if p.method is MatchMethod.GRAPH_OUTPUT:
        v = values.get(p.tensor)
        return v is not None and v.size == p.activation.value.size and \
            distance(v.reshape(p.activation.value.shape), p.activation.value) <= OUTPUT_MAX_REL
    if p.method is MatchMethod.STRUCTURE:
        return p.confidence >= EXACT_CONFIDENCE  # a loose pair (outputs diverging) proves too little
    return p.method is not MatchMethod.NONE


def pair_scaled(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Modules whose value reaches the graph only times a folded scale (see the module docstring).

    Considers unaligned modules and modules paired by scope whose tensor does
    not hold their value.
    """
    acts, graph, values = x.acts, x.graph, x.values
    reach = reaches(acts, graph, state)
    draft = state.draft()
    claimed: dict[str, list[TensorPair]] = defaultdict(list)  # tensor -> pairs confirmed by value
    for p in draft.values():
        if p.tensor and p.method in (MatchMethod.STRUCTURE, MatchMethod.FUSED, MatchMethod.IDENTITY):
            claimed[p.tensor].append(p)
    # the modules reading each value (a container returning its child's output hands on the same value)
    consumers: dict[int, list[Activation]] = defaultdict(list)
    for b in acts:
        for i in b.inputs:
            consumers[id(acts[i].value)].append(b)
    for a in acts:
        if not a.is_leaf or a.value.dtype.kind != "f":
            continue
        axis = SCALED_FAMILIES.get(family(a.module_type, a.kind) or "")
        if axis is None and not _compensated(consumers.get(id(a.value), ()), draft, values):
            continue
        p = draft.get(a.index)
        if p is not None and (p.method not in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME)
                              or p.tensor not in values or distance(values[p.tensor], a.value) <= SCALE_MAX_REL):
            continue
        found = _scaled_tensor(a, axis, graph, x.scopes, values, claimed, lower_bound(a, reach), p,
                               _carried_noise(a, acts, draft, values))
        if found is None:
            continue
        tensor, scale, later = found
        nodes = [graph.nodes[i] for i in graph.segment(tensor, frozenset(
            q.tensor for q in draft.values() if q.tensor and q.tensor != tensor and q.cuttable))]
        node = host_node(a.module_type, nodes[::-1], a.kind) or graph.node_of(tensor)
        how = (f"one factor {float(scale.factors[0]):.4g}" if scale.axis is None
               else f"a factor per channel (axis {scale.axis})")
        whose = f", the value of {later}" if later else ""
        fused = TensorPair(
            a, None, node.name, node.op_type, MatchMethod.FUSED, round(1.0 - scale.residual, 6),
            f"folded into {node.name} ({node.op_type}) with a scale after it: {tensor} holds its value times "
            f"{how} (residual {scale.residual:.1e}){whose}")
        draft.claim(fused, replaces=True)
        for b in acts:  # a container returning this module's output: unpaired, paired by its scope to the scaled
            q = draft.get(b.index)  # tensor, or to one computed before it (its scope ends at the fused node's input)
            if b.index != a.index and b.value is a.value and (q is None or q.tensor == tensor or (
                    q.tensor in graph.producer and q.method in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME)
                    and graph.order_of(q.tensor) < graph.order_of(tensor))):
                draft.claim(shared_pair(b, fused), replaces=True)
    return draft.claims


def _compensated(consumers, draft, values) -> bool:
    """Whether a module that reads this one holds its own value exactly (a factor folded out of this one's
    output went into the reader's weights: the ×0.5 of an Erf GELU folded into the next convolution). Any
    module's value may then be found scaled; without that proof only a Linear's or a Conv's (whose weights
    take such a factor) — elsewhere a value off by one factor is as likely a wrong scale constant."""
    for b in consumers:
        q = draft.get(b.index)
        if q is not None and q.tensor in values and q.method in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME,
                                                                 MatchMethod.STRUCTURE) \
                and fits(values[q.tensor], b.value) and distance(values[q.tensor], b.value) <= SCALE_MAX_REL:
            return True
    return False


#: an error upstream (a float16 node before the module) leaves a folded scale's fit this much of its own
#: relative distance at most, carried through the module
NOISE_CARRIED = 10.0


def _carried_noise(a: Activation, acts, draft, values) -> float:
    """The relative distance of the module's inputs from PyTorch's (their pairs), carried on: what a fit of a
    folded scale may leave where an error upstream reaches it (float noise alone: 0)."""
    worst = 0.0
    for i in a.inputs:
        q = draft.get(i)
        v = values.get(q.tensor) if q is not None and q.tensor else None
        if v is not None and kind(v) == "f" and v.size == np.size(acts[i].value):
            worst = max(worst, distance(v, np.asarray(acts[i].value).reshape(v.shape)))
    return NOISE_CARRIED * worst


def _fitted(scale, carried: float) -> bool:
    """Whether ``scale`` is a folded scale: fitted within float noise, or within the noise ``carried`` from an
    error upstream with factors plainly not 1 (factors near 1 fit any noisy value)."""
    if scale is None or scale.trivial:
        return False
    if scale.residual <= SCALE_MAX_REL:
        return True
    factors = np.asarray(scale.factors, np.float64)
    return scale.residual <= carried and float(np.min(np.abs(factors - 1.0))) >= PLAIN_FACTOR


def _hosted_by(a: Activation, tensor: str, graph: GraphIndex) -> NodeInfo | None:
    """The node writing ``tensor`` when it can compute a module of ``a``'s family (None for unknown families)."""
    node = graph.node_of(tensor)
    return None if node is None or family(a.module_type, a.kind) is None else host_node(a.module_type, [node], a.kind)


def _scaled_tensor(a: Activation, axis: int, graph: GraphIndex, scopes, values, claimed, lo: int,
                   pair: TensorPair | None, carried: float = 0.0):
    """``(tensor, scale, later activation or "")`` for a tensor holding ``a``'s value scaled (fitted within float
    noise, or within the noise ``carried`` from an error upstream), or None."""
    tried: list[str] = []
    if pair is not None:
        tried.append(pair.tensor)
    tried += [t for t in scopes.boundary.get(a.module, ()) if t in values]
    nearby = [t for t, v in values.items() if v.size == a.value.size and graph.order_of(t) > lo]
    # the nodes that can compute the module first, then the nearest (an attention block's many reshapes of its
    # output's size come before the product that folded the scale after it: ONNX Runtime's FusedMatMul's alpha;
    # a scale folded into a bias as well leaves it on the Add after the product)
    nearby.sort(key=graph.order_of)
    hosted = [t for t in nearby if _hosted_by(a, t, graph) is not None]
    tried += hosted[:SCALE_CANDIDATES] + nearby[:SCALE_CANDIDATES]
    for t in dict.fromkeys(tried):
        v = values.get(t)
        if v is None or v.size != a.value.size:
            continue
        later = next((q.activation.name for q in claimed.get(t, ()) if q.activation.index > a.index), "")
        if later:
            scale = fit_scale(v, a.value, axis, screen=SCREEN_MAX_REL)
            if _fitted(scale, carried):
                return t, scale, later
        scale = fit_scale(v, a.value, None, screen=SCREEN_MAX_REL)
        if _fitted(scale, carried):
            return t, scale, ""
    return None
