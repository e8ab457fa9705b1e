"""Compare stage: numbers describing how far an ONNX tensor is from its reference."""
from __future__ import annotations

import numpy as np

from .records import TensorDiff, Tolerance


#: elementwise rounding steps a float16 value may carry and still count as agreeing
#: with the float32 reference (inputs rounded to float16, one op's rounding, and the
#: summation order of a reduction)
LOW_PRECISION_ULPS = 8.0


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
            return TensorDiff(float("inf"), float("inf"), float("inf"), 0.0, float("inf"), False,
                              tuple(expected.shape), dtype=str(actual.dtype), actual_shape=tuple(actual.shape))
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
    ulps = _ulps(err, b, finite, actual.dtype)
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
