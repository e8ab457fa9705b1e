"""Attention run with another head count: the Reshapes that split the channels into heads (and merge batch and
heads for a batched MatMul) written for H′ heads of d′ where PyTorch's scores have H heads of d.  The split holds
PyTorch's numbers in another shape, so the first wrong value is the scores' product and the segment spans the whole
attention; PyTorch's softmax tells H, the file's Softmax H′, and the Reshapes are rewritten together."""
from __future__ import annotations

import dataclasses
import itertools
from typing import Iterator

import numpy as np
from . import edits


def head_counts(ctx, protos, make) -> Iterator:
    """One alternative per ONNX Softmax of rank 4 whose head axis differs from a PyTorch softmax of the same
    batch and lengths: every Reshape of the segment rewritten from (H′, d′) to (H, d).  Where a Reshape's shape
    reads more than one way (a sequence as long as the file's head count), each reading is tried, the adjacent
    (H′, d′) pair first."""
    reshapes = [p for p in protos if p.op_type == "Reshape" and len(p.input) > 1 and ctx.constant(p.input[1]) is not None]
    if not reshapes:
        return
    theirs = {tuple(np.shape(a.value)) for a in ctx.ops if "softmax" in a.module_type and np.ndim(a.value) == 4}
    theirs |= _fused_scores(ctx)
    for soft in (p for p in protos if p.op_type == "Softmax"):
        mine = ctx.shape_of(soft.output[0])
        if mine is None or len(mine) != 4:
            continue
        batch, have = mine[0], mine[1]
        wanted = sorted({s[1] for s in theirs if s[0] == batch and s[2:] == mine[2:] and s[1] != have})
        for want, split in ((w, split) for w in wanted for split in _head_sizes(ctx, reshapes, have, w)):
            readings = {p.name: _rescaled(ctx.shape_of(p.output[0]), batch, have, want, *split) for p in reshapes}
            readings = {name: shapes for name, shapes in readings.items() if shapes}
            if not readings:
                continue
            first, several = next(p.name for p in reshapes if p.name in readings), any(
                len(shapes) > 1 for shapes in readings.values())
            for changed in itertools.islice((dict(zip(readings, combo)) for combo in itertools.product(
                    *readings.values())), MAX_READINGS):
                said = f"{want} heads of {split[1]}" + (f" (the Reshapes to {', '.join(map(str, changed.values()))})"
                                                         if several else "")
                alt = make(first, "heads", f"{have} heads of {split[0]}", said,
                           f"PyTorch's softmax over {want} heads", _rewritten(changed))
                yield dataclasses.replace(alt, shows_in=tuple(changed)) if alt is not None else alt


#: readings of the Reshapes together (one per Reshape) tried per head count, at most
MAX_READINGS = 8


def _fused_scores(ctx) -> set[tuple[int, ...]]:
    """The shapes ``(batch, heads, queries, keys)`` of the scores PyTorch's fused attention ops around the
    divergence computed without recording a softmax of their own (``F.scaled_dot_product_attention``), from
    their query and key operands."""
    by_index = {a.index: a for a in (*ctx.baseline.capture.activations, *ctx.ops)}
    found = set()
    for op in ctx.ops:
        if "scaled_dot_product" not in op.module_type or len(op.inputs) < 2:
            continue
        query, key = (by_index.get(i) for i in op.inputs[:2])
        if query is None or key is None or np.ndim(query.value) != 4 or np.ndim(key.value) != 4:
            continue
        (b, h, t, _), s = np.shape(query.value), np.shape(key.value)[2]
        found.add((b, h, t, s))
    return found


def _head_sizes(ctx, reshapes, have: int, want: int) -> list[tuple[int, int]]:
    """``(d′, d)`` pairs: the size each of the file's ``have`` heads may have (the axis after one of ``have``
    entries in a split Reshape's output) and the size ``want`` heads of the same channels have — every such pair,
    in the order found."""
    found: list[tuple[int, int]] = []
    for p in reshapes:
        shape = ctx.shape_of(p.output[0]) or ()
        for i in range(len(shape) - 1):
            pair = (shape[i + 1], have * shape[i + 1] // want)
            if shape[i] == have and (have * shape[i + 1]) % want == 0 and pair not in found:
                found.append(pair)
    return found


def _rescaled(shape, batch: int, have: int, want: int, size: int, new_size: int) -> list[list[int]]:
    """The readings of ``shape`` with the heads axis and the head size rewritten — adjacent (H′, d′), then batch ×
    heads merged apart from the head size — each keeping the element count; [] when it holds neither."""
    if not shape:
        return []
    found = []
    for i in range(len(shape) - 1):
        if shape[i] == have and shape[i + 1] == size:
            out = list(shape)
            out[i], out[i + 1] = want, new_size
            found.append(out)
    for i in (i for i, v in enumerate(shape) if v == batch * have):
        for j in (j for j, v in enumerate(shape) if v == size and j != i):
            out = list(shape)
            out[i], out[j] = batch * want, new_size
            found.append(out)
    return [out for k, out in enumerate(found) if int(np.prod(out)) == int(np.prod(shape)) and out not in found[:k]]


def _rewritten(changed: dict[str, list[int]]):
    def edit(model, weights):
        for name, shape in changed.items():
            node = edits.node(model, name)
            node.input[1] = edits.add_initializer(model, f"{name}_heads_shape", np.array(shape, np.int64))
        return model, weights
    return edit
