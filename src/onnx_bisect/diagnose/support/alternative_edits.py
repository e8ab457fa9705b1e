"""Edits the alternatives of :mod:`.op_alternatives` and :mod:`.value_alternatives` are made of (each applied
to a copy of the model by the attribute rule's search), and the segment value they are fitted to."""
from __future__ import annotations

import numpy as np
from onnx import helper

from . import edits


def node_value(ctx, tensor: str) -> np.ndarray | None:
    """``tensor``'s value in the segment computed from exact inputs (a constant as it is)."""
    constant = ctx.constant(tensor)
    if constant is not None:
        return constant
    try:
        return ctx.run_segment(outputs=[tensor]).get(tensor)
    except Exception:  # noqa: BLE001 - a tensor the segment cannot give is simply not fitted
        return None


def with_inputs(node: str, values: dict[int, np.ndarray]):
    """The node reading new constants at input positions ``values`` (private copies: a constant the exporter
    shares — a Slice's starts with its steps — keeps its value for every other reader)."""
    def edit(model, weights):
        target = edits.node(model, node)
        for index, value in values.items():
            target.input[index] = edits.add_initializer(model, f"{node}_input{index}_alternative", value)
        return model, weights
    return edit


def with_attributes(node: str, values: dict):
    """The node with these attributes set (the others kept)."""
    def edit(model, weights):
        for name, value in values.items():
            model = edits.set_attribute(model, node, name, value)
        return model, weights
    return edit


def retyped(node: str, op_type: str, attributes: dict, drop: tuple[str, ...] | None = None,
            inputs: int | None = None):
    """The node computing ``op_type`` on the same inputs (the first ``inputs`` of them, when given): the
    attributes ``drop`` removed (None: all of them), then ``attributes`` set (floats stay floats, ints ints)."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.op_type = op_type
        if inputs is not None:  # a node made into a one-input op keeps its first output alone
            del target.input[inputs:]
            del target.output[1:]
        kept = [] if drop is None else [a for a in target.attribute if a.name not in drop]
        del target.attribute[:]
        target.attribute.extend(kept)
        target.attribute.extend(helper.make_attribute(k, v) for k, v in attributes.items())
        return model, weights
    return edit


def outputs_swapped(node: str, i: int, j: int):
    """The node's outputs ``i`` and ``j`` exchanged (its readers then read the other one)."""
    def edit(model, weights):
        target = edits.node(model, node)
        target.output[i], target.output[j] = target.output[j], target.output[i]
        return model, weights
    return edit


def slices_swapped(first: str, second: str):
    """Slices ``first`` and ``second`` (of one tensor) taking each other's window: their starts, ends, axes and
    steps exchanged."""
    def edit(model, weights):
        a, b = edits.node(model, first), edits.node(model, second)
        rest_a, rest_b = list(a.input[1:]), list(b.input[1:])
        del a.input[1:], b.input[1:]
        a.input.extend(rest_b)
        b.input.extend(rest_a)
        return model, weights
    return edit


def rewired(node: str, inputs: list[str]):
    """The node reading ``inputs`` (the same tensors in another order)."""
    def edit(model, weights):
        target = edits.node(model, node)
        del target.input[:]
        target.input.extend(inputs)
        return model, weights
    return edit


def composed(*edits):
    """The edits applied one after the other."""
    def edit(model, weights):
        for one in edits:
            model, weights = one(model, weights)
        return model, weights
    return edit


def identity_of(node: str, tensor: str):
    """The node made an Identity of ``tensor`` (the op it computes left out)."""
    def edit(model, weights):
        edits.make_identity(model, node, tensor)
        return model, weights
    return edit


def repeated_block(kernel: np.ndarray | None, groups: int) -> np.ndarray | None:
    """The block a dense convolution kernel ``(Cout, Cin, k…)`` repeats ``groups`` times along its input channels
    (a grouped or depthwise kernel broadcast over every input channel, as a port running it dense does), shaped
    as that grouped convolution's kernel ``(Cout, Cin / groups, k…)``; None when it does not."""
    if kernel is None or kernel.ndim < 3 or groups < 2 or kernel.shape[1] % groups or kernel.shape[0] % groups:
        return None
    blocks = np.asarray(kernel).reshape(kernel.shape[0], groups, kernel.shape[1] // groups, *kernel.shape[2:])
    if not np.array_equal(blocks, np.broadcast_to(blocks[:, :1], blocks.shape)):
        return None
    return np.ascontiguousarray(blocks[:, 0])


def grouped(node: str, groups: int, kernel: np.ndarray):
    """The Conv with ``group`` set and reading ``kernel`` (of the grouped shape) in place of its own."""
    def edit(model, weights):
        model = edits.set_attribute(model, node, "group", groups)
        return with_inputs(node, {1: kernel})(model, weights)
    return edit


def grouped_readings(groups: int, block: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(what it says, kernel)`` of a dense Conv read as grouped (:func:`repeated_block`'s ``block``): the block
    as it is, then times the group count (a converter dividing the tiled kernel by it)."""
    return [(f"{groups} (the kernel's repeated block{'' if scale == 1 else f' times {scale}'}, {list(block.shape)})",
             block * block.dtype.type(scale)) for scale in (1, groups)]
