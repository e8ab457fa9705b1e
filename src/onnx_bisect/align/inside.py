"""Name-free alignment inside a divergent segment: PyTorch's ops paired with the segment's ONNX tensors by value.

The segment is run with every tensor it computes exposed, fed the exact
PyTorch values at its inputs.  Upstream of a fault its tensors then equal the
outputs of PyTorch's ops within float noise; downstream of it, nothing does.
So, without a single name or scope:

* **good** tensors hold an op's value (a *strong* match when the shapes agree
  too; a tensor that only holds the right numbers in another shape is *weak* —
  a wrong Reshape target produces exactly that);
* **bad** tensors hold no op's value and feed no good tensor (a decomposition's
  intermediate, an erf-GELU's ``x/√2``, has no counterpart but feeds a good
  tensor, so it is not bad);
* each bad tensor gets the op outputs that could be its counterpart: same
  number of elements, nearest in value or direction, not matched elsewhere.

Which candidate is right is then decided by running the segment (see
:mod:`onnx_bisect.pipeline.refine`): feeding PyTorch's value at the right one
removes the error downstream of it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..records import Activation
from ..records.graph import GraphIndex
from .similarity import distance, float_noise, kind, nearness, perms, laid_out

#: counterparts tried per bad tensor
CANDIDATES_PER_TENSOR = 2


@dataclass(frozen=True)
class Match:
    """An ONNX tensor holding an op's value: ``strong`` when its shape is the op output's too."""

    tensor: str
    op: Activation
    strong: bool
    perm: tuple[int, ...] | None = None  # the tensor holds the op's value transposed (an exporter's layout)


@dataclass(frozen=True)
class Candidate:
    """A bad tensor and an op output that may be its counterpart, with how near their values are."""

    tensor: str
    op: Activation
    nearness: float
    perm: tuple[int, ...] | None = None


def match_values(ops: tuple[Activation, ...], values: dict[str, np.ndarray], tensors: list[str]) -> dict[str, Match]:
    """Each of ``tensors`` (floating point, in graph order) that holds an op's value within float noise.

    A tensor of the op output's shape must hold it as is; a tensor of another
    shape may hold it reshaped, or transposed (an exporter's layout) — a weak match.
    """
    by_size: dict[int, list[Activation]] = {}
    for a in ops:
        if kind(a.value) == "f" and a.value.size:
            by_size.setdefault(a.value.size, []).append(a)
    found: dict[str, Match] = {}
    for t in tensors:
        v = values.get(t)
        if v is None or kind(v) != "f" or not v.size:
            continue
        match = _exact(v, t, by_size.get(v.size, ()))
        if match is not None:
            found[t] = match
    return found


def _exact(v: np.ndarray, tensor: str, ops) -> Match | None:
    """The op whose value ``v`` holds within float noise: same shape first, then reshaped or transposed."""
    noise = float_noise(v)
    weak = None
    for a in ops:
        ref = a.value
        if ref.shape == v.shape:
            if distance(v, ref) <= noise:
                return Match(tensor, a, True)
            continue
        if weak is None:
            for perm in perms(ref, v):
                r = laid_out(ref, perm)
                if distance(v.reshape(r.shape), r) <= noise:
                    weak = Match(tensor, a, False, perm)
                    break
    return weak


def bad_tensors(tensors: list[str], matched: dict[str, Match], graph: GraphIndex, within: set[str],
                values: dict[str, np.ndarray]) -> list[str]:
    """The floating-point ``tensors`` (graph order) that hold no op's value and feed no tensor that does,
    inside the tensors ``within`` (the segment's)."""
    feeds_good: set[str] = set()
    for t in reversed(tensors):  # reverse graph order: consumers before producers
        if t in matched or any(o in feeds_good for i in graph.consumers.get(t, ())
                               for o in graph.nodes[i].outputs if o in within):
            feeds_good.add(t)
    return [t for t in tensors if t not in feeds_good and t in values and kind(values[t]) == "f"]


def candidates(bad: list[str], ops: tuple[Activation, ...], values: dict[str, np.ndarray],
               matched: dict[str, Match]) -> list[Candidate]:
    """For each bad tensor (in graph order), the op outputs that may be its counterpart: as many elements,
    not the value of a good tensor, nearest first (in value or in direction: a wrong scale keeps the
    direction, a wrong axis keeps neither)."""
    taken = {id(m.op) for m in matched.values()}
    out: list[Candidate] = []
    for t in bad:
        v = values[t]
        scored = []
        for a in ops:
            if id(a) in taken or a.value.size != v.size or kind(a.value) != "f":
                continue
            scored.append(_nearest_layout(v, a))
        scored.sort(key=lambda c: c[0])
        out += [Candidate(t, a, near, perm) for near, perm, a in scored[:CANDIDATES_PER_TENSOR]]
    return out


def _nearest_layout(v: np.ndarray, a: Activation) -> tuple[float, tuple[int, ...] | None, Activation]:
    """``(nearness, perm, a)``: the op value as is when the shapes agree, else its nearest layout."""
    ref = a.value
    if ref.shape == v.shape:
        return _nearness(v, ref), None, a
    best = (float("inf"), None, a)
    for perm in perms(ref, v):
        r = laid_out(ref, perm)
        near = _nearness(v.reshape(r.shape), r)
        if near < best[0]:
            best = (near, perm, a)
    return best


def _nearness(v: np.ndarray, ref: np.ndarray) -> float:
    with np.errstate(all="ignore"):
        near = nearness(v, ref)
    return near if np.isfinite(near) else float("inf")
