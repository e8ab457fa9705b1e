"""Layers anchored by their weights: where in a graph a Linear or a convolution computes, told by the
initializer holding its weight (see :mod:`..capture.weights`), not by names or by activation values.

Loose pairs (a graph without scope information whose outputs diverge) pair by nearness of value, and downstream of
a fault the nearest tensor may lie after a later layer — the next attention's softmax for this one's, when this
one's holds log-probabilities.  A tensor computed from the node of a layer PyTorch ran later cannot hold an earlier
activation's value: :func:`anchored_owners` gives those nodes' outputs, owned by their layer, for
:func:`.structure.pair_loosely`'s order check."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..records import Activation
from ..records.graph import PRODUCT_OPS, GraphIndex

#: nodes computing with a weight initializer (read directly or through a Transpose / Cast / DequantizeLinear)
WEIGHTED = PRODUCT_OPS
CARRIERS = frozenset({"Transpose", "Cast", "DequantizeLinear", "Identity"})
#: float16 rounding of a weight moves its sums by about this much (relative); a float32 copy by far less
SIGNATURE_RTOL = 2e-3
#: a layer called more often than this is not anchored call by call (a walk up the graph per call)
MAX_SHARED_CALLS = 64


def anchored_owners(acts: tuple[Activation, ...], graph: GraphIndex, signatures: Mapping[str, tuple],
                    initializers: Mapping[str, np.ndarray]) -> dict[str, float]:
    """``{output tensor of a layer's node: the layer's activation index − 0.5}`` for each leaf Linear / conv
    whose weight signature matches exactly one float initializer (the half: the layer's own tensor stays its
    own; an earlier activation's may not be computed from it).  A layer called once owns the one weighted node
    reading it.  A layer called N times (a shared block: a neural ODE's field, ALBERT's layers) owns N readers
    only when each is computed from the one before: data flow then fixes which call each is, whatever the
    file's node order (independent calls, a siamese pair, give no order and no owner)."""
    calls: dict[str, list[Activation]] = {}
    for a in acts:
        if a.is_leaf and a.module in signatures and not a.op:
            calls.setdefault(a.module, []).append(a)
    by_size: dict[int, list[str]] = {}
    for name, value in initializers.items():
        if value.dtype.kind == "f" and value.ndim >= 2:
            by_size.setdefault(int(value.size), []).append(name)
    owners: dict[str, float] = {}
    for module, called in calls.items():
        if len(called) > MAX_SHARED_CALLS:
            continue
        found = [t for t in by_size.get(signatures[module][0], ()) if _same(signatures[module], initializers[t])]
        nodes = _chain(graph, _readers(graph, found[0])) if len(found) == 1 else []
        if len(nodes) == len(called):
            for a, node in zip(called, nodes):
                for t in node.outputs:
                    owners[t] = a.index - 0.5
    return _consistent(graph, owners)


def _consistent(graph: GraphIndex, owners: dict[str, float]) -> dict[str, float]:
    """``owners`` less the anchors data flow contradicts: a node computed from the node of a layer PyTorch ran
    after its own (two layers' weights exchanged in the file: each anchor points at the other's node) — both
    are dropped."""
    latest: dict[str, tuple[float, str]] = {}
    wrong: set[str] = set()
    for node in graph.nodes:
        found = max((latest[i] for i in node.inputs if i in latest), default=None)
        own = next((owners[t] for t in node.outputs if t in owners), None)
        if own is not None and found is not None and found[0] > own:
            wrong.update(o for o in node.outputs if o in owners)
            wrong.add(found[1])
        mark = max(filter(None, [found, (own, node.outputs[0]) if own is not None else None]), default=None)
        if mark is not None:
            for t in node.outputs:
                latest[t] = mark
    if not wrong:
        return owners
    dropped = {owners[t] for t in wrong if t in owners}
    return {t: i for t, i in owners.items() if i not in dropped}


def _same(signature: tuple, value: np.ndarray) -> bool:
    v = np.asarray(value, dtype=np.float64)
    _, total, squares = signature
    return abs(float(v.sum()) - total) <= SIGNATURE_RTOL * (float(np.abs(v).sum()) + 1e-12) and abs(
        float((v * v).sum()) - squares) <= SIGNATURE_RTOL * squares


def _readers(graph: GraphIndex, tensor: str) -> list:
    """The weighted nodes reading ``tensor`` (through carriers)."""
    readers, frontier = [], [tensor]
    for _ in range(3):
        nxt = []
        for t in frontier:
            for c in graph.consumers.get(t, ()):
                node = graph.nodes[c]
                if node.op_type in WEIGHTED:
                    readers.append(node)
                elif node.op_type in CARRIERS:
                    nxt.extend(node.outputs)
        frontier = nxt
    return list({id(n): n for n in readers}.values())


def _chain(graph: GraphIndex, nodes: list) -> list:
    """``nodes`` in data-flow order when each is computed from the one before it (a chain), else []."""
    if len(nodes) <= 1:
        return nodes
    nodes = sorted(nodes, key=lambda n: graph.order_of(n.outputs[0]))
    for before, after in zip(nodes, nodes[1:]):
        if not set(before.outputs) & _upstream(graph, after, graph.order_of(before.outputs[0])):
            return []
    return nodes


def _upstream(graph: GraphIndex, node, floor: int) -> set[str]:
    """The tensors ``node`` is computed from, computed at graph position ``floor`` or later (the walk stops before
    it: only the graph between two calls is read)."""
    seen: set[str] = set()
    stack = [i for i in node.inputs if i]
    while stack:
        t = stack.pop()
        if t not in seen and graph.order_of(t) >= floor:
            seen.add(t)
            producer = graph.node_of(t)
            if producer is not None:
                stack.extend(i for i in producer.inputs if i and i not in seen)
    return seen


#: a reader's weight holding a PyTorch layer's weight divided by a folded factor: their sums of squares this near
#: (relative) — loose enough for a faulty reader (weight noise of 0.3× the std moves it by about 10 %), far
#: tighter than the factor's square (4 for GELU's ×0.5)
FOLDED_SQUARES_RTOL = 0.3
#: factors nearer 1 than this leave sums of squares too close to tell a fold from none
MIN_FOLDED_FACTOR = 0.4


def holds_divided(signatures: Mapping[str, tuple], value: np.ndarray, factor: float) -> bool:
    """Whether ``value`` (the weight of a node reading a tensor that holds a layer's output times ``factor``)
    is some PyTorch layer's weight of its size divided by that factor — the factor a simplifier moved out of
    the tensor into these weights (onnx-simplifier folds an Erf GELU's ×0.5 into the next Conv): judged by
    the sum of squares, which a fault in the weight moves far less than the factor's square does."""
    if not np.isfinite(factor) or abs(abs(factor) - 1.0) < MIN_FOLDED_FACTOR:
        return False
    v = np.asarray(value, dtype=np.float64)
    squares = float((v * v).sum()) * factor * factor
    return any(size == v.size and abs(sq - squares) <= FOLDED_SQUARES_RTOL * sq
               for size, _, sq in signatures.values())
