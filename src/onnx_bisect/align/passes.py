"""The alignment passes, in order: the one place that says which pass runs when.

Methods, in order of trust:

1. graph outputs for the model's own outputs;
2. scope: the node's module path (dynamo metadata or TorchScript-style names);
3. fusion when a module has no tensor of its own (a BatchNorm folded into the
   preceding Conv, a scale folded into a MatMul; see :mod:`.fusion`), run again
   after each pass below;
4. identity for modules that return their input unchanged (Dropout in eval),
   and containers returning a child's tensor;
5. structure: the same elements (up to a reshape or transpose) after the
   tensors of the activation's inputs, accepted only when the values agree;
6. absent: values an exporter folded into a constant;
7. loose structure, only in a graph without scope information whose outputs
   diverge: the nearest value after the inputs, so that a fault is still
   located at its own segment rather than at the last module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..records import Capture, TensorPair
from ..records.graph import GraphIndex
from . import absent, derived, fused_outputs, fusion, mispaired, scopes, structure
from .state import AlignInputs, AlignmentState, Claim


def _always(x: AlignInputs) -> bool:
    return True


@dataclass(frozen=True)
class Pass:
    """One alignment pass: a name, what it claims from the state, and when it applies."""

    name: str
    run: Callable[[AlignmentState, AlignInputs], list[Claim]]
    applies: Callable[[AlignInputs], bool] = _always


#: pairs that follow from pairs just made; run after every pass that pairs by value
SETTLE = (Pass("shared tensors", derived.pair_shared), Pass("identities", derived.pair_identities))

PASSES: tuple[Pass, ...] = (
    Pass("graph outputs", derived.pair_graph_outputs),
    Pass("module scopes", scopes.pair_by_scope),
    Pass("scope tensors holding another quantity", mispaired.repair_other_quantities),
    Pass("containers computed before their children", scopes.release_early_containers),
    Pass("fused by the runtime", fused_outputs.release_fused_outputs),
    Pass("fused into the producer", fusion.pair_into_producer),
    *SETTLE,
    Pass("one value per tensor", derived.release_conflicting),
    Pass("structure", structure.pair_by_structure),
    *SETTLE,
    Pass("folded scales", fusion.pair_scaled),
    Pass("fused into a consumer", fusion.pair_into_consumers),
    *SETTLE,
    # before loose pairs: a value the file holds as a constant is no tensor's (BEiT's relative position bias,
    # folded: downstream of a fault its nearest tensor was the scores it is added to)
    Pass("folded constants", absent.mark_folded_constants),
    Pass("loose structure", structure.pair_loosely, structure.loose_gate),
    Pass("fused into a consumer (loose)", fusion.pair_into_consumers, structure.loose_gate),
    *(Pass(f"{p.name} (loose)", p.run, structure.loose_gate) for p in SETTLE),
    Pass("constants holding another value", absent.release_constants),
    Pass("tensors no output reads", absent.release_unread),
)


def align_activations(capture: Capture, graph: GraphIndex, scope_map: scopes.ScopeMap,
                      values: dict[str, np.ndarray], anchor: Callable[[], dict[str, float]] | None = None,
                      divided: Callable[[str, float], bool] | None = None) -> tuple[TensorPair, ...]:
    """Pair every activation with an ONNX tensor (or say why none), in capture order; ``anchor()`` gives the
    layers anchored by their weights (:func:`.anchors.anchored_owners`), asked only when pairs are loose;
    ``divided(weight, factor)`` whether a weight holds a layer's divided by a folded factor."""
    inputs = AlignInputs(capture, graph, scope_map, values, anchor, divided)
    state = AlignmentState()
    for p in PASSES:
        if p.applies(inputs):
            state = state.apply(p.run(state, inputs))
    return tuple(state.get(a.index) or absent.unmatched(a, scope_map, values) for a in capture.activations)
