"""Streaming comparison statistics: a large tensor compared block by block, with sums carried between blocks.

The comparison of a whole tensor in float64 costs several float64 copies of it
(the difference, the bound, the ratio, masks): for an attention score tensor of
a long sequence that is gigabytes.  Here each block of at most :data:`BLOCK`
elements is compared in float64 and only running sums and maxima are kept, so
the temporaries are those of one block whatever the tensor's size.  The numbers
are those of :func:`.compare.compare_tensors`' float64 definition (sums are
accumulated in float64 block by block, so they may differ in the last digits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..records import TensorDiff, Tolerance

#: elements per block (a float64 temporary of a block is 8 MiB)
BLOCK = 1 << 20


@dataclass
class _Sums:
    """What the blocks seen so far add up to."""

    n_bad: int = 0  # non-finite on one side only, or different non-finite values
    n_finite: int = 0
    max_ratio: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    sum_err: float = 0.0
    noise: float = 0.0  # Σ err²
    signal: float = 0.0  # Σ b² (finite)
    power_a: float = 0.0  # Σ a² (finite)
    dot: float = 0.0  # Σ a·b (finite)

    def add(self, a: np.ndarray, b: np.ndarray, tol: Tolerance) -> None:
        """One block, both sides in float64."""
        fa, fb = np.isfinite(a), np.isfinite(b)
        finite = fa & fb
        same = ~fa & ~fb & ((a == b) | (np.isnan(a) & np.isnan(b)))
        self.n_bad += int((~finite & ~same).sum())
        err = np.abs(np.subtract(a, b, where=finite, out=np.zeros_like(a)))
        bound = tol.atol + tol.rtol * np.abs(b, where=finite, out=np.zeros_like(b))
        ratio = np.divide(err, bound, where=bound > 0, out=np.where(err > 0, np.inf, 0.0))
        rel = np.divide(err, np.abs(b), where=finite & (b != 0), out=np.zeros_like(a))
        self.max_ratio = max(self.max_ratio, float(ratio.max(initial=0.0)))
        self.max_abs = max(self.max_abs, float(err.max(initial=0.0)))
        self.max_rel = max(self.max_rel, float(rel.max(initial=0.0)))
        af, bf = a[finite], b[finite]
        self.n_finite += af.size
        self.sum_err += float(err.sum())
        self.noise += float(np.dot(err.ravel(), err.ravel()))
        self.signal += float(np.dot(bf, bf))
        self.power_a += float(np.dot(af, af))
        self.dot += float(np.dot(af, bf))


def blocks(actual: np.ndarray, expected: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The two (equally shaped) tensors in blocks of at most :data:`BLOCK` elements, as flat float64 arrays:
    runs of rows along the leading axes (views where the layout allows, so no whole copy is made)."""
    shape = expected.shape
    lead = next((i for i, d in enumerate(shape) if d != 1), len(shape))
    yield from _split(actual.reshape(shape[lead:] or (1,)), expected.reshape(shape[lead:] or (1,)))


def _split(a: np.ndarray, b: np.ndarray) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    if a.size <= BLOCK or a.ndim == 1:
        for i in range(0, max(a.size, 1), BLOCK):
            yield (a.reshape(-1)[i:i + BLOCK].astype(np.float64), b.reshape(-1)[i:i + BLOCK].astype(np.float64))
        return
    per_row = math.prod(a.shape[1:])
    if per_row > BLOCK:
        for i in range(a.shape[0]):
            yield from _split(a[i], b[i])
        return
    step = BLOCK // per_row
    for i in range(0, a.shape[0], step):
        yield a[i:i + step].astype(np.float64).ravel(), b[i:i + step].astype(np.float64).ravel()


def compare_blocked(actual: np.ndarray, expected: np.ndarray, tol: Tolerance, half: bool,
                    low_precision_ulps: float) -> TensorDiff:
    """:func:`.compare.compare_tensors` of two equally shaped tensors, block by block; ``half``: judged at
    float16 resolution (their rounding steps, ``ulps``, may reach ``low_precision_ulps``)."""
    sums = _Sums()
    for a, b in blocks(actual, expected):
        sums.add(a, b, tol)
    ulps = _ulps(actual, expected, sums) if half else None
    bad = sums.n_bad > 0
    noise, signal = sums.noise, sums.signal
    sqnr = float("inf") if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else float("-inf"))
    return TensorDiff(
        max_abs=float("inf") if bad else sums.max_abs,
        max_rel=float("inf") if bad else sums.max_rel,
        mean_abs=sums.sum_err / sums.n_finite if sums.n_finite else 0.0,
        cosine=_cosine(sums),
        tol_ratio=float("inf") if bad else sums.max_ratio,
        ok=not bad and (sums.max_ratio <= 1.0 or (ulps is not None and ulps <= low_precision_ulps)),
        shape=tuple(expected.shape),
        nonfinite=sums.n_bad,
        sqnr_db=float("-inf") if bad else sqnr,
        dtype=str(actual.dtype),
        ulps=ulps,
    )


def _ulps(actual: np.ndarray, expected: np.ndarray, sums: _Sums) -> float | None:
    """The largest error in float16 rounding steps, the step taken at max(|ref|, rms(ref)) (a second pass: the
    rms is known only once every block is seen)."""
    if not sums.n_finite:
        return None
    info = np.finfo(np.float16)
    scale = max(math.sqrt(sums.signal / sums.n_finite), float(info.tiny))
    worst = 0.0
    for a, b in blocks(actual, expected):
        finite = np.isfinite(a) & np.isfinite(b)
        err = np.abs(a[finite] - b[finite])
        worst = max(worst, float((err / (np.maximum(np.abs(b[finite]), scale) * float(info.eps))).max(initial=0.0)))
    return worst


def _cosine(sums: _Sums) -> float:
    na, nb = math.sqrt(sums.power_a), math.sqrt(sums.signal)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.clip(sums.dot / (na * nb), -1.0, 1.0))
