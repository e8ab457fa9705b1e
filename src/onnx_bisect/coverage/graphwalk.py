"""Walk every node of a model, subgraphs included, in one fixed order.

The inventory names nodes in this order and placement renames a copy of the
model in the same order, so both agree on which node is which.
"""
from __future__ import annotations

from typing import Iterator

import onnx


def iter_nodes(graph: onnx.GraphProto, owner: str = "") -> Iterator[tuple[onnx.NodeProto, onnx.GraphProto, str]]:
    """Yield ``(node, graph holding it, owner label)``, depth first; ``owner`` is "" for the main graph."""
    for node in graph.node:
        yield node, graph, owner
        for attr in node.attribute:
            label = f"{node.name or node.op_type}/{attr.name}"
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g, label)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for i, sub in enumerate(attr.graphs):
                    yield from iter_nodes(sub, f"{label}[{i}]")


def node_keys(graph: onnx.GraphProto) -> list[str]:
    """A unique name per node in walk order: its own name when that is unique, else ``Op_<index>``."""
    nodes = [node for node, _, _ in iter_nodes(graph)]
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.name] = counts.get(node.name, 0) + 1
    keys, taken = [], {n.name for n in nodes if n.name and counts[n.name] == 1}
    for i, node in enumerate(nodes):
        key = node.name if node.name and counts[node.name] == 1 else f"{node.op_type}_{i}"
        while key in taken and key != node.name:
            key += "_"
        taken.add(key)
        keys.append(key)
    return keys
