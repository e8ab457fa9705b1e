"""Trace an amplified error to the segment that introduces it.

The outputs diverge, yet no segment's own (local) error exceeds the tolerance: a segment introduces a small
error — a weight off by 2e-4 of its spread, a LayerNorm computed in float16 — and the layers after it
multiply it past the tolerance. Comparing tensors one by one cannot see that; cutting can. With the cut
points in graph order, let ``E(k)`` be the outputs' worst error (in units of the tolerance) when the first
``k`` cut tensors are fed their PyTorch values and everything from the ``k``-th on computes freely from its
own values. ``E(0)`` is the shipped model's divergence and ``E`` falls as the cuts move down the graph;
binary search finds the ``k`` across which ``E`` falls through the middle of its range — the segment
computing the ``k``-th tensor is where most of the error the rest amplifies comes in (``log2(n)`` runs of one
session, see ``Runner.switched``).

When cutting that one segment removes at least half of the shipped divergence above the floor no cut
removes (``E(k) - E(k+1) >= (E(0) - E(n)) / 2``: ``E(n)``, every cut fed, is the error made after the last cut
point, which a quantized model's last layers leave however exact their inputs), it is blamed (an
:class:`Amplification`); when the error builds up over many segments (a whole model in float16 at a float32
tolerance), ``E`` falls a little at each cut and no single segment is blamed.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import numpy as np

from ..measure import compare
from ..records import Amplification, ErrorOrigin, LayerResult, TensorDiff, Tolerance
from .verdict import compare_outputs

#: the share of the shipped divergence that cutting the blamed segment must remove (else: spread out)
CONCENTRATED = 0.5


def bisect_amplification(run: Callable[[frozenset[str]], dict[str, np.ndarray]], ordered: list[str],
                         outputs_ratio: Callable[[dict[str, np.ndarray]], float],
                         local_ratio: Callable[[str], float]) -> Amplification | None:
    """The segment whose small error the rest of the graph amplifies past the tolerance, or None.

    ``run(cut)`` runs the graph with the tensors in ``cut`` fed their PyTorch values; ``ordered`` are the
    cut tensors in graph order; ``outputs_ratio`` is the outputs' worst tolerance ratio of a run."""
    if not ordered:
        return None
    memo: dict[int, float] = {}

    def error(k: int) -> float:
        if k not in memo:
            memo[k] = outputs_ratio(run(frozenset(ordered[:k])))
        return memo[k]

    if error(0) <= 1.0 or error(len(ordered)) > 1.0:
        return None  # the switched graph does not diverge, or the error comes in after the last cut point
    # the floor: what no cut removes (the error made after the last cut point: a quantized model's last
    # layers round however exact their inputs); a segment carrying at least half of the divergence above it
    # is the one across which the error falls through the middle of that range
    floor = error(len(ordered))
    middle = (error(0) + floor) / 2
    lo, hi = 0, len(ordered)  # error(lo) > middle >= error(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if error(mid) > middle else (lo, mid)
    with_it, without = error(lo), error(hi)
    if with_it - without < CONCENTRATED * (error(0) - floor):
        return None  # this segment's share of the shipped divergence is small: the error is spread out
    return Amplification(tensor=ordered[lo], local_ratio=local_ratio(ordered[lo]), output_ratio=with_it,
                         output_ratio_without=without, output_ratio_all=error(0), runs=len(memo),
                         cut_points=len(ordered))


def outputs_ratio(captured, index, tolerance: Tolerance) -> Callable[[dict[str, np.ndarray]], float]:
    """The worst tolerance ratio over the graph outputs of a run (judged as the outputs' verdict is)."""
    def ratio(values: dict[str, np.ndarray]) -> float:
        return max((o.diff.tol_ratio for o in compare_outputs(captured, index, values, tolerance)), default=0.0)

    return ratio


def amplified_layer(layers: tuple[LayerResult, ...], amp: Amplification) -> LayerResult | None:
    """The layer computing the blamed tensor (its innermost module), its local error restated against the
    tolerance that the amplification leaves it (:func:`amplified_tolerance`)."""
    rows = [r for r in layers if r.pair.tensor == amp.tensor and r.local is not None]
    if not rows:
        return None
    row = max(rows, key=lambda r: (r.pair.activation.is_leaf, r.pair.activation.module.count(".")))
    scale = _scale(amp)
    local = dataclasses.replace(row.local, tol_ratio=row.local.tol_ratio / scale, ok=False)
    return dataclasses.replace(row, local=local, origin=ErrorOrigin.INTRODUCED)


def amplified_tolerance(tolerance: Tolerance, amp: Amplification) -> Tolerance:
    """The tolerance the blamed segment's own error must meet for the outputs to meet theirs: the user's,
    divided by how much the layers after it amplify (an error below it stays below tolerance at the outputs,
    to first order)."""
    scale = _scale(amp)
    return Tolerance(atol=tolerance.atol * scale, rtol=tolerance.rtol * scale)


def plain_compare(tolerance: Tolerance) -> Callable[[np.ndarray, np.ndarray], TensorDiff]:
    """Compare at ``tolerance`` as computed: an amplified error is judged by what it does downstream, so a
    float32 tensor holding float16 data gets no float16 allowance here."""
    return functools.partial(_plain, tol=tolerance)


def _plain(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> TensorDiff:
    return compare.compare_tensors(np.asarray(actual), expected, tol)


def _scale(amp: Amplification) -> float:
    """Local ratio over output ratio: scaling atol and rtol by it turns the segment's local ratio into the
    outputs' (allclose ratios scale inversely with the tolerance)."""
    return amp.local_ratio / amp.output_ratio if amp.output_ratio > 0 else 1.0
