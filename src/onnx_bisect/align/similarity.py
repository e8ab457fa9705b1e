"""How alike an ONNX tensor and a PyTorch activation are, for the align stage.

Distances are relative L2 in float64; layouts cover reshapes and axis
permutations; a fitted scale says whether one tensor is the other times a
constant (one per channel, or one for all).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np


def distance(onnx_value: np.ndarray, ref: np.ndarray) -> float:
    """Relative L2 distance ``|onnx - ref| / |ref|`` over the elements finite on both sides."""
    fast = _float_pair(onnx_value, ref)
    if fast is not None:
        a, b = fast
        d = a - b
        num, den = float(np.sqrt(np.dot(d, d))), float(np.sqrt(np.dot(b, b)))
        if np.isfinite(num) and np.isfinite(den):
            return num / (den + 1e-12)
    a = onnx_value.astype(np.float64, copy=False).ravel()
    b = ref.astype(np.float64, copy=False).ravel()
    finite = np.isfinite(a) & np.isfinite(b)
    if not finite.any():
        return float("inf")
    num = np.linalg.norm(a[finite] - b[finite])
    den = np.linalg.norm(b[finite]) + 1e-12
    return float(num / den)


def nearness(onnx_value: np.ndarray, ref: np.ndarray) -> float:
    """The smaller of :func:`distance` and the distance between the two directions
    (``|a/|a| − b/|b||``): a tensor scaled wrong (an epsilon fault rescales every row) is
    far in value but near in direction."""
    value = distance(onnx_value, ref)
    fast = _float_pair(onnx_value, ref)
    if fast is None:
        return value
    a, b = fast
    na, nb, ab = float(np.dot(a, a)), float(np.dot(b, b)), float(np.dot(a, b))
    if not (np.isfinite(na) and np.isfinite(nb) and np.isfinite(ab)) or na == 0 or nb == 0:
        return value
    cosine = ab / np.sqrt(na * nb)
    return min(value, float(np.sqrt(max(0.0, 2.0 - 2.0 * cosine))))


def _float_pair(onnx_value: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Both flattened in one float dtype, at least float32 (a dot product there is exact
    enough for every threshold the align stage uses, and far cheaper than float64)."""
    if onnx_value.dtype.kind != "f" or ref.dtype.kind != "f":
        return None
    dtype = np.result_type(onnx_value.dtype, ref.dtype, np.float32)
    return onnx_value.astype(dtype, copy=False).ravel(), ref.astype(dtype, copy=False).ravel()


def kind(v: np.ndarray) -> str:
    """Float, bool or integer: tensors of different kinds never hold the same activation."""
    return "f" if v.dtype.kind in "fc" else ("b" if v.dtype.kind == "b" else "i")


def fits(onnx_value: np.ndarray, ref: np.ndarray) -> bool:
    """Same shape and kind."""
    return onnx_value.shape == ref.shape and kind(onnx_value) == kind(ref)


def perms(ref: np.ndarray, v: np.ndarray):
    """None (``ref`` as is, up to a reshape) first, then axis permutations of ``ref``
    whose shape matches ``v``'s once size-1 axes are dropped."""
    yield None
    if ref.ndim > 5 or ref.ndim < 2:
        return
    dims = [d for d in v.shape if d != 1]
    for perm in itertools.permutations(range(ref.ndim)):
        if perm == tuple(range(ref.ndim)):
            continue
        shape = [ref.shape[i] for i in perm]
        if [d for d in shape if d != 1] == dims:
            yield perm


def laid_out(ref: np.ndarray, perm: tuple[int, ...] | None) -> np.ndarray:
    """``ref`` in the axis order ``perm`` (None: unchanged)."""
    return ref if perm is None else ref.transpose(perm)


@dataclass(frozen=True)
class Scale:
    """``onnx ≈ scale · ref`` with one factor per channel (``axis`` of ``ref``) or one for all (``axis`` None)."""

    axis: int | None
    factors: np.ndarray
    residual: float  # relative L2 of onnx − scale·ref
    perm: tuple[int, ...] | None = None  # layout of the ONNX tensor, as in :func:`perms`

    @property
    def trivial(self) -> bool:
        """Every factor is 1: the tensors are equal, no scale was folded in."""
        return bool(np.all(np.abs(self.factors - 1.0) <= 1e-3))


#: channels need this many values each before a per-channel factor means anything
MIN_PER_CHANNEL = 4


