"""Cut one segment out of a graph: the nodes computing some tensors from the cut tensors upstream.

A pure rewrite (the caller's model is never modified).  Re-running a segment on
its own costs a session of a few nodes, whatever the size of the model, so a
rule can try several counterfactuals for the price of one full run.
"""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import onnx
from onnx import helper

from ...records.graph import outer_inputs


def extract(model: onnx.ModelProto, outputs: list[str], stops: set[str]) -> tuple[onnx.ModelProto, list[str], set[str]]:
    """``(submodel, boundary inputs, initializers used)`` computing ``outputs``.

    The walk goes upstream from ``outputs`` and stops at graph inputs,
    initializers and the ``stops`` tensors (the cut points); the first output
    is computed even when it is itself a cut point.  The submodel's inputs are
    the boundary tensors, untyped until :func:`with_inputs` types them.
    """
    g = model.graph
    producer = {o: n for n in g.node for o in n.output if o}
    inits = {i.name: i for i in g.initializer}
    selected: set[int] = set()
    boundary: list[str] = []
    used: set[str] = set()
    seen: set[str] = set()
    stack = list(reversed(outputs))
    first = outputs[0] if outputs else None
    while stack:
        t = stack.pop()
        if not t or t in seen:
            continue
        seen.add(t)
        if t in inits:
            used.add(t)
            continue
        node = producer.get(t)
        if node is None or (t in stops and t != first):
            boundary.append(t)
            continue
        if id(node) in selected:
            continue
        selected.add(id(node))
        stack.extend(reversed(list(node.input) + list(outer_inputs(node))))
    nodes = [n for n in g.node if id(n) in selected]
    sub = onnx.ModelProto(ir_version=model.ir_version, producer_name="onnx-bisect-segment")
    sub.opset_import.extend(model.opset_import)
    sub.functions.extend(model.functions)
    sub.graph.name = "segment"
    sub.graph.node.extend(nodes)
    fed = set(boundary)
    for node in sub.graph.node:  # a node of several outputs computing one that is fed (a Split's output cut)
        for i, out in enumerate(node.output):  # would define it twice: that output goes unused here
            if out in fed:
                node.output[i] = f"{out}::fed"
    sub.graph.initializer.extend(inits[n] for n in sorted(used))
    sub.graph.output.extend(helper.make_empty_tensor_value_info(o) for o in outputs if o not in boundary)
    return sub, boundary, used


def with_inputs(sub: onnx.ModelProto, values: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """``sub`` with one typed graph input per boundary value (modifies and returns ``sub``)."""
    del sub.graph.input[:]
    for name, value in values.items():
        sub.graph.input.append(helper.make_tensor_value_info(
            name, helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)))
    return sub


def downstream(model: onnx.ModelProto, sources: Iterable[str], within: set[str]) -> set[str]:
    """Names of the nodes in ``within`` reachable from tensors ``sources``."""
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        if n.name in within:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
    reached: set[str] = set()
    stack = list(sources)
    while stack:
        t = stack.pop()
        for n in consumers.get(t, ()):
            if n.name not in reached:
                reached.add(n.name)
                stack.extend(n.output)
    return reached
