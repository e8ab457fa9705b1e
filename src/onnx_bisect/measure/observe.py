"""Observe stage: locate the first divergence without changing what the shipped graph computes.

Exposing a tensor as a graph output can stop ONNX Runtime from fusing the
nodes around it (a GELU whose inner Erf is exposed is no longer rewritten into
FastGelu), so an instrumented run may not show the divergence the unmodified
model has.  When that happens, this stage exposes few tensors per run — first
the coarse module boundaries, then one tensor at a time, bisecting between the
last tensor known to agree and the first known to diverge — and trusts a run
only when its final outputs reproduce the unmodified model's.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from ..records import FaithfulLocation, TensorDiff, TensorPair

#: sessions one location may create (bisection needs about log2 of the aligned tensors)
MAX_RUNS = 32

#: run the unmodified graph with these tensors exposed; returns them and the graph outputs
Observe = Callable[[Sequence[str]], Mapping[str, np.ndarray]]


def locate_faithfully(
    pairs: Sequence[TensorPair],
    boundaries: frozenset[str],
    observe: Observe,
    reproduces: Callable[[Mapping[str, np.ndarray]], bool],
    measure: Callable[[TensorPair, np.ndarray], TensorDiff],
    max_runs: int = MAX_RUNS,
) -> tuple[FaithfulLocation | None, dict[str, TensorDiff]]:
    """Bisect the aligned tensors ``pairs`` (in graph order) with faithful observations only.

    ``boundaries`` are the tensors to try first, all in one run (module
    boundaries, where fusions rarely reach).  Returns the location — the last
    faithfully observed tensor within tolerance and the first beyond it — and
    the error of every tensor observed faithfully; ``(None, ...)`` when no
    faithful observation diverges.
    """
    order = [p.tensor for p in pairs]
    observer = _Observer(pairs, observe, reproduces, measure)
    observed: dict[str, TensorDiff] = {}
    trusted = [t for t in order if t in boundaries]
    got = observer.attempt(trusted) if trusted else None
    if got is None:
        trusted = []
    else:
        observed.update(got)
    unobservable = _bisect(order, observed, trusted, observer, max_runs)
    low, high = _window(order, observed)
    if high >= len(order):
        return None, observed
    location = FaithfulLocation(
        last_good=order[low] if low >= 0 else None, first_bad=order[high], runs=observer.runs,
        unobservable=tuple(unobservable), boundaries_faithful=bool(trusted),
    )
    return location, observed


class _Observer:
    """Runs observations and counts them; a run counts only when it reproduces the shipped outputs."""

    def __init__(self, pairs: Sequence[TensorPair], observe: Observe, reproduces, measure):
        self.by_tensor = {p.tensor: p for p in pairs}
        self.observe, self.reproduces, self.measure = observe, reproduces, measure
        self.runs = 0

    def attempt(self, tensors: list[str]) -> dict[str, TensorDiff] | None:
        """The errors of ``tensors`` from one run exposing them, or None when that run changed the outputs."""
        self.runs += 1
        values = self.observe(tensors)
        if not self.reproduces(values):
            return None
        return {t: self.measure(self.by_tensor[t], values[t]) for t in tensors if t in values}


def _bisect(order: list[str], observed: dict[str, TensorDiff], trusted: list[str], observer: _Observer,
            max_runs: int) -> list[str]:
    """Observe one tensor at a time (beside the ``trusted`` ones) between the last agreeing and the first
    diverging tensor, halving the window each run; returns the tensors whose exposure changed the outputs."""
    position = {t: i for i, t in enumerate(order)}
    unobservable: list[str] = []
    low, high = _window(order, observed)
    pending = [t for t in order[low + 1: high] if t not in observed]
    while pending and observer.runs < max_runs:
        probe = pending[len(pending) // 2]
        got = observer.attempt(trusted + [probe])
        if got is None or probe not in got:
            unobservable.append(probe)
            pending.remove(probe)
            continue
        observed[probe] = got[probe]
        if got[probe].ok:
            pending = [t for t in pending if position[t] > position[probe]]
        else:
            pending = [t for t in pending if position[t] < position[probe]]
    return unobservable


def _window(order: list[str], observed: Mapping[str, TensorDiff]) -> tuple[int, int]:
    """``(last good before the first bad, first bad)`` positions among the observed tensors.

    Without an observed divergence the window reaches the end (``len(order)``),
    where the final outputs, which diverge, are.
    """
    high = next((i for i, t in enumerate(order) if t in observed and not observed[t].ok), len(order))
    low = max((i for i, t in enumerate(order[:high]) if t in observed and observed[t].ok), default=-1)
    return low, high
