"""Alternatives of indexing and wiring: what else a Gather, Slice, Reduce, Pad (or a Conv's or a pooling's
pads), Concat or Split of the divergent segment could have been — and the dispatcher of these families and of
:mod:`.value_alternatives` (activations, mask fills, a LayerNormalization's axis, a Gemm's alpha and beta).

Like :mod:`.alternatives` (which dispatches here), each is an edit of a copy of the model that the attribute
rule tries on the segment alone: a Gather's constant indices fitted to PyTorch's output (the slice of the data
each output slice equals), a Slice window shifted along its axis, a reduction over another axis, padding moved
from one side of an axis to the other (the total, and so the output shape, kept), a Concat's inputs or a
Split's outputs of one shape in another order, a Split's sizes moved by an element or made equal, and two chunks
a node outside the segment makes fed the other way round.
"""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
import onnx

from ...records.graph import CARRIER_OPS
from ..context import attribute
from . import layout
from .alternative_edits import node_value, outputs_swapped, rewired, slices_swapped, with_attributes, with_inputs
from .rewirings import reads_right
from .rows import nearest_rows
from .value_alternatives import DEFAULTS, activation, gemm_scalars, mask_values, norm_axis

#: reductions whose axes are tried at others
REDUCE_OPS = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                        "ReduceLogSumExp", "ReduceSumSquare", "ReduceLogSum"})
#: ops with a ``pads`` attribute ([begin..., end...]) that may be moved between sides
PADDED_OPS = frozenset({"Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool", "FusedConv"})
#: a Gather's constant indices are fitted (or nudged) only up to this many entries
MAX_INDICES = 64
#: how far a Slice window or padding is moved
SHIFTS = (1, -1, 2, -2)


#: normalizations over the axes from an ``axis`` attribute on (ONNX Runtime's RMS norm, SimplifiedLayerNormalization,
#: and ONNX's RMSNormalization included)
AXIS_NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"})


def op_alternatives(ctx, proto: onnx.NodeProto, shape_of, make) -> Iterator:
    """The alternatives of one node of these families; ``make(node, what, have, want, source, edit)`` builds
    an :class:`~.alternatives.Alternative` (passed in to keep the two modules acyclic)."""
    op = proto.op_type
    if op == "Gather":
        yield from _gather(ctx, proto, make)
        yield from _gather_axis(ctx, proto, shape_of, make)
    elif op in ("Unsqueeze", "Squeeze"):
        yield from _moved_axes(ctx, proto, shape_of, make)
    elif op == "Slice":
        yield from _slice(ctx, proto, shape_of, make)
    elif op in REDUCE_OPS:
        yield from _reduce(ctx, proto, shape_of, make)
    elif op == "Pad":
        yield from _pad_input(ctx, proto, make)
    elif op in DEFAULTS or op in ("HardSigmoid", "Sigmoid"):
        yield from activation(ctx, proto, make)
    elif op == "Concat":
        orders = (*_fitted_order(ctx, proto, make),
                  *_concat_order(proto, lambda t: shape_of(t) or _constant_shape(ctx, t), make))
        yield from (_with_selections(ctx, proto, alt) for alt in orders)
    elif op in ("Where", "Add", "ConstantOfShape"):
        yield from mask_values(ctx, proto, make)
    elif op in AXIS_NORMS:
        yield from norm_axis(proto, shape_of, make)
    elif op == "Gemm":
        yield from gemm_scalars(ctx, proto, make)
    elif op == "Split":
        yield from _split_sizes(ctx, proto, shape_of, make)
    if op in PADDED_OPS and attribute(proto, "auto_pad", "NOTSET") == "NOTSET":
        yield from _pads_attribute(proto, make)


# --------------------------------------------------------------------------- Gather

