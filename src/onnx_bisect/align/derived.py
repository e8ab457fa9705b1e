"""Pairs that follow from other pairs: the model's outputs, containers returning a child's tensor, modules
returning their input unchanged."""
from __future__ import annotations

import numpy as np

from ..records import MatchMethod, TensorPair
from .similarity import STRUCTURE_MAX_REL, distance
from .state import AlignInputs, AlignmentState, Claim, pair_to, shared_pair


def pair_graph_outputs(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """The model's own outputs with the graph outputs, by position, where the shapes agree."""
    roots = [a for a in x.acts if a.module == ""]
    draft = state.draft()
    for a, name in zip(roots, x.graph.graph_outputs):
        v = x.values.get(name)
        if v is not None and v.shape == a.value.shape and a.index not in draft:
            draft.claim(pair_to(a, x.graph, name, MatchMethod.GRAPH_OUTPUT))
    return draft.claims


def pair_shared(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """A container returning its last child's tensor unchanged shares that child's pair."""
    by_value: dict[int, TensorPair] = {}
    for a in x.acts:
        p = state.get(a.index)
        if p is not None and p.tensor is not None:
            by_value.setdefault(id(a.value), p)
    draft = state.draft()
    for a in x.acts:
        src = by_value.get(id(a.value))
        if a.index not in draft and src is not None:
            draft.claim(shared_pair(a, src))
    return draft.claims


def pair_identities(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """A module that returns its input unchanged (Dropout in eval) takes its input's tensor — when its input
    still holds the value that activation recorded (an in-place ``out += branch(x)`` between them changes it:
    the input object is then another value, which no ONNX tensor of the producer holds)."""
    acts = x.acts
    draft = state.draft()
    for a in acts:
        if a.index in draft or not a.passthrough:
            continue
        source = next((p for i in a.inputs if (p := draft.get(i)) is not None and p.tensor
                       and acts[i].value.shape == a.value.shape and _unchanged(acts[i].value, a.value)), None)
        if source is not None:
            draft.claim(TensorPair(a, source.tensor, source.node, source.op_type, MatchMethod.IDENTITY,
                                   source.confidence, f"returns its input unchanged ({source.activation.name})"))
    return draft.claims


def _unchanged(before, after) -> bool:
    """Whether two recorded values are one (the same array, or equal element for element)."""
    return before is after or bool(np.array_equal(before, after, equal_nan=True))


def release_conflicting(state: AlignmentState, x: AlignInputs) -> list[Claim]:
    """A tensor holds one value: where activations of different values share it, those whose value it holds
    keep it and the others lose it (a container returning a tuple paired by its scope to one tensor for every
    element, a child taking that pair by sharing its value object).  Where it holds none of them (downstream
    of a fault) nothing is decided here."""
    by_tensor: dict[str, list[TensorPair]] = {}
    for a in x.acts:
        p = state.get(a.index)
        if p is not None and p.tensor is not None and p.tensor in x.values:
            by_tensor.setdefault(p.tensor, []).append(p)
    claims = []
    for tensor, pairs in by_tensor.items():
        if len({id(p.activation.value) for p in pairs}) < 2:
            continue
        held = [p for p in pairs if _holds(x.values[tensor], p)]
        claims += [Claim(p.activation.index, None, replaces=True) for p in pairs
                   if held and p not in held and not any(_same(p, q) for q in held)]
    return claims


def _holds(value: np.ndarray, p: TensorPair) -> bool:
    ref = p.reference()
    return value.size == ref.size and value.dtype.kind == "f" and ref.dtype.kind == "f" \
        and distance(value.reshape(ref.shape), ref) <= STRUCTURE_MAX_REL


def _same(p: TensorPair, q: TensorPair) -> bool:
    a, b = p.activation.value, q.activation.value
    return a.shape == b.shape and a.dtype.kind == "f" and distance(a, b) <= STRUCTURE_MAX_REL
