"""Alternatives of the values ops compute with: an activation's parameter fitted to PyTorch's output or at the
values PyTorch's op (or the ONNX default) uses, a Sigmoid and a HardSigmoid taken for one another, a masking
constant at the values masks are filled with, a LayerNormalization over another axis, a Gemm's alpha and beta
at PyTorch's.  Dispatched from :func:`.op_alternatives.op_alternatives`."""
from __future__ import annotations

from typing import Iterator

import numpy as np
from onnx import numpy_helper

from ..context import attribute
from .alternative_edits import node_value, retyped, with_attributes, with_inputs

#: PyTorch's and the ONNX default HardSigmoid (alpha, beta): an exporter writing one for the other is a classic
HARD_SIGMOIDS = ((1.0 / 6.0, 0.5), (0.2, 0.5))
#: PyTorch's defaults of activation parameters ONNX spells as attributes
DEFAULTS = {"LeakyRelu": {"alpha": (0.01,)}, "Elu": {"alpha": (1.0,)}, "Celu": {"alpha": (1.0,)},
            "ThresholdedRelu": {"alpha": (1.0,)},
            "Selu": {"alpha": (1.6732632423543772,), "gamma": (1.0507009873554805,)}}


# --------------------------------------------------------------------------- activations

def activation(ctx, proto, make) -> Iterator:
    """An activation's parameters at PyTorch's defaults, at the numbers PyTorch's op ran with, fitted to
    PyTorch's output where the node computes the divergent tensor; a Sigmoid and a HardSigmoid swapped."""
    op = proto.op_type
    numbers = op_numbers(ctx, op)
    if op == "Sigmoid":
        for alpha, beta in HARD_SIGMOIDS:
            yield make(proto.name, "op", "Sigmoid", f"HardSigmoid(alpha={alpha:.6g}, beta={beta:.6g})",
                       "the PyTorch output", retyped(proto.name, "HardSigmoid", {"alpha": float(alpha), "beta": float(beta)}))
        return
    if op == "HardSigmoid":
        have = (float(attribute(proto, "alpha", 0.2)), float(attribute(proto, "beta", 0.5)))
        candidates = list(HARD_SIGMOIDS)
        fitted = _fit_hardsigmoid(ctx, proto) if proto.output[0] == ctx.tensor else None
        if fitted is not None:
            candidates.insert(0, fitted)
        for alpha, beta in candidates:
            want = (float(f"{alpha:.6g}"), float(f"{beta:.6g}"))
            if not np.allclose(want, have, rtol=1e-5, atol=0):
                yield make(proto.name, "alpha, beta", [round(v, 6) for v in have], list(want), "the PyTorch output",
                           with_attributes(proto.name, {"alpha": want[0], "beta": want[1]}))
        yield make(proto.name, "op", "HardSigmoid", "Sigmoid", "the PyTorch output", retyped(proto.name, "Sigmoid", {}))
        return
    for name, defaults in DEFAULTS[op].items():
        have = float(attribute(proto, name, defaults[0] if op != "LeakyRelu" else 0.01))
        tried: set[float] = set()
        fitted = _fit_slope(ctx, proto) if op == "LeakyRelu" and proto.output[0] == ctx.tensor else None
        for want, source in [*([(fitted, "the PyTorch output")] if fitted is not None else []),
                             *((x, "PyTorch's op arguments") for x in numbers),
                             *((d, "PyTorch's default") for d in defaults)]:
            key = float(f"{want:.6g}")
            if key in tried or np.isclose(key, have, rtol=1e-5, atol=0):
                continue
            tried.add(key)
            yield make(proto.name, name, round(have, 6), key, source, with_attributes(proto.name, {name: key}))


def op_numbers(ctx, op_type: str = "") -> list[float]:
    """The plain numbers among the divergent op's arguments (a slope, an alpha), then among the arguments of the
    ops PyTorch ran around the segment that compute ``op_type`` (a functional ``leaky_relu(x, 0.1)`` no module
    holds: ``aten.leaky_relu`` for LeakyRelu)."""
    out = _numbers_of(ctx.layer.pair.activation.args)
    if op_type:
        for a in ctx.ops:
            if base_name(a.module_type) == op_type.lower():
                out += [x for x in _numbers_of(a.args) if x not in out]
    return out[:4]


def _numbers_of(args) -> list[float]:
    out = []
    for _, arg in args:
        values = arg if isinstance(arg, (list, tuple)) else [arg]
        out += [float(v) for v in values if isinstance(v, float) and v not in (0.0, 1.0)]
    return out


def base_name(module_type: str) -> str:
    """``leakyrelu`` for ``aten.leaky_relu.default``: an ATen op's name as ONNX spells the op, lower case."""
    parts = module_type.split(".")
    return parts[1].replace("_", "") if len(parts) > 1 and parts[0] == "aten" else ""


