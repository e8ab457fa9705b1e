"""Batch mixing: the segment is right for each sample alone but wrong for the batch — it mixes rows.

A reduction over the batch axis (a hand edit or a rewrite that assumed batch 1),
a Softmax over axis 0, or a reshape that folds the batch into another axis make
a graph agree at batch 1 and diverge at any other size.  The rule re-runs the
segment one sample at a time: if every sample then agrees with PyTorch, the
batch is being mixed, and the nodes that reduce or normalise over axis 0 are named.
"""
from __future__ import annotations

import numpy as np

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

REDUCTIONS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"}
#: rows re-run alone (the first and the last are enough to show mixing)
ROWS = 2


class BatchMixing(Rule):
    """Re-run the segment per sample; blame the nodes that reduce over, or normalise along, axis 0."""

    cause = Cause.BATCH_MIXING

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        reference = ctx.reference
        batch = reference.shape[0] if reference.ndim else 0
        if batch < 2 or not ctx.significant(ctx.layer.local):
            return None
        feeds = ctx.segment_feeds()
        if not any(v.ndim and v.shape[0] == batch for v in feeds.values()):
            return None
        rows = sorted({0, batch - 1})[:ROWS]
        try:
            alone = [ctx.compare(_row_run(ctx, feeds, batch, i), reference[i:i + 1]) for i in rows]
            # the same feeds, the batch whole: the divergence must be there too, or the rows agreeing says only
            # that these feeds are right (the local run fed the segment elsewhere: a mask applied before them)
            whole = ctx.compare(ctx.run_segment(feeds=feeds)[ctx.tensor], reference)
        except Exception:  # noqa: BLE001 - a segment that cannot run at batch 1 tells nothing here
            return None
        if not all(d.ok for d in alone) or whole.ok:
            return None
        suspects = _over_batch_axis(ctx)
        listed = ", ".join(f"{name} ({what})" for name, what in suspects.items())
        summary = (f"Each sample alone agrees with PyTorch (max abs {max(d.max_abs for d in alone):.2g} for rows "
                   f"{', '.join(map(str, rows))}), the batch of {batch} differs by {ctx.layer.local.max_abs:.2g}: "
                   "the segment mixes the samples of the batch"
                   + (f" — {listed}." if suspects else ", though no node reduces over axis 0 explicitly "
                                                       "(look for a reshape that folds the batch into another axis)."))
        fix = ("Keep the batch axis out of reductions and normalisations: "
               + (f"remove axis 0 from {', '.join(suspects)}; " if suspects else "")
               + "a hand edit or a rewrite that assumed batch 1 did this — re-export, or fix the node's axes.")
        reducers = [n for n, what in suspects.items() if what.startswith("reduces")
                    and attribute(ctx.node(n), "axes") is not None]
        counterfactual = (lambda c: _without_batch_axis(c, reducers)) if reducers else None
        evidence = {"batch": batch, "rows_alone_max_abs": {str(i): d.max_abs for i, d in zip(rows, alone)},
                    "batch_local_max_abs": ctx.layer.local.max_abs, "nodes_over_batch_axis": suspects}
        return Finding(self.cause, 0.9 if suspects else 0.75, summary, fix, evidence, counterfactual=counterfactual)


def _row_run(ctx: DiagnosisContext, feeds: dict[str, np.ndarray], batch: int, row: int) -> np.ndarray:
    sliced = {t: (v[row:row + 1] if v.ndim and v.shape[0] == batch else v) for t, v in feeds.items()}
    return ctx.run_segment(feeds=sliced)[ctx.tensor]


def _over_batch_axis(ctx: DiagnosisContext) -> dict[str, str]:
    """Segment nodes that reduce over, or normalise along, axis 0."""
    out = {}
    for node in ctx.segment_protos:
        if node.op_type in REDUCTIONS:
            axes = attribute(node, "axes")
            if axes is None and len(node.input) > 1:
                value = ctx.constant(node.input[1])
                axes = None if value is None else [int(a) for a in np.asarray(value).reshape(-1)]
            rank = len(ctx.onnx.graph.shapes.get(node.input[0]) or ()) or None
            if axes is not None and any(a == 0 or (rank and a == -rank) for a in axes):
                out[node.name] = f"reduces over axes {list(axes)}"
        elif node.op_type in ("Softmax", "LogSoftmax", "Hardmax") and attribute(node, "axis", -1) == 0:
            out[node.name] = "normalises along axis 0"
    return out


def _without_batch_axis(ctx: DiagnosisContext, nodes: list[str]) -> FixedSegment:
    """The model with axis 0 removed from the reductions' ``axes`` attribute."""
    model = edits.copy_model(ctx.onnx.skeleton)
    for name in nodes:
        axes = attribute(edits.node(model, name), "axes")
        if axes is not None:
            model = edits.set_attribute(model, name, "axes", [a for a in axes if a != 0])
    return FixedSegment(model, ctx.onnx.weights)