def fit_scale(onnx_value: np.ndarray, ref: np.ndarray, axis: int | None, screen: float | None = None
              ) -> Scale | None:
    """The least-squares factor(s) with ``onnx ≈ factor · ref``, the ONNX tensor in any layout of ``ref``.

    ``axis`` is the channel axis of ``ref`` (negative counts from the end), or
    None for a single factor.  Returns the best-fitting layout, or None when
    the sizes differ, a channel is empty, or no factor is finite.  With
    ``screen``, a layout whose fit on a random sample of the elements leaves a
    residual above ``screen`` is skipped without fitting every element.
    """
    if onnx_value.size != ref.size or kind(onnx_value) != "f" or kind(ref) != "f" or not ref.size or not ref.ndim:
        return None
    best = None
    for perm in perms(ref, onnx_value):
        r = laid_out(ref, perm)
        y = onnx_value.reshape(r.shape)
        channel = None if axis is None else (axis % ref.ndim if perm is None else perm.index(axis % ref.ndim))
        if channel is not None and r.size // r.shape[channel] < MIN_PER_CHANNEL:
            return None
        if screen is not None and r.size > SCREEN_SAMPLE:
            # spread over the tensor; a stride prime to the channel count visits every channel
            sample = np.unravel_index((np.arange(SCREEN_SAMPLE) * (r.size // SCREEN_SAMPLE | 1) + 7) % r.size, r.shape)
            fitted = _fit(r[sample], y[sample], None if channel is None else sample[channel],
                          1 if channel is None else r.shape[channel])
            if fitted is None or fitted[1] > screen:
                continue
        x = r.astype(np.float64)
        xs = x.reshape(1, -1) if channel is None else np.moveaxis(x, channel, 0).reshape(r.shape[channel], -1)
        ys = (y.astype(np.float64).reshape(1, -1) if channel is None
              else np.moveaxis(y.astype(np.float64), channel, 0).reshape(r.shape[channel], -1))
        norms = np.einsum("ij,ij->i", xs, xs)
        if not np.all(norms > 0) or not np.isfinite(ys).all():
            continue
        factors = np.einsum("ij,ij->i", xs, ys) / norms
        if not np.all(np.abs(factors) > 0):
            continue  # zeros are no scaled copy of anything (a ReLU that zeroes every value, say)
        residual = float(np.linalg.norm(ys - factors[:, None] * xs) / (np.linalg.norm(ys) + 1e-30))
        if best is None or residual < best.residual:
            best = Scale(axis, factors, residual, perm)
    return best


#: elements a screening fit looks at
SCREEN_SAMPLE = 2048


def _fit(x: np.ndarray, y: np.ndarray, channels: np.ndarray | None, n: int) -> tuple[np.ndarray, float] | None:
    """Factors and residual of ``y ≈ factor[channel] · x`` over paired samples."""
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    ch = np.zeros(x.size, np.intp) if channels is None else np.asarray(channels).ravel()
    sxx = np.bincount(ch, x * x, n)
    factors = np.divide(np.bincount(ch, x * y, n), sxx, out=np.zeros(n), where=sxx > 0)
    if not np.any(y):
        return None  # all zeros: no scaled copy (see fit_scale)
    return factors, float(np.linalg.norm(y - factors[ch] * x) / (np.linalg.norm(y) + 1e-30))


#: relative L2 distance within which two tensors hold the same value: float32 noise
STRUCTURE_MAX_REL = 1e-4
#: a factor folded into weights, fitted within the noise an error upstream leaves, is told from that noise by
#: being this far from 1 (factors near 1 fit any noisy value)
PLAIN_FACTOR = 0.1
#: the same for a scope output read by a node of unknown scope (an optimizer's fused node)
WEAK_MAX_REL = 1e-3
#: the same for a float16 / bfloat16 tensor
HALF_MAX_REL = 1e-2
#: the same for a tensor quantized to 8 bits on its way
QUANTIZED_MAX_REL = 0.1


def is_half(v: np.ndarray) -> bool:
    """Whether ``v`` is float16 or bfloat16."""
    return v.dtype == np.float16 or v.dtype.name == "bfloat16"


def agreement(v: np.ndarray) -> float:
    """Largest relative L2 distance at which a tensor of ``v``'s dtype still holds the same value."""
    return HALF_MAX_REL if is_half(v) else WEAK_MAX_REL


def float_noise(v: np.ndarray) -> float:
    """Largest relative L2 distance that rounding alone explains for a tensor of ``v``'s dtype."""
    return HALF_MAX_REL if is_half(v) else STRUCTURE_MAX_REL