def _gather(ctx, proto, make) -> Iterator:
    """Constant indices fitted to PyTorch's output where the Gather computes the divergent tensor (each output
    slice matched with the data slice it equals), else each index one step either way (a few indices only)."""
    if len(proto.input) < 2:
        return
    indices = ctx.constant(proto.input[1])
    if indices is None or indices.dtype.kind not in "iu" or not 0 < indices.size <= MAX_INDICES:
        return
    data = node_value(ctx, proto.input[0])
    if data is None or data.dtype.kind != "f" or data.ndim == 0:
        return
    axis = attribute(proto, "axis", 0) % data.ndim
    size = data.shape[axis]
    reference = _reference_at(ctx, proto.output[0])
    if reference is not None:
        if _table_changed(ctx, proto.input[0], data):
            return  # the indices would be fitted to the rows of a table that is not PyTorch's: its weight's case
        fitted = _fit_indices(data, axis, indices, reference)
        if fitted is not None and not np.array_equal(fitted, np.where(indices < 0, indices + size, indices)):
            yield make(proto.name, "indices", indices.tolist(), fitted.tolist(), "the PyTorch output",
                       with_inputs(proto.name, {1: fitted.astype(indices.dtype)}))
        return
    signed = _signed_selections(ctx, proto, data, axis, indices)
    if signed:
        for args in signed:  # shown in the Mul applying the signs too
            alt = make(*args)
            yield dataclasses.replace(alt, shows_in=(graph_reader(ctx, proto),)) if alt is not None else alt
        return
    if indices.size > 4:
        return
    flat = indices.reshape(-1)
    # one index (a time step, a class token) is tried at every position of a short axis, nearest first; a few
    # indices one step either way
    steps = sorted(range(-size + 1, size), key=abs)[1:] if flat.size == 1 and size <= MAX_ONE_INDEX else (1, -1)
    for p in range(flat.size):
        for step in steps:
            want = flat.copy()
            want[p] = (int(flat[p]) % size) + step
            if 0 <= want[p] < size:
                yield make(proto.name, "indices", indices.tolist(), want.reshape(indices.shape).tolist(),
                           "the PyTorch output",
                           with_inputs(proto.name, {1: want.reshape(indices.shape).astype(indices.dtype)}))


def _table_changed(ctx, tensor: str, data: np.ndarray) -> bool:
    """Whether the gathered table is an initializer holding a PyTorch parameter's numbers changed (named after it,
    or related: a position table resampled, another checkpoint's) and none exactly: indices fitted to its rows
    would only make up for it (rows 0, 2, 4 … of a table interpolated by 2 hold the parameter's rows 0, 1, 2 …)."""
    if ctx.initializer(tensor) is None:
        return False
    relations = {name: layout.relate(np.asarray(data), np.asarray(value))
                 for name, value in layout.torch_candidates(ctx).items() if np.size(value) == data.size}
    if any(r is not None and r.equal for r in relations.values()):
        return False
    return any(r is not None and (r.related or name == tensor) for name, r in relations.items())


def graph_reader(ctx, proto) -> str:
    """The name of the one node reading ``proto``'s first output."""
    graph = ctx.onnx.graph
    return graph.nodes[graph.consumers[proto.output[0]][0]].name


