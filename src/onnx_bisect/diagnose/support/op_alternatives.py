"""Alternatives of indexing ops and activations: what else a Gather, Slice, Reduce, Pad (or a Conv's or a
pooling's pads) and an activation of the divergent segment could have been.

Like :mod:`.alternatives` (which dispatches here), each is an edit of a copy of the model that the attribute
rule tries on the segment alone: a Gather's constant indices fitted to PyTorch's output (the slice of the data
each output slice equals), a Slice window shifted along its axis, a reduction over another axis of the same
size, padding moved from one side of an axis to the other (the total, and so the output shape, kept), an
activation's parameter fitted to PyTorch's output or at the values PyTorch's op (or the ONNX default) uses, a
Sigmoid and a HardSigmoid taken for one another, a Concat's inputs of one shape in another order, a masking
constant at the values masks are filled with, a LayerNormalization over another axis, a Gemm's alpha and beta
at PyTorch's, a Split's sizes moved by an element or made equal.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
import onnx
from onnx import helper, numpy_helper

from . import edits
from ..context import attribute

#: reductions whose axes are tried at others
REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum"})
#: ops with a ``pads`` attribute ([begin..., end...]) that may be moved between sides
PADDED_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "FusedConv"})
#: a Gather's constant indices are fitted (or nudged) only up to this many entries
MAX_INDICES = 64
#: how far a Slice window or padding is moved
SHIFTS = (1, -1, 2, -2)
#: PyTorch's and the ONNX default HardSigmoid (alpha, beta): an exporter writing one for the other is a classic
HARD_SIGMOIDS = ((1.0 / 6.0, 0.5), (0.2, 0.5))
#: PyTorch's defaults of activation parameters ONNX spells as attributes
DEFAULTS = {"LeakyRelu": {"alpha": (0.01,)}, "Elu": {"alpha": (1.0,)}, "Celu": {"alpha": (1.0,)},
            "ThresholdedRelu": {"alpha": (1.0,)}, "Selu": {"alpha": (1.6732632423543772,), "gamma": (1.0507009873554805,)}}


def op_alternatives(ctx, proto: onnx.NodeProto, shape_of, make) -> Iterator:
    """The alternatives of one node of these families; ``make(node, what, have, want, source, edit)`` builds
    an :class:`~.alternatives.Alternative` (passed in to keep the two modules acyclic)."""
    op = proto.op_type
    if op == "Gather":
        yield from _gather(ctx, proto, make)
    elif op == "Slice":
        yield from _slice(ctx, proto, shape_of, make)
    elif op in REDUCE_OPS:
        yield from _reduce(ctx, proto, shape_of, make)
    elif op == "Pad":
        yield from _pad_input(ctx, proto, make)
    elif op in DEFAULTS or op in ("HardSigmoid", "Sigmoid"):
        yield from _activation(ctx, proto, make)
    elif op == "Concat":
        yield from _concat_order(proto, lambda t: shape_of(t) or _constant_shape(ctx, t), make)
    elif op in ("Where", "Add", "ConstantOfShape"):
        yield from _mask_values(ctx, proto, make)
    elif op == "LayerNormalization":
        yield from _norm_axis(proto, shape_of, make)
    elif op == "Gemm":
        yield from _gemm_scalars(ctx, proto, make)
    elif op == "Split":
        yield from _split_sizes(ctx, proto, shape_of, make)
    if op in PADDED_OPS and attribute(proto, "auto_pad", "NOTSET") == "NOTSET":
        yield from _pads_attribute(proto, make)


def _value(ctx, tensor: str) -> np.ndarray | None:
    """``tensor``'s value in the segment computed from exact inputs (a constant as it is)."""
    constant = ctx.constant(tensor)
    if constant is not None:
        return constant
    try:
        return ctx.run_segment(outputs=[tensor]).get(tensor)
    except Exception:  # noqa: BLE001 - a tensor the segment cannot give is simply not fitted
        return None


def _inputs(node: str, values: dict[int, np.ndarray]):
    """The node reading new constants at input positions ``values`` (private copies: a constant the exporter
    shares — a Slice's starts with its steps — keeps its value for every other reader)."""
    def edit(model, weights):
        target = edits.node(model, node)
        for index, value in values.items():
            target.input[index] = edits.add_initializer(model, f"{node}_input{index}_alternative", value)
        return model, weights
    return edit


