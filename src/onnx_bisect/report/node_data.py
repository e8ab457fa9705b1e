"""Model Explorer node data (``--node-data FILE.json``): the error along the graph, as colours on its nodes.

The format is Model Explorer's node data for one graph, as its Python builder writes it
(``model_explorer/node_data_builder.py``: ``GraphNodeData`` with ``results`` of ``NodeDataResult``, ``thresholds``
of ``ThresholdItem``) and its UI reads it (``NodeDataProviderGraphData`` in
``src/ui/src/components/visualizer/common/types.ts``; a file whose ``results`` holds no ``results`` key is data
for the graph on screen)::

    {"results": {NODE_ID: {"value": 12.5}, ...},
     "thresholds": [{"value": 1, "bgColor": "#a5d6a7"}, ...]}   # a value <= the first bound takes its colour

Node ids are ONNX node names, as the ONNX adapter (``model-explorer-onnx``) names its nodes.  One value per node
and file, so three files are written, as the adapter does for its own accuracy results (one file per metric):
``FILE.json`` the accumulated error in units of the tolerance (max |onnx - torch| / (atol + rtol |torch|)),
``FILE.local.json`` the local error (the segment fed PyTorch's values), ``FILE.status.json`` each node's status as
text, coloured.  JSON has no infinity: an infinite error is written as the largest double.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any

from ..records import ErrorOrigin, LayerResult, Report, Status
from .text import status_text
from .files import write_atomic

#: colours by error in units of the tolerance: within it greens, beyond it amber to dark red
THRESHOLDS = [(0.01, "#2e7d32"), (1.0, "#a5d6a7"), (10.0, "#ffcc80"), (1000.0, "#f4511e"),
              (sys.float_info.max, "#b71c1c")]
FIRST = "first divergence"
IN_FIRST = "in the first divergent segment"
#: colours by status (a diverged layer by the origin of its error), and of the first divergence's nodes
STATUS_COLOURS = {Status.MATCHED: "#a5d6a7", Status.FUSED: "#e0e0e0", Status.UNMATCHED: "#fafafa",
                  Status.QUANTIZED: "#fff59d", Status.CONDITIONED: "#e1f5fe", Status.REORDERED: "#e1f5fe"}
ORIGIN_COLOURS = {ErrorOrigin.INHERITED: "#ffcc80", ErrorOrigin.INTRODUCED: "#f4511e", ErrorOrigin.NONE: "#ffcc80"}
FIRST_COLOURS = {FIRST: "#7b1fa2", IN_FIRST: "#ce93d8"}


def _colour(r: LayerResult) -> str:
    return ORIGIN_COLOURS[r.origin] if r.status is Status.DIVERGED else STATUS_COLOURS[r.status]


def node_data_paths(path: str) -> tuple[str, str, str]:
    """The three files ``--node-data PATH`` writes: accumulated, local, status."""
    stem = path[:-5] if path.lower().endswith(".json") else path
    return path, stem + ".local.json", stem + ".status.json"


def node_data(report: Report) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The three node-data documents of ``report``: accumulated error, local error, status."""
    layers = _by_node(report)
    accumulated = {n: _number(r.diff.tol_ratio) for n, r in layers.items() if r.diff is not None}
    local = {n: _number(r.local.tol_ratio) for n, r in layers.items() if r.local is not None}
    status = {n: (status_text(r), _colour(r)) for n, r in layers.items()}
    fd = report.first_divergence
    if fd is not None:
        status.update({n: (IN_FIRST, FIRST_COLOURS[IN_FIRST]) for n in fd.layer.segment if n and n not in layers})
        if fd.layer.pair.node:
            status[fd.layer.pair.node] = (FIRST, FIRST_COLOURS[FIRST])
    thresholds = [{"value": v, "bgColor": c} for v, c in THRESHOLDS]
    graph_id = report.graph_name or "<main>"  # as the ONNX adapter names the graph
    numeric = [_graph({n: {"value": v} for n, v in values.items()}, graph_id, thresholds=thresholds)
               for values in (accumulated, local)]
    labels = _graph({n: {"value": s, "bgColor": c} for n, (s, c) in status.items()}, graph_id,
                    showExpandedSummaryOnGroupNode=True, showLabelCountColumnsInChildrenStatsTable=True)
    return numeric[0], numeric[1], labels


def write_node_data(report: Report, path: str) -> tuple[str, ...]:
    """Write the three node-data files of ``report`` (atomically); return their paths."""
    paths = node_data_paths(path)
    for target, document in zip(paths, node_data(report)):
        write_atomic(target, json.dumps(document, indent=1, allow_nan=False) + "\n")
    return paths


def _by_node(report: Report) -> dict[str, LayerResult]:
    """One layer per ONNX node (the node computing its tensor): the measured one with the largest error."""
    chosen: dict[str, LayerResult] = {}
    for r in report.layers:
        node = r.pair.node
        if not node:
            continue
        have = chosen.get(node)
        if have is None or _rank(r) > _rank(have):
            chosen[node] = r
    return chosen


def _rank(r: LayerResult) -> tuple:
    ratio = r.diff.tol_ratio if r.diff is not None else -1.0
    return (r.diff is not None, r.origin is ErrorOrigin.INTRODUCED, -1.0 if math.isnan(ratio) else ratio)



def _number(x: float) -> float | str:
    """``x`` to 4 significant digits; infinity as the largest double, NaN as text."""
    if math.isnan(x):
        return "nan"
    return sys.float_info.max if math.isinf(x) else float(f"{x:.4g}")


def _graph(results: dict[str, Any], graph_id: str, **options: Any) -> dict[str, Any]:
    """Node data for one graph; keyed by the graph's id when a node named ``results`` would make Model Explorer
    take the single-graph document for one keyed by graph."""
    document = {"results": results, **options}
    if "results" in results:
        return {graph_id or "<main>": document}
    return document