def _fit_slope(ctx, proto) -> float | None:
    x = node_value(ctx, proto.input[0])
    y = ctx.reference
    if x is None or x.size != y.size:
        return None
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    neg = (x < 0) & np.isfinite(y)
    if not neg.any():
        return None
    return float(x[neg] @ y[neg] / (x[neg] @ x[neg]))


def _fit_hardsigmoid(ctx, proto) -> tuple[float, float] | None:
    """``(alpha, beta)`` with ``y = alpha·x + beta`` by least squares where PyTorch's output is unsaturated."""
    x = node_value(ctx, proto.input[0])
    y = ctx.reference
    if x is None or x.size != y.size:
        return None
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    inside = (y > 1e-6) & (y < 1 - 1e-6)
    if inside.sum() < 2 or np.ptp(x[inside]) == 0:
        return None
    alpha, beta = np.polyfit(x[inside], y[inside], 1)
    return float(alpha), float(beta)


# --------------------------------------------------------------------------- masks

#: what attention masks are filled with: -inf, float32's lowest, the common large negatives, zero
MASK_FILLS = (float("-inf"), float(np.finfo(np.float32).min), -1e9, -1e4, 0.0)


def mask_values(ctx, proto, make) -> Iterator:
    """A Where's constant branch, an Add's constant mask (two distinct values, the lower replaced) or a
    ConstantOfShape's fill at the value PyTorch's op filled with (``masked_fill``'s argument), then at the values
    masks are commonly filled with."""
    fills = [(x, "PyTorch's op arguments") for x in op_numbers(ctx)] + [(x, "a mask fill value") for x in MASK_FILLS]
    if proto.op_type == "ConstantOfShape":
        value = attribute(proto, "value")
        if value is None:
            return
        have_arr = numpy_helper.to_array(value)
        if have_arr.dtype.kind != "f":
            return
        have = float(have_arr.reshape(-1)[0])
        for want, source in _distinct(fills, have):
            tensor = numpy_helper.from_array(np.array([want], dtype=have_arr.dtype))
            yield make(proto.name, "value", have, want, source, with_attributes(proto.name, {"value": tensor}))
        return
    positions = (1, 2) if proto.op_type == "Where" else (0, 1)
    for position in positions:
        if len(proto.input) <= position:
            continue
        value = ctx.constant(proto.input[position])
        if value is None or value.dtype.kind != "f" or value.size == 0:
            continue
        distinct = np.unique(value)
        if proto.op_type == "Where" and distinct.size == 1:
            have = float(distinct[0])
            for want, source in _distinct(fills, have):
                yield make(proto.name, f"constant input {position}", have, want, source,
                           with_inputs(proto.name, {position: np.full(value.shape, want, value.dtype)}))
        elif proto.op_type == "Add" and distinct.size == 2 and value.size > 1:
            low = float(distinct[0])
            for want, source in _distinct(fills, low):
                if want >= float(distinct[1]):
                    continue
                new = np.where(value == distinct[0], np.array(want, value.dtype), value)
                yield make(proto.name, f"masked entries of constant input {position}", low, want, source,
                           with_inputs(proto.name, {position: new}))


def _distinct(candidates, have: float) -> Iterator[tuple[float, str]]:
    seen: set[float] = set()
    for want, source in candidates:
        key = float(f"{want:.6g}") if np.isfinite(want) else want
        if key in seen or key == have or (np.isfinite(key) and np.isfinite(have) and np.isclose(key, have)):
            continue
        seen.add(key)
        yield key, source


# --------------------------------------------------------------------------- LayerNormalization, Gemm

def norm_axis(proto, shape_of, make) -> Iterator:
    """A LayerNormalization (or an RMS norm) over the other axes of its input (its scale still broadcasting)."""
    shape = shape_of(proto.input[0]) if proto.input else None
    scale = shape_of(proto.input[1]) if len(proto.input) > 1 else None
    if not shape:
        return
    rank = len(shape)
    have = attribute(proto, "axis", -1) % rank
    for axis in range(1, rank):
        if axis != have and (scale is None or len(scale) <= rank - axis):
            yield make(proto.name, "axis", have - rank, axis - rank, "the PyTorch output",
                       with_attributes(proto.name, {"axis": axis - rank}))


def gemm_scalars(ctx, proto, make) -> Iterator:
    """A Gemm's alpha and beta at 1 (a Linear's, ``addmm``'s defaults) or at the numbers PyTorch's op ran with."""
    numbers = op_numbers(ctx)
    for name in ("alpha", "beta"):
        have = float(attribute(proto, name, 1.0))
        for want, source in _distinct([(1.0, "PyTorch's Linear")] + [(x, "PyTorch's op arguments") for x in numbers],
                                      have):
            yield make(proto.name, name, have, want, source, with_attributes(proto.name, {name: want}))