# --------------------------------------------------------------------------- Gather

def _gather(ctx, proto, make) -> Iterator:
    """Constant indices fitted to PyTorch's output where the Gather computes the divergent tensor (each output
    slice matched with the data slice it equals), else each index one step either way (a few indices only)."""
    if len(proto.input) < 2:
        return
    indices = ctx.constant(proto.input[1])
    if indices is None or indices.dtype.kind not in "iu" or not 0 < indices.size <= MAX_INDICES:
        return
    data = _value(ctx, proto.input[0])
    if data is None or data.dtype.kind != "f" or data.ndim == 0:
        return
    axis = attribute(proto, "axis", 0) % data.ndim
    size = data.shape[axis]
    if _carried_to(ctx, proto.output[0]) == ctx.tensor:
        fitted = _fit_indices(data, axis, indices, ctx.reference)
        if fitted is not None and not np.array_equal(fitted, np.where(indices < 0, indices + size, indices)):
            yield make(proto.name, "indices", indices.tolist(), fitted.tolist(), "the PyTorch output",
                       _inputs(proto.name, {1: fitted.astype(indices.dtype)}))
        return
    if indices.size > 4:
        return
    flat = indices.reshape(-1)
    for p in range(flat.size):
        for step in (1, -1):
            want = flat.copy()
            want[p] = (int(flat[p]) % size) + step
            if 0 <= want[p] < size:
                yield make(proto.name, "indices", indices.tolist(), want.reshape(indices.shape).tolist(),
                           "a neighbouring index", _inputs(proto.name, {1: want.reshape(indices.shape).astype(indices.dtype)}))


#: ops that hand a value on unchanged but for rounding (a quantizer's pair, a cast)
CARRIERS = frozenset({"QuantizeLinear", "DequantizeLinear", "Cast", "Identity"})


def _carried_to(ctx, tensor: str) -> str:
    """The tensor ``tensor``'s value reaches through its only readers when they only round or re-type it (a
    Q/DQ pair after a Gather): the divergent tensor, when the node computes it but for that."""
    graph = ctx.onnx.graph
    for _ in range(4):
        readers = graph.consumers.get(tensor, ())
        if tensor == ctx.tensor or len(readers) != 1 or graph.nodes[readers[0]].op_type not in CARRIERS:
            break
        tensor = graph.nodes[readers[0]].outputs[0]
    return tensor


def _fit_indices(data: np.ndarray, axis: int, indices: np.ndarray, reference: np.ndarray) -> np.ndarray | None:
    """For each index position, the data slice along ``axis`` nearest the reference's slice at that position."""
    expected_shape = data.shape[:axis] + indices.shape + data.shape[axis + 1:]
    if reference.size != int(np.prod(expected_shape)):
        return None
    ref = reference.astype(np.float64).reshape(data.shape[:axis] + (indices.size,) + data.shape[axis + 1:])
    slices = np.moveaxis(data.astype(np.float64), axis, 0).reshape(data.shape[axis], -1)  # (size, rest)
    wanted = np.moveaxis(ref, axis, 0).reshape(indices.size, -1)  # (positions, rest)
    if not np.isfinite(slices).all() or not np.isfinite(wanted).all():
        return None
    distances = ((wanted[:, None, :] - slices[None, :, :]) ** 2).sum(-1)  # (positions, size)
    return distances.argmin(1).reshape(indices.shape)


# --------------------------------------------------------------------------- Slice

def _slice(ctx, proto, shape_of, make) -> Iterator:
    """The window of each sliced axis (step 1) moved one or two elements either way, its length kept."""
    if len(proto.input) < 3:
        return
    shape = shape_of(proto.input[0])
    starts, ends = ctx.constant(proto.input[1]), ctx.constant(proto.input[2])
    axes = ctx.constant(proto.input[3]) if len(proto.input) > 3 and proto.input[3] else None
    steps = ctx.constant(proto.input[4]) if len(proto.input) > 4 and proto.input[4] else None
    if not shape or starts is None or ends is None or starts.ndim != 1 or starts.shape != ends.shape:
        return
    axes = np.arange(starts.size) if axes is None else axes.reshape(-1)
    for k in range(starts.size):
        if steps is not None and int(steps.reshape(-1)[k]) != 1:
            continue
        dim = shape[int(axes[k]) % len(shape)]
        if not isinstance(dim, int):
            continue
        lo, hi = (min(max(int(v) + dim if int(v) < 0 else int(v), 0), dim) for v in (starts[k], ends[k]))
        for d in SHIFTS:
            if hi > lo and 0 <= lo + d and hi + d <= dim:
                new_starts, new_ends = starts.copy(), ends.copy()
                new_starts[k], new_ends[k] = lo + d, hi + d
                yield make(proto.name, f"window along axis {int(axes[k])}", [lo, hi], [lo + d, hi + d],
                           "the PyTorch output", _inputs(proto.name, {1: new_starts, 2: new_ends}))