def _signed_selections(ctx, proto, data: np.ndarray, axis: int, indices: np.ndarray) -> list[tuple]:
    """A Gather of constant indices whose output a Mul by a constant of ±1 along the same axis reads (a signed
    selection: a rotation's pairs, a flip) where PyTorch's ops of that shape hold other signed selections of the
    same data — rotary pairs (i, i+1) rotated where PyTorch rotates halves (i, i + d/2): the indices and the
    signs fitted to each such op's value, as the Alternatives' arguments (``make(*those)``), nearest op first."""
    graph = ctx.onnx.graph
    readers = [graph.nodes[r] for r in graph.consumers.get(proto.output[0], ())]
    if indices.ndim != 1 or len(readers) != 1 or readers[0].op_type != "Mul":
        return []
    mul = readers[0]
    k = 1 - list(mul.inputs).index(proto.output[0])
    signs = ctx.constant(mul.inputs[k]) if len(mul.inputs) == 2 else None
    taken = np.take(data, indices, axis=axis)
    if signs is None or signs.size != indices.size or not np.all(np.abs(signs) == 1) or signs.ndim > taken.ndim \
            or signs.shape[signs.ndim - taken.ndim + axis if signs.ndim == taken.ndim else -1] != signs.size \
            or (signs.ndim < taken.ndim and axis != taken.ndim - 1):
        return []  # the signs must lie along the Gather's axis
    have = np.moveaxis(taken, axis, -1) * signs.reshape(-1)
    found, seen = [], set()
    for op in reversed(ctx.ops):
        value = np.asarray(op.value) if op.value is not None else None
        if value is None or value.shape != taken.shape or value.dtype.kind != "f":
            continue
        if len(seen) >= MAX_SIGNED:
            break
        fitted = _fit_signed(data, axis, np.moveaxis(value, axis, -1))
        if fitted is None or np.allclose(np.moveaxis(value, axis, -1), have, rtol=1e-4, atol=1e-6):
            continue
        want, want_signs = fitted
        if (key := (tuple(want), tuple(want_signs))) in seen:
            continue
        seen.add(key)
        edit_gather = with_inputs(proto.name, {1: want.astype(indices.dtype)})
        edit_signs = with_inputs(mul.name, {k: want_signs.reshape(signs.shape).astype(signs.dtype)})
        found.append((proto.name, "signed indices", [f"{'-' if s < 0 else '+'}{int(i)}" for i, s in
                                                     zip(indices % data.shape[axis], signs.reshape(-1))],
                      [f"{'-' if s < 0 else '+'}{int(i)}" for i, s in zip(want, want_signs)],
                      f"PyTorch's {op.module_type}",
                      lambda m, w, g=edit_gather, e=edit_signs: e(*g(m, w))))
    return found


#: distinct signed selections (fitted to PyTorch's ops) tried for one Gather
MAX_SIGNED = 4


