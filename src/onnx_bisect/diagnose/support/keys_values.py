"""Attention run with its keys and values exchanged (a port calling ``attn(q, v, k)``, a packed qkv split as q, v, k,
``k_proj`` / ``v_proj`` mapped the wrong way): the scores are computed from the values and the context from the
keys.  Read at an attention's scores product (a MatMul or Einsum of two computed tensors whose output reaches a Softmax over
its last axis) and the product reading the probabilities: the key operand's and the value operand's paths walked
up through layout ops and scalar scales, and the deepest two tensors of one shape on them exchanged — kept only when
the segment then reproduces PyTorch."""
from __future__ import annotations

import dataclasses
from typing import Iterator

from . import edits
from .edited_inputs import edited_inputs

#: ops a key's or value's path runs through (one tensor in, the same numbers laid out or scaled out)
PATH_OPS = frozenset({"Reshape", "Transpose", "Unsqueeze", "Squeeze", "Expand", "Identity", "Cast", "Flatten",
                      "Mul", "Div", "Tile"})
#: ops computing the scores and the context (two operands each)
PRODUCTS = frozenset({"MatMul", "Einsum"})
#: ops between the scores and their Softmax, and between the Softmax and the product reading it
SCORE_OPS = frozenset({"Add", "Mul", "Div", "Where", "Cast", "Identity", "Reshape", "Sub"})
PROB_OPS = frozenset({"Cast", "Identity", "Where", "Reshape", "Dropout"})
#: steps walked up a path, nodes walked down from a segment node to the scores product, pairs tried
MAX_PATH, DOWNSTREAM, MAX_PAIRS = 8, 12, 3


def exchanged_keys_values(ctx, protos, make) -> Iterator:
    """For each attention whose scores product is in the segment or a few nodes past it, the keys and values
    exchanged (see the module's docstring)."""
    graph = ctx.onnx.graph
    candidates = [graph.node_of(p.output[0]) for p in protos if p.op_type in PRODUCTS and p.output]
    candidates += [n for p in protos for o in p.output[:1] if o for n in graph.downstream(o, DOWNSTREAM)
                   if n.op_type in PRODUCTS]
    tried = set()
    for scores in dict.fromkeys(c for c in candidates if c is not None):
        context = _context_product(graph, scores)
        if context is None or scores.name in tried:
            continue
        tried.add(scores.name)
        keys, values = _path(ctx, scores.inputs[1], scores.name), _path(ctx, context.inputs[1], context.name)
        pairs = [(i + j, k, v) for i, k in enumerate(keys) for j, v in enumerate(values)
                 if k[0] != v[0] and _same_shape(ctx, k[0], v[0])]
        for _, (key, key_reader), (value, value_reader) in sorted(pairs, key=lambda p: -p[0])[:MAX_PAIRS]:
            edit = _exchanged(key, key_reader, value, value_reader)
            readers = {key_reader, value_reader}
            feeds = edited_inputs(ctx, edit, _between(keys, key_reader) | _between(values, value_reader) | {
                scores.name, context.name})
            if feeds is None:
                continue
            alt = make(key_reader, "keys and values", f"the scores of {scores.name} computed from '{key}' and the "
                       f"context of {context.name} from '{value}'", f"'{key}' and '{value}' exchanged (the keys "
                       "read as the values and the values as the keys)", "the PyTorch output", edit)
            yield dataclasses.replace(alt, shows_in=tuple(sorted(readers)), feeds=feeds or None)


def _context_product(graph, scores):
    """The MatMul reading the probabilities of the Softmax the ``scores`` MatMul reaches (over the last axis);
    None where there is none or the scores' operands are not both computed."""
    if len(scores.inputs) != 2 or any(graph.is_constant(t) for t in scores.inputs):
        return None
    softmax = _down(graph, scores.outputs[0], SCORE_OPS, frozenset({"Softmax"}))
    if softmax is None or softmax.attribute("axis", -1) not in (-1, len(graph.shapes.get(softmax.outputs[0]) or ()) - 1):
        return None
    context = _down(graph, softmax.outputs[0], PROB_OPS, PRODUCTS)
    return context if context is not None and context.inputs[0] != context.inputs[1] else None


def _down(graph, tensor: str, through: frozenset, op_types: frozenset, limit: int = 6):
    """The first node of ``op_types`` reading ``tensor`` as its first input (through ``through`` ops)."""
    frontier = [tensor]
    for _ in range(limit):
        nxt = []
        for t in frontier:
            for c in graph.consumers.get(t, ()):
                node = graph.nodes[c]
                if node.op_type in op_types and node.inputs and node.inputs[0] == t:
                    return node
                if node.op_type in through:
                    nxt.extend(node.outputs[:1])
        frontier = nxt
    return None


def _path(ctx, tensor: str, reader: str) -> list[tuple[str, str]]:
    """``(tensor, the node reading it on the path)`` from an attention product's operand up through layout ops and
    scalar scales, nearest first."""
    graph = ctx.onnx.graph
    path = [(tensor, reader)]
    for _ in range(MAX_PATH):
        node = graph.node_of(tensor)
        if node is None or node.op_type not in PATH_OPS or not node.inputs:
            break
        if node.op_type in ("Mul", "Div"):
            data = [t for t in node.inputs if t and not ctx.is_scalar(t)]
            if len(data) != 1 or node.op_type == "Div" and data[0] != node.inputs[0]:
                break
            tensor = data[0]
        else:
            tensor = node.inputs[0]
        if graph.is_constant(tensor):
            break
        path.append((tensor, node.name))
    return path


def _same_shape(ctx, a: str, b: str) -> bool:
    shape, other = ctx.value_shapes(a, b)
    return shape is not None and shape == other \
        and ctx.onnx.graph.elem_types.get(a) == ctx.onnx.graph.elem_types.get(b)


def _between(path: list[tuple[str, str]], reader: str) -> set[str]:
    """The nodes of a path from its product down to ``reader`` (those whose values the exchange changes)."""
    names = []
    for _, node in path:
        names.append(node)
        if node == reader:
            break
    return set(names)


def _exchanged(key: str, key_reader: str, value: str, value_reader: str):
    def edit(model, weights):
        for n in model.graph.node:
            if n.name == key_reader:
                n.input[:] = [value if t == key else t for t in n.input]
            elif n.name == value_reader:
                n.input[:] = [key if t == value else t for t in n.input]
        edits.set_nodes(model, model.graph.node)
        return model, weights
    return edit