# --------------------------------------------------------------------------- Reduce

def _reduce(ctx, proto, shape_of, make) -> Iterator:
    """Each reduced axis in turn replaced by another axis: one of the same size first (the output's shape kept),
    then any other of size > 1 (a reduction whose result broadcasts over another axis downstream)."""
    shape = shape_of(proto.input[0]) if proto.input else None
    if not shape:
        return
    rank = len(shape)
    as_input = len(proto.input) > 1 and proto.input[1]
    axes = ctx.constant(proto.input[1]) if as_input else attribute(proto, "axes")
    if axes is None:
        return
    have = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    pairs = [(i, a, b) for i, a in enumerate(have) for b in range(rank) if b not in have and shape[b] == shape[a]]
    pairs += [(i, a, b) for i, a in enumerate(have) for b in range(rank)
              if b not in have and shape[b] != shape[a] and shape[b] != 1]
    for i, _, b in pairs:
        want = sorted(have[:i] + [b] + have[i + 1:])
        edit = (_inputs(proto.name, {1: np.array(want, dtype=np.int64)}) if as_input
                else _attribute(proto.name, "axes", want))
        yield make(proto.name, "axes", have, want, "the PyTorch output", edit)


def _attribute(node: str, name: str, value):
    def edit(model, weights):
        return edits.set_attribute(model, node, name, value), weights
    return edit


# --------------------------------------------------------------------------- padding

def _moved(pads: list[int]) -> Iterator[list[int]]:
    """``pads`` ([begin..., end...]) with one or two elements moved from one side of an axis to the other."""
    n = len(pads) // 2
    for axis in range(n):
        for d in SHIFTS:
            begin, end = pads[axis] + d, pads[axis + n] - d
            if begin >= 0 and end >= 0:
                new = list(pads)
                new[axis], new[axis + n] = begin, end
                yield new


def _pads_attribute(proto, make) -> Iterator:
    pads = attribute(proto, "pads")
    if not pads or not any(pads):
        return
    for want in _moved(list(pads)):
        yield make(proto.name, "pads", list(pads), want, "the PyTorch output", _attribute(proto.name, "pads", want))


def _pad_input(ctx, proto, make) -> Iterator:
    """A Pad's constant pads (its second input) with padding moved between the sides of an axis."""
    if len(proto.input) < 2 or not proto.input[1]:
        return
    pads = ctx.constant(proto.input[1])
    if pads is None or pads.dtype.kind not in "iu" or pads.ndim != 1 or not pads.any() or pads.size % 2:
        return
    for want in _moved([int(v) for v in pads]):
        yield make(proto.name, "pads", pads.tolist(), want, "the PyTorch output",
                   _inputs(proto.name, {1: np.array(want, dtype=pads.dtype)}))


# --------------------------------------------------------------------------- activations

def _activation(ctx, proto, make) -> Iterator:
    """An activation's parameters at PyTorch's defaults, at the numbers PyTorch's op ran with, fitted to
    PyTorch's output where the node computes the divergent tensor; a Sigmoid and a HardSigmoid swapped."""
    op = proto.op_type
    numbers = _op_numbers(ctx)
    if op == "Sigmoid":
        for alpha, beta in HARD_SIGMOIDS:
            yield make(proto.name, "op", "Sigmoid", f"HardSigmoid(alpha={alpha:.6g}, beta={beta:.6g})",
                       "the PyTorch output", _retype(proto.name, "HardSigmoid", {"alpha": alpha, "beta": beta}))
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
                           _attributes(proto.name, {"alpha": want[0], "beta": want[1]}))
        yield make(proto.name, "op", "HardSigmoid", "Sigmoid", "the PyTorch output", _retype(proto.name, "Sigmoid", {}))
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
            yield make(proto.name, name, round(have, 6), key, source, _attributes(proto.name, {name: key}))


