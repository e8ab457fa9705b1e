"""A gated unit's two branches exchanged (a port mapping LLaMA's ``gate_proj`` / ``up_proj`` — w1 / w3 — the wrong
way, GLU halves taken in the other order, gMLP's spatial gating applied to the other half): the unit computes
``F(b)·a`` where the model computes ``F(a)·b``.  Read at a Mul of two computed tensors: one operand computed from a
tensor ``a`` alone (and constants: an activation, written out or not, a norm and a token mixing), the other a
sibling ``b`` of ``a`` (one Split's outputs, two slices of one tensor, two layers reading one input) of the same
shape.  The gate moved to the other branch is kept only when the segment then reproduces PyTorch."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from . import edits
from .edited_inputs import edited_inputs

#: nodes the gate's own computation F may hold, at most
MAX_GATE = 24
#: nodes walked down from a segment node to the gate's Mul
DOWNSTREAM = 8
#: ops whose output is the same tensor in other layout, walked through to a sibling's source
LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast"})


def swapped_gates(ctx, protos, make) -> Iterator:
    """For each Mul of the segment (or reading a segment node's output), the gate applied to the other branch."""
    graph = ctx.onnx.graph
    inside = {p.name for p in protos}
    muls = [graph.node_of(p.output[0]) for p in protos if p.op_type == "Mul" and p.output]
    # a segment narrowed to the gate's own nodes (a norm of gMLP's spatial gating): the Mul a few nodes on
    muls += [n for p in protos for o in p.output[:1] if o for n in graph.downstream(o, DOWNSTREAM)
             if n.op_type == "Mul" and n.name not in inside]
    tried = set()
    for mul in dict.fromkeys(m for m in muls if m is not None):
        if len(mul.inputs) != 2 or any(graph.is_constant(t) for t in mul.inputs) or mul.inputs[0] == mul.inputs[1]:
            continue
        for k in (0, 1):
            gated, other = mul.inputs[k], mul.inputs[1 - k]
            found = _gate(ctx, gated, other)
            if found is None or (mul.name, gated) in tried:
                continue
            tried.add((mul.name, gated))
            source, nodes = found
            edit = _moved(mul.name, source, other, nodes)
            feeds = edited_inputs(ctx, edit, nodes | {mul.name})
            if feeds is None:
                continue
            entries = tuple(n.name for n in graph.nodes if n.name in nodes and source in n.inputs)
            alt = make(mul.name, "gated branch", f"the gate computed from '{source}' ({len(nodes)} nodes) times "
                       f"'{other}'", f"the gate computed from '{other}' times '{source}' (the branches exchanged)",
                       "the PyTorch output", edit)
            yield dataclasses.replace(alt, shows_in=entries, feeds=feeds or None)


def _gate(ctx, gated: str, other: str):
    """``(a, the nodes computing gated from a)`` when ``gated`` is computed from one tensor ``a`` alone (and
    constants) that is a sibling of ``other`` of its shape and type; else None."""
    graph = ctx.onnx.graph
    nodes, sources, frontier = set(), set(), [gated]
    while frontier:
        t = frontier.pop()
        node = graph.node_of(t)
        if node is None or len(nodes) >= MAX_GATE:
            return None
        if node.name in nodes:
            continue
        nodes.add(node.name)
        for i in node.inputs:
            if not i or graph.is_constant(i):
                continue
            if _siblings(graph, i, other):
                sources.add(i)
            else:
                frontier.append(i)
    if len(sources) != 1:
        return None
    source = next(iter(sources))
    # F reads nothing computed but the source (and what it computes itself)
    made = {o for n in graph.nodes if n.name in nodes for o in n.outputs}
    if any(i and not graph.is_constant(i) and i != source and i not in made
           for n in graph.nodes if n.name in nodes for i in n.inputs):
        return None
    if graph.elem_types.get(source) != graph.elem_types.get(other):
        return None
    shape, other_shape = ctx.value_shapes(source, other)
    return (source, nodes) if shape is not None and shape == other_shape else None


def _siblings(graph, a: str, b: str) -> bool:
    """Whether tensors ``a`` and ``b`` come from one tensor (one Split's outputs, slices of one tensor, two layers
    reading one input), through layout ops."""
    if a == b:
        return False
    pa, pb = _origin(graph, a), _origin(graph, b)
    if pa is None or pb is None:
        return False
    if pa.name == pb.name:
        return pa.op_type == "Split"
    shared = {t for t in pa.inputs if t and not graph.is_constant(t)} & \
        {t for t in pb.inputs if t and not graph.is_constant(t)}
    return bool(shared) and pa.op_type == pb.op_type


def _origin(graph, tensor: str):
    """The node computing ``tensor``, past bias Adds and layout ops (a layer's product, a Slice, a Split)."""
    node = graph.node_of(tensor)
    for _ in range(4):
        if node is None:
            return None
        ahead = [t for t in node.inputs if t and not graph.is_constant(t)]
        if node.op_type in LAYOUT and ahead or node.op_type == "Add" and len(ahead) == 1:
            node = graph.node_of(ahead[0])
            continue
        return node
    return node


def _moved(mul: str, source: str, other: str, nodes: set[str]):
    """The gate's nodes reading ``other`` instead of ``source``, the Mul reading ``source`` instead of ``other``."""
    def edit(model, weights):
        for n in model.graph.node:
            if n.name in nodes:
                n.input[:] = [other if t == source else t for t in n.input]
            elif n.name == mul:
                n.input[:] = [source if t == other else t for t in n.input]
        edits.set_nodes(model, model.graph.node)  # the gate may now read a tensor made after it
        return model, weights
    return edit

