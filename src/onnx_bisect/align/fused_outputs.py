"""Scope pairs whose tensor holds more than the module computes: a runtime fused what surrounds the module into
one node, so the module's own value exists only inside that node.

ONNX Runtime's offline optimizations leave the node carrying the module's scope but change what it computes:

* a ``FusedConv`` / ``FusedGemm`` applies an activation after the Conv or Gemm (a functional LeakyReLU or
  Softplus, which no module owns): the tensor holds ``activation(module value)``;
* a ``SkipLayerNormalization`` adds its two inputs (and a bias) before normalizing: the module's last Add (an
  embedding's position term) is fused into it, and the tensor the scope ends with holds the value *before*
  that Add.

A simplifier (onnx-simplifier) folds a constant factor into the weights of the layer after a module: GELU's
final ×0.5 into the next Conv's kernel, so the tensor the scope ends with holds twice the module's value.  That
pair becomes ``fused`` when the values show a constant factor, every reader of the tensor is a Conv or MatMul
with constant weights, and a tensor paired after them agrees — within the noise an error upstream leaves on the
scaled tensor, carried on (a wrong scale constant leaves it off by the factor).

Paired there, the module looks diverged on a clean file (a false alarm) and hides every fault after it.  Such a
pair becomes ``fused`` into the node — but only when the values show it: the tensor equals the activation
applied to the module's value, or the fused sum's operands add up to it.
"""
from __future__ import annotations

import numpy as np

from ..records import MatchMethod, ModuleKind, TensorPair
from ..records.graph import NodeInfo
from .fusion import SCREEN_MAX_REL
from .similarity import PLAIN_FACTOR, STRUCTURE_MAX_REL, distance, fit_scale, kind
from .scopes import BIAS_INPUT, SUMMING, bias_added_by
from .state import AlignInputs, AlignmentState, Claim, shared_pair

#: ONNX Runtime's fused nodes that apply an ``activation`` attribute after their op, and the modules they host
ACTIVATED = ("FusedConv", "FusedGemm", "FusedMatMul")
HOSTED = (ModuleKind.CONV, ModuleKind.LINEAR, ModuleKind.BATCHNORM)


