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
    by_tensor = {p.tensor: p for p in pairs}
    position = {t: i for i, t in enumerate(order)}
    observed: dict[str, TensorDiff] = {}
    unobservable: list[str] = []
    runs = 0

    def attempt(tensors: list[str]) -> dict[str, TensorDiff] | None:
        nonlocal runs
        runs += 1
        values = observe(tensors)
        if not reproduces(values):
            return None
        return {t: measure(by_tensor[t], values[t]) for t in tensors if t in values}

    coarse = [t for t in order if t in boundaries]
    trusted: list[str] = []
    faithful_boundaries = False
    if coarse:
        got = attempt(coarse)
        if got is not None:
            observed.update(got)
            trusted, faithful_boundaries = coarse, True
    low, high = _window(order, observed)
    pending = [t for t in order[low + 1: high] if t not in observed]
    while pending and runs < max_runs:
        probe = pending[len(pending) // 2]
        got = attempt(trusted + [probe])
        if got is None or probe not in got:
            unobservable.append(probe)
            pending.remove(probe)
            continue
        observed[probe] = got[probe]
        if got[probe].ok:
            pending = [t for t in pending if position[t] > position[probe]]
        else:
            pending = [t for t in pending if position[t] < position[probe]]
    low, high = _window(order, observed)
    if high >= len(order):
        return None, observed
    location = FaithfulLocation(
        last_good=order[low] if low >= 0 else None, first_bad=order[high], runs=runs,
        unobservable=tuple(unobservable), boundaries_faithful=faithful_boundaries,
    )
    return location, observed


def _window(order: list[str], observed: Mapping[str, TensorDiff]) -> tuple[int, int]:
    """``(last good before the first bad, first bad)`` positions among the observed tensors.

    Without an observed divergence the window reaches the end (``len(order)``),
    where the final outputs, which diverge, are.
    """
    high = next((i for i, t in enumerate(order) if t in observed and not observed[t].ok), len(order))
    low = max((i for i, t in enumerate(order[:high]) if t in observed and observed[t].ok), default=-1)
    return low, high
