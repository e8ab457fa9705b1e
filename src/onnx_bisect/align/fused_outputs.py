"""Scope pairs whose tensor holds more than the module computes: a runtime fused what surrounds the module into
one node, so the module's own value exists only inside that node.

ONNX Runtime's offline optimizations leave the node carrying the module's scope but change what it computes:

* a ``FusedConv`` / ``FusedGemm`` applies an activation after the Conv or Gemm (a functional LeakyReLU or
  Softplus, which no module owns): the tensor holds ``activation(module value)``;
* a ``SkipLayerNormalization`` adds its two inputs (and a bias) before normalizing: the module's last Add (an
  embedding's position term) is fused into it, and the tensor the scope ends with holds the value *before*
  that Add.

Paired there, the module looks diverged on a clean file (a false alarm) and hides every fault after it.  Such a
pair becomes ``fused`` into the node — but only when the values show it: the tensor equals the activation
applied to the module's value, or the fused sum's operands add up to it.
"""
from __future__ import annotations

import numpy as np

from ..records import MatchMethod, ModuleKind, TensorPair
from ..records.graph import NodeInfo
from .similarity import STRUCTURE_MAX_REL, distance, kind
from .scopes import SUMMING
from .state import AlignInputs, AlignmentState, Claim

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
        host = _activation_host(p.activation, p.tensor, v, ref, x) or _summing_host(p.tensor, ref, x)
        if host is not None:
            node, note = host
            draft.claim(TensorPair(p.activation, None, node.name, node.op_type, MatchMethod.FUSED, p.confidence,
                                   note), replaces=True)
    return draft.claims


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


def _summing_host(tensor: str, ref: np.ndarray, x: AlignInputs):
    """``(node, note)`` when a consumer adds ``tensor`` to another input and the sum is the module's value."""
    for c in x.graph.consumers.get(tensor, ()):
        node: NodeInfo = x.graph.nodes[c]
        if node.op_type not in SUMMING or tensor not in node.inputs[:2]:
            continue
        names = [node.inputs[0], node.inputs[1]] + ([node.inputs[4]] if len(node.inputs) > 4 and node.inputs[4] else [])
        parts = [x.values.get(n) for n in names]
        if any(p is None or kind(p) != "f" for p in parts):
            continue
        try:
            total = sum(np.asarray(p, np.float64) for p in parts)
        except ValueError:  # shapes that do not broadcast
            continue
        if total.size == ref.size and distance(total.reshape(ref.shape), ref) <= STRUCTURE_MAX_REL:
            return node, (f"no ONNX tensor of its own: its last Add is summed inside {node.name} ({node.op_type}), "
                          "fused by the runtime")
    return None


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
