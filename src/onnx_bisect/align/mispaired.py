"""Scope pairs that name another quantity: a tensor a module's scope hands on that is not its output at all."""
from __future__ import annotations

from collections import defaultdict

from ..records import MatchMethod
from ..records.graph import GraphIndex, reached_from
from .absent import holds
from .similarity import kind
from .state import AlignInputs, AlignmentState, Claim, pair_to


def repair_other_quantities(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """Scope pairs whose tensor does not hold the activation's value and is not computed from the tensor of the
    module's scope that does: re-paired to that tensor (the last such in graph order).  The dynamo exporter
    shares a computation identical across layers (LayoutLMv3's relative position bias divided by √d, computed in
    the first layer's attention and read by every layer's): the shared tensor leaves the first layer's scope,
    and by shape it was taken for that attention's probabilities, a false divergence in a clean file.  A fault
    after the module's own computation (a frozen dropout mask multiplied in) computes the paired tensor from the
    one holding the value, and keeps its pair."""
    draft = state.draft()
    nodes_of: dict[str, list[int]] = defaultdict(list)
    for i, q in x.scopes.module_of.items():
        nodes_of[q].append(i)
    for pair in list(draft.values()):
        a, t = pair.activation, pair.tensor
        if pair.method is not MatchMethod.METADATA or t not in x.values or kind(a.value) != "f" \
                or holds(a.value, x.values[t]):
            continue
        # a module with no node of its own (a Dropout in eval) returns a value its parent's scope computes
        region = nodes_of.get(a.module) or nodes_of.get(a.module.rpartition(".")[0], [])
        holders = [o for i in sorted(region) for o in x.graph.nodes[i].outputs
                   if o and o != t and o in x.values and x.values[o].shape == a.value.shape
                   and holds(a.value, x.values[o])]
        holders = [h for h in holders if not _computed_from(x.graph, t, h)]
        if holders:
            draft.claim(pair_to(a, x.graph, holders[-1], MatchMethod.METADATA, pair.confidence,
                                f"'{t}', which its scope hands on, holds another value"), replaces=True)
            continue
        # no tensor of the scope holds it (a fault inside the module): a tensor not computed from the module's
        # inputs is no output of the module at all, and measuring it there would blame what computed it
        sources = _input_tensors(draft, x, a)
        if sources and not any(_computed_from(x.graph, t, s) for s in sources):
            draft.release(a.index)
    return draft.claims


def _input_tensors(draft, x: AlignInputs, a) -> list[str]:
    """The tensors paired with the activations ``a`` was computed from — for a module that read none of them (a
    Dropout applied to an op's value), those of the call of its parent that encloses it."""
    inputs = a.inputs
    if not inputs:
        parent = a.module.rpartition(".")[0] if a.module else None
        enclosing = next((b for b in x.capture.activations[a.index + 1:] if b.module == parent), None)
        inputs = enclosing.inputs if enclosing is not None else ()
    pairs = [draft.get(i) for i in inputs]
    return [p.tensor for p in pairs if p is not None and p.tensor]


def _computed_from(graph: GraphIndex, tensor: str, source: str) -> bool:
    """Whether ``tensor`` is computed (directly or not) from ``source``: the nodes between them, in graph order."""
    steps = ((n.inputs, n.outputs, False) for n in graph.nodes[graph.order_of(source) + 1:graph.order_of(tensor) + 1])
    return tensor in reached_from([source], steps)