def _op_numbers(ctx) -> list[float]:
    """The plain numbers among the divergent op's arguments (a slope, an alpha)."""
    out = []
    for _, arg in ctx.layer.pair.activation.args:
        values = arg if isinstance(arg, (list, tuple)) else [arg]
        out += [float(v) for v in values if isinstance(v, float) and v not in (0.0, 1.0)]
    return out[:4]


def _fit_slope(ctx, proto) -> float | None:
    x = _value(ctx, proto.input[0])
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
    x = _value(ctx, proto.input[0])
    y = ctx.reference
    if x is None or x.size != y.size:
        return None
    x, y = x.astype(np.float64).ravel(), y.astype(np.float64).ravel()
    inside = (y > 1e-6) & (y < 1 - 1e-6)
    if inside.sum() < 2 or np.ptp(x[inside]) == 0:
        return None
    alpha, beta = np.polyfit(x[inside], y[inside], 1)
    return float(alpha), float(beta)


def _attributes(node: str, values: dict):
    def edit(model, weights):
        for name, value in values.items():
            model = edits.set_attribute(model, node, name, value)
        return model, weights
    return edit


def _retype(node: str, op_type: str, attributes: dict):
    """The node computing ``op_type`` with ``attributes`` instead, on the same input and output."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = op_type
        del target.attribute[:]
        target.attribute.extend(helper.make_attribute(k, float(v)) for k, v in attributes.items())
        return model, weights
    return edit


# --------------------------------------------------------------------------- Concat, Split

#: input pairs of one Concat tried swapped
MAX_SWAPPED_INPUTS = 6


def _concat_order(proto, shape_of, make) -> Iterator:
    """Two inputs of one shape swapped (a rotate-half's halves, chunks in another order)."""
    shapes = [shape_of(t) if t else None for t in proto.input]
    pairs = [(i, j) for i in range(len(shapes)) for j in range(i + 1, len(shapes))
             if shapes[i] and shapes[i] == shapes[j] and proto.input[i] != proto.input[j]]
    for i, j in pairs[:MAX_SWAPPED_INPUTS]:
        have = list(proto.input)
        want = list(have)
        want[i], want[j] = have[j], have[i]
        yield make(proto.name, "input order", [i, j], [j, i], "the PyTorch output", _wired(proto.name, want))


def _constant_shape(ctx, tensor: str) -> tuple[int, ...] | None:
    """An initializer's or a Constant's shape (shape inference may leave them out)."""
    value = ctx.constant(tensor)
    return None if value is None else tuple(value.shape)


def _outputs_swapped(node: str, i: int, j: int):
    def edit(model, weights):
        target = edits.node(model, node)
        target.output[i], target.output[j] = target.output[j], target.output[i]
        return model, weights
    return edit


def _wired(node: str, inputs: list[str]):
    def edit(model, weights):
        target = edits.node(model, node)
        del target.input[:]
        target.input.extend(inputs)
        return model, weights
    return edit


def _split_sizes(ctx, proto, shape_of, make) -> Iterator:
    """Two outputs of one shape exchanged (chunks taken in another order: q and k), a Split's constant sizes made
    equal (where the axis divides), or one or two elements moved between two neighbouring outputs."""
    shapes = [shape_of(t) if t else None for t in proto.output]
    pairs = [(i, j) for i in range(len(shapes)) for j in range(i + 1, len(shapes)) if shapes[i] and shapes[i] == shapes[j]]
    for i, j in pairs[:MAX_SWAPPED_INPUTS]:
        yield make(proto.name, "output order", [i, j], [j, i], "the PyTorch output", _outputs_swapped(proto.name, i, j))
    as_input = len(proto.input) > 1 and proto.input[1]
    sizes = ctx.constant(proto.input[1]) if as_input else attribute(proto, "split")
    if sizes is None or len(np.asarray(sizes).reshape(-1)) < 2:
        return
    have = [int(v) for v in np.asarray(sizes).reshape(-1)]
    wants = []
    if sum(have) % len(have) == 0 and len(set(have)) > 1:
        wants.append([sum(have) // len(have)] * len(have))
    for k in range(len(have) - 1):
        for d in SHIFTS:
            want = list(have)
            want[k], want[k + 1] = have[k] + d, have[k + 1] - d
            if min(want) > 0:
                wants.append(want)
    for want in wants:
        edit = (_inputs(proto.name, {1: np.array(want, dtype=np.int64)}) if as_input
                else _attribute(proto.name, "split", want))
        yield make(proto.name, "split", have, want, "the PyTorch output", edit)


# --------------------------------------------------------------------------- masks

#: what attention masks are filled with: -inf, float32's lowest, the common large negatives, zero
MASK_FILLS = (float("-inf"), float(np.finfo(np.float32).min), -1e9, -1e4, 0.0)


def _mask_values(ctx, proto, make) -> Iterator:
    """A Where's constant branch, an Add's constant mask (two distinct values, the lower replaced) or a
    ConstantOfShape's fill at the value PyTorch's op filled with (``masked_fill``'s argument), then at the values
    masks are commonly filled with."""
    fills = [(x, "PyTorch's op arguments") for x in _op_numbers(ctx)] + [(x, "a mask fill value") for x in MASK_FILLS]
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
            yield make(proto.name, "value", have, want, source, _attribute(proto.name, "value", tensor))
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
                           _inputs(proto.name, {position: np.full(value.shape, want, value.dtype)}))
        elif proto.op_type == "Add" and distinct.size == 2 and value.size > 1:
            low = float(distinct[0])
            for want, source in _distinct(fills, low):
                if want >= float(distinct[1]):
                    continue
                new = np.where(value == distinct[0], np.array(want, value.dtype), value)
                yield make(proto.name, f"masked entries of constant input {position}", low, want, source,
                           _inputs(proto.name, {position: new}))


def _distinct(candidates, have: float) -> Iterator[tuple[float, str]]:
    seen: set[float] = set()
    for want, source in candidates:
        key = float(f"{want:.6g}") if np.isfinite(want) else want
        if key in seen or key == have or (np.isfinite(key) and np.isfinite(have) and np.isclose(key, have)):
            continue
        seen.add(key)
        yield key, source


# --------------------------------------------------------------------------- LayerNormalization, Gemm

def _norm_axis(proto, shape_of, make) -> Iterator:
    """A LayerNormalization over the other axes of its input (its scale still broadcasting)."""
    shape = shape_of(proto.input[0]) if proto.input else None
    scale = shape_of(proto.input[1]) if len(proto.input) > 1 else None
    if not shape:
        return
    rank = len(shape)
    have = attribute(proto, "axis", -1) % rank
    for axis in range(1, rank):
        if axis != have and (scale is None or len(scale) <= rank - axis):
            yield make(proto.name, "axis", have - rank, axis - rank, "the PyTorch output",
                       _attribute(proto.name, "axis", axis - rank))


def _gemm_scalars(ctx, proto, make) -> Iterator:
    """A Gemm's alpha and beta at 1 (a Linear's, ``addmm``'s defaults) or at the numbers PyTorch's op ran with."""
    numbers = _op_numbers(ctx)
    for name in ("alpha", "beta"):
        have = float(attribute(proto, name, 1.0))
        for want, source in _distinct([(1.0, "PyTorch's Linear")] + [(x, "PyTorch's op arguments") for x in numbers],
                                      have):
            yield make(proto.name, name, have, want, source, _attribute(proto.name, name, want))


def boundary_swaps(ctx, make_fed) -> Iterator:
    """Two tensors the segment reads that one node outside it produces in one shape (a Split's chunks) fed the
    other way round: the node's outputs exchanged (q and k taken in another order — by value each chunk pairs
    with its own module, so only the segment reading them shows it).  ``make_fed(node, what, have, want,
    source, edit, feeds)`` builds the alternative."""
    feeds = ctx.segment_feeds()
    graph = ctx.onnx.graph
    by_producer: dict[str, list[str]] = {}
    for t, value in feeds.items():
        producer = graph.node_of(t)
        if producer is not None and len(producer.outputs) > 1 and np.issubdtype(np.asarray(value).dtype, np.floating):
            by_producer.setdefault(producer.name, []).append(t)
    for name, tensors in by_producer.items():
        producer = graph.node_of(tensors[0])
        pairs = [(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:]
                 if np.shape(feeds[a]) == np.shape(feeds[b])]
        for a, b in pairs[:MAX_SWAPPED_INPUTS]:
            i, j = producer.outputs.index(a), producer.outputs.index(b)
            yield make_fed(name, "output order", [i, j], [j, i], "the PyTorch output", _outputs_swapped(name, i, j),
                           {a: feeds[b], b: feeds[a]})