def release_fused_outputs(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Scope pairs whose tensor holds the module's value with a fused activation applied, or whose module's
    last Add is summed inside a consumer: claimed ``fused`` into that node instead."""
    draft = state.draft()
    for p in list(draft.values()):
        if p.method not in (MatchMethod.METADATA, MatchMethod.SCOPE_NAME) or p.tensor not in x.graph.producer:
            continue
        v, ref = x.values.get(p.tensor), p.activation.value
        if v is None or ref is None or kind(v) != "f" or kind(ref) != "f" or v.size != ref.size or not v.size:
            continue
        ref = np.asarray(ref, np.float64).reshape(v.shape)
        if distance(v, ref) <= STRUCTURE_MAX_REL:
            continue  # it holds the module's value: nothing fused there
        host = _activation_host(p.activation, p.tensor, v, ref, x) or _summing_host(p, ref, x, draft) \
            or _biased_host(p.activation, p.tensor, v, ref, x) or _scaled_host(p.tensor, v, ref, x, draft)
        if host is not None:
            node, note = host
            fused = TensorPair(p.activation, None, node.name, node.op_type, MatchMethod.FUSED, p.confidence, note)
            draft.claim(fused, replaces=True)
            _share(draft, p.tensor, fused)
    return draft.claims


def _share(draft, tensor: str, fused: TensorPair) -> None:
    """The containers returning the fused module's value, paired by their scope to the same tensor (an attention
    block whose output is its projection's): fused with it."""
    a = fused.activation
    for q in list(draft.values()):
        b = q.activation
        if q.tensor == tensor and b.index != a.index and (b.value is a.value or (
                np.shape(b.value) == np.shape(a.value) and np.array_equal(b.value, a.value))):
            draft.claim(shared_pair(b, fused), replaces=True)


def _activation_host(a, tensor: str, v: np.ndarray, ref: np.ndarray, x: AlignInputs):
    """``(node, note)`` when ``tensor``'s node applies an activation the values show after the module — a module
    the node hosts (a Conv, Linear or a BatchNorm folded into it): an activation module's own value is what the
    node's output must hold (were its bounds wrong, clamping its value again would hide that)."""
    if a.kind not in HOSTED:
        return None
    node = x.graph.node_of(tensor)
    name = node.attribute("activation") if node is not None and node.op_type in ACTIVATED else None
    out = activated(name, tuple(node.attribute("activation_params", ()) or ())) if name else None
    if out is None or distance(v, out(ref)) > STRUCTURE_MAX_REL:
        return None
    return node, f"no ONNX tensor of its own: computed inside {node.name} ({node.op_type}), which applies {name} after it"


#: downstream of an error, a fused sum holding the module's value is this much nearer to it than the tensor before
#: the Add (which lacks a whole operand), at least
SUM_NEARER = 0.01


def _summing_host(p: TensorPair, ref: np.ndarray, x: AlignInputs, draft):
    """``(node, note)`` when a consumer adds ``p``'s tensor to another input and the sum is the module's value —
    with the tensor's own value, or (downstream of a fault, where it is off) with the PyTorch value of the child
    module paired to the same tensor (ESM's output dense, whose bias and residual the runtime sums afterwards)."""
    tensor, v = p.tensor, x.values[p.tensor]
    for c in x.graph.consumers.get(tensor, ()):
        node: NodeInfo = x.graph.nodes[c]
        if node.op_type not in SUMMING or tensor not in node.inputs[:2]:
            continue
        names = [node.inputs[0], node.inputs[1]]
        bias = node.inputs[BIAS_INPUT[node.op_type]] if len(node.inputs) > BIAS_INPUT[node.op_type] else ""
        parts = [x.values.get(n) for n in names + ([bias] if bias else [])]
        if any(q is None or kind(q) != "f" for q in parts):
            continue
        others = [q for n, q in zip(names, parts) if n != tensor]
        # the child computing the tensor, fused into this node by its bias: its PyTorch value has the bias in it
        children = [q.activation.value for q in draft.values() if q.activation.index != p.activation.index
                    and (q.tensor == tensor or q.method is MatchMethod.FUSED and q.node == node.name)
                    and np.size(q.activation.value) == v.size]
        tried = [(v, others + parts[2:])] + [(w, others) for w in children]
        for own, rest in tried:
            if _sums_to(np.asarray(own).reshape(v.shape), rest, ref, v):
                return node, (f"no ONNX tensor of its own: its last Add is summed inside {node.name} "
                              f"({node.op_type}), fused by the runtime")
    return None


def _sums_to(own: np.ndarray, others, ref: np.ndarray, v: np.ndarray) -> bool:
    """Whether ``own`` plus ``others`` holds ``ref`` within float noise — or, downstream of an error (which both
    carry), far nearer than the tensor ``v`` does (a tensor before the Add lacks a whole operand)."""
    try:
        total = sum((np.asarray(q, np.float64) for q in others), np.asarray(own, np.float64))
    except ValueError:  # shapes that do not broadcast
        return False
    return total.size == ref.size and distance(total.reshape(ref.shape), ref) <= max(
        STRUCTURE_MAX_REL, SUM_NEARER * distance(v.reshape(ref.shape), ref))


def _biased_host(a, tensor: str, v: np.ndarray, ref: np.ndarray, x: AlignInputs):
    """``(node, note)`` when a consumer adds a bias to ``tensor`` inside its own op and the tensor holds the
    module's value less a constant per channel: the Linear's bias Add fused into that node."""
    node = bias_added_by(x.graph, x.values, tensor, v, a) if a.kind in HOSTED else None
    if node is None:
        return None
    return node, f"no ONNX tensor of its own: its bias is added inside {node.name} ({node.op_type}), fused by the runtime"


#: how far (tensors) past a scaled tensor a paired tensor that agrees is looked for
SCALED_REACH = 12
#: downstream of an error upstream the scaled tensor is noisy too (its fit's residual): the next pairs carry that
#: noise on (amplified up to this much), not the factor — a wrong scale constant leaves them off by the factor
NOISE_CARRIED = 10.0


def _scaled_host(tensor: str, v: np.ndarray, ref: np.ndarray, x: AlignInputs, draft):
    """``(node, note)`` when ``tensor`` holds the module's value times a factor that a simplifier folded into
    constant weights — one factor into the Convs / MatMuls reading it (GELU's ×0.5), or a factor per channel into
    the Conv / MatMul computing it (a layer scale after the module) — and a paired tensor after it agrees with
    PyTorch: the factor was undone there, not a fault (a wrong scale constant diverges on to the outputs)."""
    graph = x.graph
    readers = graph.weighted_readers(tensor)
    producer = graph.node_of(tensor)
    if readers:
        scale, host = fit_scale(v, ref, None, screen=SCREEN_MAX_REL), readers[0]
        where = f"the weights of {', '.join(n.name for n in readers)}"
        if _folded_into_readers(tensor, scale, readers, x):  # the readers' weights hold the factor: a fold, though a
            return host, (f"no ONNX tensor of its own: the tensor holds it times one factor "
                          f"{float(scale.factors[0]):.4g}, folded into {where} (a simplifier: their weights hold it)")  # faulty reader diverges
    elif producer is not None and graph.has_constant_weights(producer):  # channels first (Conv) or last (MatMul)
        fits = (fit_scale(v, ref, axis, screen=SCREEN_MAX_REL) for axis in (1, -1))
        scale = next((s for s in fits if s is not None and s.residual <= SCREEN_MAX_REL), None)
        host, where = producer, f"its own node's weights ({producer.name})"
        if scale is None and _one_per_channel(v, ref):
            # a 1×1 map (a global stage's Conv): every channel one value, so any factors fit; only the tensor
            # after it agreeing within float noise tells a folded layer scale from a fault here
            return (host, f"no ONNX tensor of its own: one value per channel, the tensor after it agrees — a "
                          f"factor per channel folded into {where} (a simplifier)") \
                if _agreeing_after(tensor, x, draft, STRUCTURE_MAX_REL) else None
    else:
        return None
    # fitted within the noise an error upstream may leave; factors near 1 fit any noisy value (weight noise)
    if scale is None or scale.residual > SCREEN_MAX_REL or scale.trivial \
            or float(np.max(np.abs(np.asarray(scale.factors, np.float64) - 1))) < PLAIN_FACTOR \
            or not _agreeing_after(tensor, x, draft, max(STRUCTURE_MAX_REL, NOISE_CARRIED * scale.residual)):
        return None
    how = f"one factor {float(scale.factors[0]):.4g}" if scale.axis is None else f"a factor per channel (axis {scale.axis})"
    return host, f"no ONNX tensor of its own: the tensor holds it times {how}, folded into {where} (a simplifier)"


#: the factor a tensor holds when an Erf GELU's last ×0.5 was folded into the layers reading it
GELU_FOLDS = (2.0,)


def _scaled_by_constant(tensor: str, x: AlignInputs) -> bool:
    """Whether ``tensor`` is computed by a Mul or Div with a constant scalar operand (the factor is then that
    node's: a wrong constant, not a fold)."""
    node = x.graph.node_of(tensor)
    return node is not None and node.op_type in ("Mul", "Div") and any(
        x.graph.is_constant(i) for i in node.inputs)


def _folded_into_readers(tensor: str, scale, readers, x: AlignInputs) -> bool:
    """Whether ``scale`` (one factor, fitted within float noise) is one the readers' weights hold divided out:
    then the tensor is a fold whatever the readers compute (a fault in the reading Conv makes everything after
    it diverge, so no agreeing tensor downstream could tell the fold)."""
    if scale is None or scale.axis is not None or scale.residual > STRUCTURE_MAX_REL:
        return False
    factor = float(scale.factors[0])
    weights = [n.inputs[1] for n in readers if len(n.inputs) > 1]
    if not weights or len(weights) != len(readers):
        return False
    if x.divided is not None and all(x.divided(w, factor) for w in weights):
        return True
    # the readers' weights scaled per channel too (a layer scale folded with it) hide the factor from their sums:
    # an Erf GELU's ×0.5 is what onnx-simplifier moves out, and only where no constant scales the tensor
    return any(abs(factor - f) <= 1e-3 * f for f in GELU_FOLDS) and not _scaled_by_constant(tensor, x)


def _one_per_channel(v: np.ndarray, ref: np.ndarray) -> bool:
    """Whether ``ref`` (channels on axis 1) holds one value per channel and ``v`` is as large, nonzero."""
    return (v.size == ref.size and ref.ndim >= 3 and ref.size == ref.shape[0] * ref.shape[1] and kind(v) == "f"
            and bool(np.all(np.asarray(ref) != 0)) and bool(np.all(np.isfinite(v))))


def _agreeing_after(tensor: str, x: AlignInputs, draft, within: float) -> bool:
    """Whether a paired tensor computed from ``tensor`` (within a few nodes) holds its activation's value
    ``within`` that relative distance."""
    paired = {p.tensor: p for p in draft.values() if p.tensor and p.method is not MatchMethod.FUSED}
    frontier, seen = [o for c in x.graph.consumers.get(tensor, ()) for o in x.graph.nodes[c].outputs], set()
    while frontier and len(seen) < SCALED_REACH:
        t = frontier.pop(0)
        if t in seen:
            continue
        seen.add(t)
        if t in paired and _agrees(paired[t], x, within):
            return True  # a pair that disagrees may hold its own folded factor (a layer scale): walk on
        frontier += [o for c in x.graph.consumers.get(t, ()) for o in x.graph.nodes[c].outputs]
    return False


def _agrees(p: TensorPair, x: AlignInputs, within: float) -> bool:
    v, ref = x.values.get(p.tensor), p.activation.value
    return (v is not None and ref is not None and kind(v) == "f" and v.size == np.size(ref)
            and distance(v, np.asarray(ref, np.float64).reshape(v.shape)) <= within)


def activated(name: str, params: tuple[float, ...]):
    """The function ONNX Runtime's fused ``activation`` attribute names (None when unknown)."""
    table = {
        "Relu": lambda z: np.maximum(z, 0.0),
        "LeakyRelu": lambda z: np.where(z >= 0, z, (params[0] if params else 0.01) * z),
        "Sigmoid": lambda z: 1.0 / (1.0 + np.exp(-z)),
        "Tanh": np.tanh,
        "Softplus": lambda z: np.logaddexp(0.0, z),
        "Clip": lambda z: np.clip(z, params[0] if params else -np.inf, params[1] if len(params) > 1 else np.inf),
        "HardSigmoid": lambda z: np.clip((params[0] if params else 0.2) * z + (params[1] if len(params) > 1 else 0.5),
                                         0.0, 1.0),
    }
    return table.get(name)
