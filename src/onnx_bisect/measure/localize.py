"""Localize stage: separate the error a segment introduces from the error it inherits.

A *segment* is the set of ONNX nodes that compute one aligned tensor from the
nearest aligned tensors upstream (the cut points).  Its *local* error comes from
a run in which every cut point is fed the PyTorch value, so the segment starts
from exact inputs; its *accumulated* error comes from the plain run.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..records.graph import GraphIndex
from ..records import (ErrorOrigin, LayerResult, MatchMethod, Status, TensorDiff, TensorPair)
from ..records.graph import SORTING_OPS, sorted_upstream
from ..records.rows import rows_reordered

Compare = Callable[[np.ndarray, np.ndarray], TensorDiff]


def cut_points(pairs: tuple[TensorPair, ...], graph: GraphIndex) -> dict[str, TensorPair]:
    """Tensors whose consumers will read the PyTorch value in the local run.

    Only confident pairs computed by a node qualify; for a tensor shared by
    several activations (a container and its last child) the first wins.
    """
    cuts: dict[str, TensorPair] = {}
    for p in pairs:
        if p.cuttable and p.tensor in graph.producer and p.tensor not in cuts:
            cuts[p.tensor] = p
    return cuts


def localize(
    pairs: tuple[TensorPair, ...],
    graph: GraphIndex,
    accumulated: dict[str, np.ndarray],
    local: dict[str, np.ndarray],
    cuts: dict[str, TensorPair],
    compare: Compare,
    accumulated_reliable: bool = True,
    reordered: frozenset[str] = frozenset(),
) -> tuple[LayerResult, ...]:
    """One LayerResult per pair, sorted in graph order.

    ``accumulated_reliable`` is False when the instrumented run does not
    reproduce the unmodified model's verdict (exposing tensors stopped a fusion):
    local errors, measured on a graph that keeps its fusions, are then trusted
    even where the accumulated run looks exact.  ``reordered``: cuts fed the file's own value because their rows
    are PyTorch's in another order (a segment reading them holds its rows in that order too).
    """
    compare = _memoised(compare)
    stops = frozenset(cuts)
    refs = {p.activation.index: p.reference() for p in pairs}  # kept alive: the memo keys on ids
    local_diffs = {t: compare(local[t], refs[p.activation.index]) for t, p in cuts.items() if t in local}
    rows: list[LayerResult] = []
    order = -1.0
    for p in pairs:
        if p.tensor is not None and (p.tensor in graph.producer or p.tensor in graph.graph_inputs):
            order = float(graph.order_of(p.tensor))
        else:
            order += 1e-3  # keep unmatched rows next to their neighbours in call order
        rows.append(_layer(p, refs[p.activation.index], graph, accumulated, local_diffs, stops, compare, order,
                           accumulated_reliable, local, reordered))
    return tuple(sorted(rows, key=lambda r: (r.order, r.pair.activation.index)))


def _layer(p, reference, graph, accumulated, local_diffs, stops, compare, order, accumulated_reliable,
           local_values=None, reordered: frozenset[str] = frozenset()) -> LayerResult:
    if p.tensor is None:
        status = Status.FUSED if p.method is MatchMethod.FUSED else Status.UNMATCHED
        return LayerResult(p, None, None, status, ErrorOrigin.NONE, order=order)
    value = accumulated.get(p.tensor)
    if value is not None and p.tensor in graph.graph_outputs:
        # A graph output is what the user gets: judged as its declared dtype, like the outputs' verdict,
        # even when it holds float16 data (its segment's local error still allows float16 rounding).
        value = np.asarray(value)
    diff = compare(value, reference) if value is not None else None
    local = local_diffs.get(p.tensor)
    seg = graph.segment(p.tensor, stops) if p.tensor in graph.producer else ()
    # A segment that is exact on its real inputs but wrong on the references has
    # been fed a reference that does not belong there (a doubtful pair upstream),
    # not a fault of its own: it is not reported as introducing error.
    if local is not None and not local.ok and (diff is None or not diff.ok or not accumulated_reliable):
        status, origin = Status.DIVERGED, ErrorOrigin.INTRODUCED
    elif diff is not None and not diff.ok:
        status, origin = Status.DIVERGED, ErrorOrigin.INHERITED
    else:
        status = Status.FUSED if p.method is MatchMethod.FUSED else Status.MATCHED
        origin = ErrorOrigin.NONE
    if status is Status.DIVERGED and _reordered(p.tensor, reference, graph, seg, accumulated, local_values or {},
                                                 origin, compare, reordered):
        status, origin = Status.REORDERED, ErrorOrigin.NONE
    return LayerResult(
        pair=p, diff=diff, local=local, status=status, origin=origin,
        segment=tuple(graph.nodes[i].name for i in seg),
        segment_ops=tuple(graph.nodes[i].op_type for i in seg), order=order,
    )


def _reordered(tensor, reference, graph, seg, accumulated, local, origin, compare, reordered=frozenset()) -> bool:
    """Whether the layer is beyond the tolerance only by the order of its rows: a TopK in its segment or a
    reordered cut read there (for an inherited error, a TopK it is computed from; never a graph output), and its
    value — local when it introduces the error, else or then the whole run's — PyTorch's rows in another order
    (tokens sorted by their expert in a mixture of experts: equal expert ids keep another order)."""
    if origin is ErrorOrigin.INTRODUCED and not any(graph.nodes[i].op_type in SORTING_OPS or reordered.intersection(
            graph.nodes[i].inputs) for i in seg):
        return False  # no sort of its own, and no reordered rows read
    if tensor in graph.graph_outputs:
        return False  # what the user gets: rows in another order there are wrong, whatever sorted them
    if origin is ErrorOrigin.INHERITED and not sorted_upstream(graph, tensor):
        return False
    values = ([local.get(tensor)] if origin is ErrorOrigin.INTRODUCED else []) + [accumulated.get(tensor)]
    for value in values:  # the whole run's too: a segment fed PyTorch's rows in PyTorch's order while its own
        if value is None or np.asarray(value).shape != np.asarray(reference).shape:  # sort orders them another
            continue  # way mixes the two orders
        moved = rows_reordered(np.asarray(value), np.asarray(reference))
        if moved is not None and compare(moved, np.asarray(reference)).ok:
            return True
    return False


def _memoised(compare: Compare) -> Compare:
    """Containers share their last child's tensor: compare each array pair once."""
    cache: dict[tuple[int, int], TensorDiff] = {}

    def run(actual: np.ndarray, expected: np.ndarray) -> TensorDiff:
        key = (id(actual), id(expected))
        if key not in cache:
            cache[key] = compare(actual, expected)
        return cache[key]

    return run


def first_divergence(layers: tuple[LayerResult, ...]) -> tuple[LayerResult | None, bool]:
    """The earliest layer whose segment introduces error beyond tolerance.

    Returns ``(layer, introduced)``.  When no segment exceeds tolerance on its
    own but errors still build up, the earliest layer whose accumulated error
    exceeds tolerance is returned with ``introduced=False``.  Among layers that
    share one tensor, the innermost module is blamed.
    """
    for origin in (ErrorOrigin.INTRODUCED, ErrorOrigin.INHERITED):
        hits = [r for r in layers if r.origin is origin]
        if hits:
            first = min(hits, key=lambda r: r.order)
            same = [r for r in hits if r.pair.tensor == first.pair.tensor]
            return max(same, key=_depth), origin is ErrorOrigin.INTRODUCED
    return None, False


def _depth(r: LayerResult) -> tuple[int, int, int]:
    a = r.pair.activation
    leafness = 1 if a.is_leaf and a.module else 0
    direct = 1 if r.pair.method is not MatchMethod.IDENTITY else 0
    return (direct, leafness, a.module.count(".") + (1 if a.module else 0))
