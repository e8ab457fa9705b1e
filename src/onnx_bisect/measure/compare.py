"""Compare stage: numbers describing how far an ONNX tensor is from its reference."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..records import TensorDiff, Tolerance
from . import streaming


#: elementwise rounding steps a float16 value may carry and still count as agreeing
#: with the float32 reference (inputs rounded to float16, one op's rounding, and the
#: summation order of a reduction)
LOW_PRECISION_ULPS = 8.0


#: above this many elements even the float32 fast path's whole-tensor temporaries are left to the blocks
FAST_MAX = 1 << 26


def shape_mismatch(actual: np.ndarray, expected: np.ndarray) -> TensorDiff:
    """Two tensors whose shapes cannot be laid over each other: infinitely apart, ``actual_shape`` saying what
    ONNX computed."""
    inf = float("inf")
    return TensorDiff(inf, inf, inf, 0.0, inf, False, tuple(expected.shape), dtype=str(actual.dtype),
                      actual_shape=tuple(actual.shape))


def compare_tensors(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> TensorDiff:
    """Compare an ONNX value with the PyTorch reference in float64.

    Pass/fail follows numpy's ``allclose``: ``|a - b| <= atol + rtol * |b|``
    elementwise, ``b`` being the reference.  Tensors whose sizes differ are
    infinitely apart (``actual_shape`` says what ONNX computed).  NaN/inf count as equal only where
    both sides have the same non-finite value.  ``max_rel`` is ``|a-b| / |b|``
    over the elements whose reference is non-zero.

    A float16 ONNX tensor cannot hold the float32 reference exactly: it also
    passes when every element is within a few float16 rounding steps of the
    reference (``ulps``, measured at the scale of the tensor's values), and
    both numbers are reported.
    """
    if actual.shape != expected.shape:
        if actual.size == expected.size:
            actual = actual.reshape(expected.shape)
        else:
            return shape_mismatch(actual, expected)
    fast = _fast_path(actual, expected)
    if actual.size > streaming.BLOCK and (not fast or actual.size > FAST_MAX):
        # no whole-tensor float64 temporaries: block by block (the float32 fast path's temporaries are a few
        # float32 copies, cheap below FAST_MAX and 4-8x faster than the blocks)
        return streaming.compare_blocked(actual, expected, tol, _resolution(actual) == np.float16,
                                         LOW_PRECISION_ULPS)
    if fast:
        return _compare_finite32(actual, expected, tol)
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    same_nonfinite = (~np.isfinite(a)) & (~np.isfinite(b)) & ((a == b) | (np.isnan(a) & np.isnan(b)))
    bad_nonfinite = (~np.isfinite(a) | ~np.isfinite(b)) & ~same_nonfinite
    finite = np.isfinite(a) & np.isfinite(b)
    err = np.abs(np.subtract(a, b, where=finite, out=np.zeros_like(a)))
    bound = tol.atol + tol.rtol * np.abs(b, where=finite, out=np.zeros_like(b))
    ratio = np.divide(err, bound, where=bound > 0, out=np.where(err > 0, np.inf, 0.0))
    nonzero = finite & (b != 0)
    rel = np.divide(err, np.abs(b), where=nonzero, out=np.zeros_like(a))
    n_bad = int(bad_nonfinite.sum())
    max_ratio = float(ratio.max()) if ratio.size else 0.0
    ulps = _ulps(err, b, finite, _resolution(actual))
    ok = n_bad == 0 and (max_ratio <= 1.0 or (ulps is not None and ulps <= LOW_PRECISION_ULPS))
    signal = float(np.square(b[finite]).sum()) if finite.any() else 0.0
    noise = float(np.square(err).sum())
    sqnr = float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf"))
    return TensorDiff(
        max_abs=float("inf") if n_bad else (float(err.max()) if err.size else 0.0),
        max_rel=float("inf") if n_bad else (float(rel.max()) if rel.size else 0.0),
        mean_abs=float(err[finite].mean()) if finite.any() else 0.0,
        cosine=_cosine(a[finite], b[finite]),
        tol_ratio=float("inf") if n_bad else max_ratio,
        ok=ok,
        shape=tuple(expected.shape),
        nonfinite=n_bad,
        sqnr_db=float("inf") if n_bad == 0 and noise == 0 else (float("-inf") if n_bad else sqnr),
        dtype=str(actual.dtype),
        ulps=ulps,
    )


class HalfResolution(np.ndarray):
    """A float32 ONNX value computed from float16 data: its values are not changed, only judged at float16
    resolution (see :func:`at_resolution`)."""


def at_resolution(values: Mapping[str, np.ndarray], half_resolution: frozenset[str] | set[str]) -> dict[str, np.ndarray]:
    """``values`` with each float32 tensor of ``half_resolution`` (computed from float16 data) marked as
    :class:`HalfResolution`, so that its comparison allows float16 rounding.  The numbers are untouched."""
    out = dict(values)
    for name in half_resolution:
        v = out.get(name)
        if v is not None and v.dtype in (np.float32, np.float64) and not isinstance(v, HalfResolution):
            out[name] = v.view(HalfResolution)
    return out


def _resolution(actual: np.ndarray) -> np.dtype:
    """The precision ``actual`` was computed in: float16 for float16 tensors and half-resolution ones."""
    return np.dtype(np.float16) if isinstance(actual, HalfResolution) else np.dtype(actual.dtype)


def check_tensors(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> TensorDiff:
    """The allclose verdict, max abs and tolerance ratio only (the other metrics are NaN: not measured).

    For the many layers of a configuration whose outputs agree, where only
    these three numbers are kept (a verification matrix); anything else, and
    float16 tensors (whose verdict needs their rounding steps), gets
    :func:`compare_tensors`.
    """
    if (actual.shape != expected.shape or actual.size > FAST_MAX or not _fast_path(actual, expected)
            or actual.dtype != np.float32 or isinstance(actual, HalfResolution)):
        return compare_tensors(actual, expected, tol)
    err, ratio, decided = _error_and_ratio(actual, np.asarray(expected, dtype=np.float32), tol)
    if not decided:
        return compare_tensors(actual, expected, tol)
    nan = float("nan")
    return TensorDiff(max_abs=float(err.max()), max_rel=nan, mean_abs=nan, cosine=nan, tol_ratio=ratio,
                      ok=ratio <= 1.0, shape=tuple(expected.shape), sqnr_db=nan, dtype=str(actual.dtype))


def _fast_path(actual: np.ndarray, expected: np.ndarray) -> bool:
    """float32/float16 tensors with no inf/NaN on either side: the common case, measured in float32."""
    if actual.dtype not in _SMALL_FLOATS or expected.dtype not in _SMALL_FLOATS or not actual.size:
        return False
    return bool(np.isfinite(actual).all() and np.isfinite(expected).all())


_SMALL_FLOATS = (np.dtype(np.float32), np.dtype(np.float16))


def _compare_finite32(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> TensorDiff:
    """:func:`compare_tensors` for finite float32/float16 tensors in float32, in reused scratch memory.

    A large model compares hundreds of tensors per run; float64 copies and fresh
    temporaries made that cost as much as the forward pass itself.  Differences
    of float32 values are exact in float32 when the values are close (Sterbenz),
    sums are pairwise or blocked (float64-grade for these sizes), and a verdict within float32 rounding of
    the bound is re-checked in float64, so the numbers and the pass/fail are
    those of the float64 definition.
    """
    a = np.asarray(actual, dtype=np.float32)
    b = np.asarray(expected, dtype=np.float32)
    err, max_ratio, decided = _error_and_ratio(a, b, tol)
    if not decided:  # too close to call in float32: decide in float64
        exact = np.abs(a.astype(np.float64) - b) <= tol.atol + tol.rtol * np.abs(b.astype(np.float64))
        max_ratio = 1.0 if exact.all() else max(max_ratio, 1.0 + 1e-5)
    work = _scratch(1, b.shape)
    np.abs(b, out=work)
    work[work == 0] = np.inf  # max_rel is over the non-zero reference elements
    np.divide(err, work, out=work)
    max_rel = float(work.max())
    noise, signal, power_a = _sum_of_squares(err), _sum_of_squares(b), _sum_of_squares(a)
    ulps = _ulps(err.astype(np.float64), b.astype(np.float64), np.ones(b.shape, bool), np.float16) \
        if _resolution(actual) == np.float16 else None
    norm_a, norm_b = np.sqrt(power_a), np.sqrt(signal)
    if norm_a == 0 and norm_b == 0:
        cosine = 1.0
    elif norm_a == 0 or norm_b == 0:
        cosine = 0.0
    else:
        # 1 - (|a-b|² - (|a|-|b|)²) / (2|a||b|): exact algebra, and rounding in the norms barely moves it,
        # where (|a|² + |b|² - |a-b|²) / (2|a||b|) would lose the digits that matter near 1.
        cosine = float(np.clip(1.0 - (noise - (norm_a - norm_b) ** 2) / (2 * norm_a * norm_b), -1.0, 1.0))
    return TensorDiff(
        max_abs=float(err.max()),
        max_rel=max_rel,
        mean_abs=float(np.sum(err)) / err.size,  # numpy sums float32 pairwise: float64-grade accuracy
        cosine=cosine,
        tol_ratio=max_ratio,
        ok=max_ratio <= 1.0 or (ulps is not None and ulps <= LOW_PRECISION_ULPS),
        shape=tuple(expected.shape),
        sqnr_db=float("inf") if noise == 0 else (10 * np.log10(signal / noise) if signal > 0 else float("-inf")),
        dtype=str(actual.dtype),
        ulps=ulps,
    )


def _sum_of_squares(x: np.ndarray) -> float:
    """Σ x² by BLAS (float32, blocked: relative error near 1e-6, which the cosine formula above absorbs)."""
    flat = x.reshape(-1)
    return float(np.dot(flat, flat))


def _error_and_ratio(a: np.ndarray, b: np.ndarray, tol: Tolerance) -> tuple[np.ndarray, float, bool]:
    """``(|a - b| in scratch slot 0, max of |a - b| / (atol + rtol|b|), decided)``; not decided when the
    ratio lies within float32 rounding of 1, where only float64 can tell pass from fail."""
    err = _scratch(0, b.shape)
    np.subtract(a, b, out=err)
    np.abs(err, out=err)
    work = _scratch(1, b.shape)
    np.abs(b, out=work)
    work *= np.float32(tol.rtol)
    work += np.float32(tol.atol)
    with np.errstate(divide="ignore", invalid="ignore"):
        np.divide(err, work, out=work)  # inf where the bound is 0 and err > 0, nan where both are 0
    if tol.atol == 0:
        np.nan_to_num(work, copy=False, nan=0.0, posinf=np.inf)
    ratio = float(work.max())
    return err, ratio, abs(ratio - 1.0) >= 1e-5


_SCRATCH: list[np.ndarray] = [np.empty(0, np.float32), np.empty(0, np.float32)]


def _scratch(slot: int, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 work array of ``shape`` backed by memory kept between calls (fresh pages cost more than
    the arithmetic)."""
    size = int(np.prod(shape))
    if _SCRATCH[slot].size < size:
        _SCRATCH[slot] = np.empty(size, np.float32)
    return _SCRATCH[slot][:size].reshape(shape)


def _ulps(err: np.ndarray, ref: np.ndarray, finite: np.ndarray, dtype: np.dtype) -> float | None:
    """Max error in float16 rounding steps; the step is taken at max(|ref|, rms(ref)) so
    values near zero are not judged on a resolution finer than the tensor's own scale."""
    if np.dtype(dtype) != np.float16 or not finite.any():
        return None
    info = np.finfo(np.float16)
    scale = max(float(np.sqrt(np.mean(np.square(ref[finite])))), float(info.tiny))
    step = np.maximum(np.abs(ref), scale) * float(info.eps)
    return float((err / step).max())


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.clip(a @ b / (na * nb), -1.0, 1.0))
