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
    a = onnx_value.astype(np.float64, copy=False).ravel()
    b = ref.astype(np.float64, copy=False).ravel()
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return distance(onnx_value, ref)
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 or nb == 0:
        return distance(onnx_value, ref)
    return min(float(np.linalg.norm(a - b) / nb), float(np.linalg.norm(a / na - b / nb)))


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


def fit_scale(onnx_value: np.ndarray, ref: np.ndarray, axis: int | None) -> Scale | None:
    """The least-squares factor(s) with ``onnx ≈ factor · ref``, the ONNX tensor in any layout of ``ref``.

    ``axis`` is the channel axis of ``ref`` (negative counts from the end), or
    None for a single factor.  Returns the best-fitting layout, or None when
    the sizes differ, a channel is empty, or no factor is finite.
    """
    if onnx_value.size != ref.size or kind(onnx_value) != "f" or kind(ref) != "f" or not ref.size:
        return None
    best = None
    for perm in perms(ref, onnx_value):
        r = laid_out(ref, perm)
        y = onnx_value.reshape(r.shape).astype(np.float64)
        x = r.astype(np.float64)
        if axis is None:
            xs, ys = x.reshape(1, -1), y.reshape(1, -1)
        else:
            if ref.ndim == 0:
                return None
            ax = axis % ref.ndim
            moved = ax if perm is None else perm.index(ax)
            xs = np.moveaxis(x, moved, 0).reshape(ref.shape[ax], -1)
            ys = np.moveaxis(y, moved, 0).reshape(ref.shape[ax], -1)
            if xs.shape[1] < MIN_PER_CHANNEL:
                return None
        norms = np.einsum("ij,ij->i", xs, xs)
        if not np.all(norms > 0) or not np.isfinite(ys).all():
            continue
        factors = np.einsum("ij,ij->i", xs, ys) / norms
        residual = float(np.linalg.norm(ys - factors[:, None] * xs) / (np.linalg.norm(ys) + 1e-30))
        if best is None or residual < best.residual:
            best = Scale(axis, factors, residual, perm)
    return best
