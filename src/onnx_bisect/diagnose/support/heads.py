"""Attention run with another head count: the Reshapes that split the channels into heads (and merge batch and
heads for a batched MatMul) written for H′ heads of d′ where PyTorch's scores have H heads of d.  The split holds
PyTorch's numbers in another shape, so the first wrong value is the scores' product and the segment spans the whole
attention; PyTorch's softmax tells H, the file's Softmax H′, and the Reshapes are rewritten together."""
from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np
from . import edits


def head_counts(ctx, protos, make) -> Iterator:
    """One alternative per ONNX Softmax of rank 4 whose head axis differs from a PyTorch softmax of the same
    batch and lengths: every Reshape of the segment rewritten from (H′, d′) to (H, d)."""
    reshapes = [p for p in protos if p.op_type == "Reshape" and len(p.input) > 1 and ctx.constant(p.input[1]) is not None]
    if not reshapes:
        return
    theirs = {tuple(np.shape(a.value)) for a in ctx.ops if "softmax" in a.module_type and np.ndim(a.value) == 4}
    for soft in (p for p in protos if p.op_type == "Softmax"):
        mine = ctx.shape_of(soft.output[0])
        if mine is None or len(mine) != 4:
            continue
        batch, have = mine[0], mine[1]
        for want in sorted({s[1] for s in theirs if s[0] == batch and s[2:] == mine[2:] and s[1] != have}):
            split = _head_size(ctx, reshapes, have, want)
            if split is None:
                continue
            changed = {p.name: new for p in reshapes if (new := _rescaled(ctx.shape_of(p.output[0]), batch, have,
                                                                           want, *split)) is not None}
            if not changed:
                continue
            first = next(p.name for p in reshapes if p.name in changed)
            alt = make(first, "heads", f"{have} heads of {split[0]}", f"{want} heads of {split[1]}",
                       f"PyTorch's softmax over {want} heads", _rewritten(changed))
            yield dataclasses.replace(alt, shows_in=tuple(changed)) if alt is not None else alt


def _head_size(ctx, reshapes, have: int, want: int) -> tuple[int, int] | None:
    """``(d′, d)``: the size each of the file's ``have`` heads has (the axis after the heads in a split
    Reshape's output) and the size ``want`` heads of the same channels have."""
    for p in reshapes:
        shape = ctx.shape_of(p.output[0]) or ()
        for i in range(len(shape) - 1):
            if shape[i] == have and (have * shape[i + 1]) % want == 0:
                return shape[i + 1], have * shape[i + 1] // want
    return None


def _rescaled(shape, batch: int, have: int, want: int, size: int, new_size: int) -> list[int] | None:
    """``shape`` with the heads axis and the head size rewritten (adjacent, or batch × heads merged apart from
    the head size), None when it holds neither; the element count is kept."""
    if not shape:
        return None
    out = list(shape)
    pair = next((i for i in range(len(out) - 1) if out[i] == have and out[i + 1] == size), None)
    if pair is not None:
        out[pair], out[pair + 1] = want, new_size
    else:
        merged = [i for i, v in enumerate(out) if v == batch * have]
        sized = [i for i, v in enumerate(out) if v == size and i not in merged]
        if len(merged) != 1 or len(sized) != 1:
            return None
        out[merged[0]], out[sized[0]] = batch * want, new_size
    return out if int(np.prod(out)) == int(np.prod(shape)) else None


def _rewritten(changed: dict[str, list[int]]):
    def edit(model, weights):
        for name, shape in changed.items():
            node = edits.node(model, name)
            node.input[1] = edits.add_initializer(model, f"{name}_heads_shape", np.array(shape, np.int64))
        return model, weights
    return edit