def _fit_signed(data: np.ndarray, axis: int, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Each slice of ``wanted`` (its last axis the selection's) as plus or minus one slice of ``data`` along
    ``axis``: (indices, signs), or None when some slice is no such copy."""
    slices = np.moveaxis(data.astype(np.float64), axis, 0).reshape(data.shape[axis], -1)  # (size, rest)
    target = np.moveaxis(wanted.astype(np.float64), -1, 0).reshape(wanted.shape[-1], -1)  # (positions, rest)
    if slices.shape[1] != target.shape[1] or not np.isfinite(slices).all() or not np.isfinite(target).all():
        return None
    best, distance = nearest_rows(target, np.concatenate([slices, -slices]))  # each slice, or its negation
    if np.any(distance > 1e-8 * ((target ** 2).sum(1) + 1e-30)):
        return None
    size = data.shape[axis]
    return best % size, np.where(best < size, 1.0, -1.0)


def _gather_axis(ctx, proto, shape_of, make) -> Iterator:
    """The Gather over another axis of the same length: indices taken along the wrong axis of a square tensor
    (the output's shape is kept only for scalar indices; any other is judged by re-running)."""
    shape = shape_of(proto.input[0]) if proto.input else None
    if not shape or any(not isinstance(d, int) for d in shape):
        return
    have = attribute(proto, "axis", 0) % len(shape)
    for want in range(len(shape)):
        if want != have and shape[want] == shape[have]:
            yield make(proto.name, "axis", have, want, "the PyTorch output", with_attributes(proto.name, {"axis": want}))


def _moved_axes(ctx, proto, shape_of, make) -> Iterator:
    """An Unsqueeze's or Squeeze's axes, each in turn moved to another valid axis (a broadcast over the wrong axis:
    ``[:, :, None]`` written ``[:, None]``); a Squeeze only to axes of length 1."""
    shape = shape_of(proto.input[0]) if proto.input else None
    as_input = len(proto.input) > 1 and bool(proto.input[1])
    axes = ctx.constant(proto.input[1]) if as_input else attribute(proto, "axes")
    if not shape or axes is None:
        return
    have = [int(a) for a in np.asarray(axes).reshape(-1)]
    rank = len(shape) + len(have) if proto.op_type == "Unsqueeze" else len(shape)
    have = sorted(a % rank for a in have)
    wants = [sorted(have[:i] + [b] + have[i + 1:]) for i in range(len(have)) for b in range(rank)
             if b not in have and not (proto.op_type == "Squeeze" and shape[b] != 1)]
    # an Unsqueeze keeps its elements' order whatever its axes: where its own output is PyTorch's divergent value,
    # only the shape tells, so the axes giving PyTorch's shape come first
    if proto.output and proto.output[0] == ctx.tensor:  # PyTorch's own shape (the file's value info may be stale)
        torch_shape = tuple(np.shape(ctx.layer.pair.activation.value))
        wants.sort(key=lambda w: _squeezed_shape(proto.op_type, shape, w) != torch_shape)
    for want in wants:
        edit = (with_inputs(proto.name, {1: np.array(want, dtype=np.int64)}) if as_input
                else with_attributes(proto.name, {"axes": want}))
        yield make(proto.name, "axes", have, want, "the PyTorch output", edit)


def _squeezed_shape(op: str, shape, axes: list[int]) -> tuple:
    """The output shape of an Unsqueeze (or Squeeze) of ``shape`` over ``axes``."""
    if op == "Squeeze":
        return tuple(d for k, d in enumerate(shape) if k not in axes)
    out, rest = [], iter(shape)
    for k in range(len(shape) + len(axes)):
        out.append(1 if k in axes else next(rest))
    return tuple(out)


#: a single constant index is tried at every position of an axis up to this long
MAX_ONE_INDEX = 16


#: ops that hand a value on unchanged but for rounding (a quantizer's pair, a cast)
CARRIERS = CARRIER_OPS


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


def _reference_at(ctx, tensor: str) -> np.ndarray | None:
    """PyTorch's value of the divergent tensor laid out as ``tensor`` holds it, when ``tensor`` reaches it through
    single readers that only round, re-type (see :func:`_carried_to`) or transpose it (an unfold's Gather before
    the Transpose that orders the patches); None otherwise."""
    graph = ctx.onnx.graph
    perms = []
    for _ in range(6):
        tensor = _carried_to(ctx, tensor)
        if tensor == ctx.tensor:
            break
        readers = graph.consumers.get(tensor, ())
        if len(readers) != 1 or graph.nodes[readers[0]].op_type != "Transpose":
            return None
        node = graph.nodes[readers[0]]
        perms.append(dict(node.attributes).get("perm"))
        tensor = node.outputs[0]
    else:
        return None
    value = ctx.reference
    for perm in reversed(perms):
        if perm is None or len(perm) != value.ndim:
            return None
        value = np.transpose(value, np.argsort(perm))
    return value


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
                           "the PyTorch output", with_inputs(proto.name, {1: new_starts, 2: new_ends}))


# --------------------------------------------------------------------------- Reduce

def _reduce(ctx, proto, shape_of, make) -> Iterator:
    """The axes of PyTorch's reduction, then each reduced axis in turn replaced by another axis: one of the same
    size first (the output's shape kept), then any other of size > 1 (a reduction whose result broadcasts over
    another axis downstream)."""
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
    # first the dims PyTorch's reduction ran over (as many as the file's: a singleton axis PyTorch summed over,
    # a no-op the file made a real reduction; one fewer is the batch-mixing rule's)
    torch_dims = _torch_dims(ctx, rank)
    wants = [(torch_dims if torch_dims is not None and len(torch_dims) == len(have) else None,
              "the dims of PyTorch's reduction")]
    wants += [(sorted(have[:i] + [b] + have[i + 1:]), "the PyTorch output") for i, _, b in pairs]
    for want, source in wants:
        if want is None or want == have:
            continue
        edit = (with_inputs(proto.name, {1: np.array(want, dtype=np.int64)}) if as_input
                else with_attributes(proto.name, {"axes": want}))
        yield make(proto.name, "axes", have, want, source, edit)


#: PyTorch's reductions, whose ``dim`` argument says the axes
TORCH_REDUCTIONS = ("aten.sum", "aten.mean", "aten.amax", "aten.amin", "aten.prod", "aten.var", "aten.std",
                    "aten.logsumexp", "aten.norm", "aten.linalg_vector_norm")


def _torch_dims(ctx, rank: int) -> list[int] | None:
    """The dims of the reduction PyTorch ran nearest the divergence (its ``dim`` list, normalised to ``rank``)."""
    at = ctx.layer.pair.activation.index
    for op in sorted((o for o in ctx.ops if o.module_type.startswith(TORCH_REDUCTIONS)), key=lambda o: abs(o.index - at)):
        for _, arg in op.args:
            dims = [arg] if isinstance(arg, int) and not isinstance(arg, bool) else arg
            if isinstance(dims, (list, tuple)) and dims and all(isinstance(d, int) and -rank <= d < rank for d in dims):
                return sorted(d % rank for d in dims)
    return None


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
        yield make(proto.name, "pads", list(pads), want, "the PyTorch output",
                   with_attributes(proto.name, {"pads": want}))


def _pad_input(ctx, proto, make) -> Iterator:
    """A Pad's constant pads (its second input) with padding moved between the sides of an axis."""
    if len(proto.input) < 2 or not proto.input[1]:
        return
    pads = ctx.constant(proto.input[1])
    if pads is None or pads.dtype.kind not in "iu" or pads.ndim != 1 or not pads.any() or pads.size % 2:
        return
    for want in _moved([int(v) for v in pads]):
        yield make(proto.name, "pads", pads.tolist(), want, "the PyTorch output",
                   with_inputs(proto.name, {1: np.array(want, dtype=pads.dtype)}))


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
        yield make(proto.name, "input order", [i, j], [j, i], "the PyTorch output", rewired(proto.name, want))


#: ops that select a window or entries of a tensor: where a Concat's inputs come in another order, the selections
#: feeding them may as well have read each other's (the order is right, the windows exchanged)
SELECTIONS = frozenset({"Slice", "Gather", "Split"})


def _with_selections(ctx, proto, alt):
    """A Concat's input-order alternative shown in the selections computing the inputs it moves: the values say
    the pieces are in another order, not whether the Concat or the Slices that cut them are wrong."""
    if alt is None:
        return alt
    graph = ctx.onnx.graph
    moved = [proto.input[k] for k, (a, b) in enumerate(zip(alt.have, alt.want)) if a != b] \
        if isinstance(alt.have, list) and isinstance(alt.want, list) and len(alt.have) == len(proto.input) \
        else [proto.input[k] for k in alt.have if isinstance(k, int) and k < len(proto.input)]
    nodes = [graph.node_of(t) for t in moved]
    shown = tuple(dict.fromkeys(n.name for n in nodes if n is not None and n.op_type in SELECTIONS))
    return dataclasses.replace(alt, shows_in=(*alt.shows_in, *shown)) if shown else alt


def _fitted_order(ctx, proto, make) -> Iterator:
    """Where the Concat computes the divergent tensor: its inputs in the order in which they equal PyTorch's
    output piece by piece (a stack of 16 time steps with two exchanged: no pair among the first few is)."""
    if len(proto.input) < 3 or _carried_to(ctx, proto.output[0]) != ctx.tensor:
        return
    values = [node_value(ctx, t) for t in proto.input]
    if any(v is None or v.ndim == 0 for v in values) or len({v.ndim for v in values}) != 1:
        return
    axis = attribute(proto, "axis", 0) % values[0].ndim
    reference = ctx.reference
    if reference.shape != np.concatenate(values, axis=axis).shape:
        return
    pieces = np.split(reference, np.cumsum([v.shape[axis] for v in values])[:-1], axis=axis)
    order: list[int] = []
    for k, piece in enumerate(pieces):
        fits = [j for j, v in enumerate(values) if j not in order and v.shape == piece.shape
                and ctx.compare(v.astype(piece.dtype, copy=False), piece).ok]
        if not fits:
            return
        order.append(k if k in fits else fits[0])
    if order != list(range(len(values))):
        want = [proto.input[j] for j in order]
        yield make(proto.name, "input order", list(range(len(order))), order, "the PyTorch output",
                   rewired(proto.name, want))


def _constant_shape(ctx, tensor: str) -> tuple[int, ...] | None:
    """An initializer's or a Constant's shape (shape inference may leave them out)."""
    value = ctx.constant(tensor)
    return None if value is None else tuple(value.shape)


def _split_sizes(ctx, proto, shape_of, make) -> Iterator:
    """Two outputs of one shape exchanged (chunks taken in another order: q and k), a Split's constant sizes made
    equal (where the axis divides), or one or two elements moved between two neighbouring outputs."""
    shapes = [shape_of(t) if t else None for t in proto.output]
    pairs = [(i, j) for i in range(len(shapes)) for j in range(i + 1, len(shapes))
             if shapes[i] and shapes[i] == shapes[j]]
    for i, j in pairs[:MAX_SWAPPED_INPUTS]:
        if not any(reads_right(ctx, proto.output[k]) for k in (i, j)):  # one reader rewired leaves others right
            yield make(proto.name, "output order", [i, j], [j, i], "the PyTorch output",
                       outputs_swapped(proto.name, i, j))
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
        edit = (with_inputs(proto.name, {1: np.array(want, dtype=np.int64)}) if as_input
                else with_attributes(proto.name, {"split": want}))
        yield make(proto.name, "split", have, want, "the PyTorch output", edit)


def boundary_swaps(ctx, make_fed) -> Iterator:
    """Two tensors the segment reads that one node outside it produces in one shape (a Split's chunks) fed the
    other way round: the node's outputs exchanged (q and k taken in another order — by value each chunk pairs
    with its own module, so only the segment reading them shows it); then two sibling Slices' outputs alike
    (:func:`_sibling_slices`).  ``make_fed(node, what, have, want, source, edit, feeds)`` builds the
    alternative."""
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
            yield make_fed(name, "output order", [i, j], [j, i], "the PyTorch output", outputs_swapped(name, i, j),
                           {a: feeds[b], b: feeds[a]})
    yield from _sibling_slices(ctx, feeds, make_fed)


def _sibling_slices(ctx, feeds, make_fed) -> Iterator:
    """Two Slices of one tensor whose outputs (of one shape) the segment reads, fed the other way round: each
    takes the other's window (a fused projection's chunks, or rotate_half's halves, in another order) — one of
    them may compute inside the segment, the other's output fed at its cut (the Slice holding a right value in
    the wrong place pairs with PyTorch's).  Named at the earlier Slice, shown in both, and in a Concat reading
    both (whose order is the other reading)."""
    graph = ctx.onnx.graph
    inside = [t for n in ctx.segment_nodes if n.op_type == "Slice" for t in n.outputs[:1]]
    values = {**ctx.computed(inside), **feeds}
    by_data: dict[str, list[str]] = {}
    for t, value in values.items():
        node = graph.node_of(t)
        if node is not None and node.op_type == "Slice" and len(node.inputs) >= 3 \
                and np.issubdtype(np.asarray(value).dtype, np.floating):  # (starts and ends as inputs: opset ≥ 10)
            by_data.setdefault(node.inputs[0], []).append(t)
    for data, tensors in by_data.items():
        tensors = sorted(tensors, key=graph.order_of)
        pairs = [(a, b) for i, a in enumerate(tensors) for b in tensors[i + 1:] if (a in feeds or b in feeds)
                 and np.shape(values[a]) == np.shape(values[b]) and not np.array_equal(values[a], values[b])]
        for a, b in pairs[:MAX_SWAPPED_INPUTS]:
            first, second = graph.node_of(a).name, graph.node_of(b).name
            # a fed window takes the other's value; a Slice inside the segment computes the other's window itself
            fed = {t: values[o] for t, o in ((a, b), (b, a)) if t in feeds}
            alt = make_fed(first, "window", second, data, "the PyTorch output", slices_swapped(first, second), fed)
            # a Concat reading both may as well have taken them in the wrong order: the values cannot say which
            joins = [graph.nodes[k].name for k in set(graph.consumers.get(a, ())) & set(graph.consumers.get(b, ()))
                     if graph.nodes[k].op_type == "Concat"]
            yield dataclasses.replace(alt, shows_in=(second, *joins))
