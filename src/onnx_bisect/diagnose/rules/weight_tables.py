"""Weight reading of constant tables (rotary cos / sin, position tables, masks folded from buffers) holding other
numbers than PyTorch computes: each replaced by the nearest PyTorch value computed from no input."""
from __future__ import annotations

import numpy as np

from ..support import edits, layout
from ..support.rows import nearest_rows
from ...records import Cause
from ...records.graph import PRODUCT_OPS
from ..context import DiagnosisContext, Finding, FixedSegment
from .weight_params import constant_activations, weight_readers


#: constant tables tried in the place of a segment's constant, at most
MAX_TABLES = 8


def stale_table(ctx: DiagnosisContext) -> Finding | None:
    """Constants the segment reads (no layer's weight) holding other numbers than the module outputs they were
    folded from (rotary cos and sin tables, a position table, a mask computed from buffers): with those outputs in
    their place the segment reproduces PyTorch — tables built with another base or length, a stale buffer.  Each
    constant is given its nearest such outputs (most rows in common, then correlation), all together first, then
    one at a time."""
    graph, found, fixed = ctx.onnx.graph, [], _input_free(ctx.ops)
    candidates = layout.torch_candidates(ctx)
    for name in dict.fromkeys(t for p in ctx.segment_protos for t in p.input):
        value = ctx.constant(name)
        if value is None or value.dtype.kind != "f" or value.size < 4 or graph.weighted_readers(name) \
                or any(graph.nodes[c].op_type in PRODUCT_OPS for c in graph.consumers.get(name, ())):
            continue
        if not np.ptp(value):
            continue  # one number everywhere (the zeros a sum starts from): nothing to tell which output it was
        if any((r := layout.relate(value, v)) is not None and r.equal for v in candidates.values()
               if v.size == value.size):
            continue  # a parameter's own numbers (a norm's scale, a bias): not a table
        outputs = {**constant_activations(ctx, value.size),  # and PyTorch's ops computed from no input (a table
                   **{f"{a.name} (folded into a constant)": np.asarray(a.value, np.float64) for a in fixed  # gathered
                      if a.value.size == value.size and a.value.dtype.kind == "f"}}  # from a buffer in a forward)
        # in the constant's dtype, saturated as converters store them (float32's lowest is float16's in a mask)
        span = np.finfo(value.dtype)
        tables = [(what, np.clip(t.reshape(value.shape), span.min, span.max).astype(value.dtype))
                  for what, t in outputs.items()]
        tables = [(w, t) for w, t in tables if not np.allclose(t, value, rtol=1e-3, atol=1e-6)]
        # nearest first: most of the constant's rows among the table's (a table read from another offset, its
        # rows shifted), then by correlation
        tables.sort(key=lambda p: (-_rows_shared(value, p[1]), -layout.relate(value, p[1]).correlation))
        if tables:
            what, table = tables[0]
            if value.ndim >= 2 and value.shape[-1] == value.shape[-2] and np.allclose(
                    np.swapaxes(table, -1, -2), value, rtol=1e-3, atol=1e-6):
                continue  # the table transposed (a mask with query and key exchanged): the attribute rule's case
            found.append([(name, value, w, t.astype(value.dtype)) for w, t in tables[:TABLES_PER_CONSTANT]])
    # all constants' nearest together, then each constant's nearest alone, then each one's next ones
    tries = ([[f[0] for f in found]] if len(found) > 1 else []) + [
        [f[r]] for r in range(TABLES_PER_CONSTANT) for f in found if r < len(f)]
    for chosen in tries[:MAX_TABLES]:
        model, weights = edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights
        try:
            for name, _, _, restored in chosen:
                model, weights = edits.replace_array(model, weights, name, restored)
            values = ctx.run_segment(model, weights)
        except Exception:  # noqa: BLE001 - a table that does not fit or run is not the answer
            continue
        if ctx.compare(values[ctx.tensor], ctx.reference).ok:
            return _table_finding(ctx, chosen)
    return None


#: PyTorch values tried in a constant table's place, nearest first
TABLES_PER_CONSTANT = 3


def _nearest_rows(value: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """For each of ``value``'s rows (along its last axis) the nearest row of ``table`` and whether it equals it;
    None when the tables are too large to compare row by row or hold non-finite numbers."""
    if value.ndim == 0 or value.shape[-1] < 2:
        return None
    a = value.reshape(-1, value.shape[-1]).astype(np.float64)
    b = table.reshape(-1, value.shape[-1]).astype(np.float64)
    if len(a) * len(b) * a.shape[1] > MAX_ROW_WORK or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    nearest, distance = nearest_rows(a, b)
    return nearest, distance <= 1e-8 * ((a ** 2).sum(1) + 1e-30)


#: multiply-adds a row-by-row comparison of two tables may take
MAX_ROW_WORK = 1 << 26


def _rows_shared(value: np.ndarray, table: np.ndarray) -> float:
    """The fraction of ``value``'s rows (along its last axis) that equal some row of ``table``."""
    rows = _nearest_rows(value, table)
    return 0.0 if rows is None else float(np.mean(rows[1]))


def _row_shift(value: np.ndarray, table: np.ndarray) -> tuple[int, int, int] | None:
    """``(k, rows, of)`` when ``rows`` of ``value``'s ``of`` rows i — at least half — are ``table``'s row i + k
    (k ≠ 0: a table read from another offset)."""
    found = _nearest_rows(value, table) if value.ndim >= 2 else None
    if found is None:
        return None
    nearest, equal = found
    shifts = (nearest - np.arange(len(nearest)))[equal]
    if not shifts.size:
        return None
    k, count = np.unique(shifts, return_counts=True)
    best = int(k[count.argmax()])
    return (best, int(count.max()), len(nearest)) if best != 0 and count.max() >= len(nearest) / 2 else None


def _shift_text(row: dict) -> str:
    if row.get("row_shift") is None:
        return ""
    k, n, of = row["row_shift"], row["rows_shifted"], row["rows"]
    return f"; {n} of its {of} rows are PyTorch's shifted by {k} positions, row i holding row i + {k}"


def _input_free(ops) -> list:
    """PyTorch's ops computed from no model input: those reading nothing captured (a range, a full, a buffer)
    and those reading only such ops."""
    free: set[int] = set()
    for op in sorted(ops, key=lambda a: a.index):
        if all(i in free for i in op.inputs):
            free.add(op.index)
    return [a for a in ops if a.index in free]


def _table_finding(ctx: DiagnosisContext, chosen) -> Finding:
    rows = [{"initializer": name, "parameter": what, "layout": "folded table",
             "fraction_differing": float(np.mean(~np.isclose(value, restored, rtol=1e-3, atol=1e-6)))}
            for name, value, what, restored in chosen]
    for r, (_, value, _, restored) in zip(rows, chosen):
        shift = _row_shift(value, restored)
        if shift is not None:
            r["row_shift"], r["rows_shifted"], r["rows"] = shift
    listed = "; ".join(f"'{r['initializer']}' is {r['parameter']} with other numbers ({r['fraction_differing']:.0%} "
                       f"of its elements differ{_shift_text(r)})" for r in rows)
    summary = (f"Constant tables differ from what PyTorch computes: {listed} (each paired with the PyTorch value "
               "nearest it, by rows in common then correlation, among those computed from no input). With "
               "PyTorch's in their place the segment reproduces PyTorch's output. The tables were perhaps computed "
               "with another configuration than the model runs (a rotary base or a position offset, another "
               "length) or from a stale buffer.")
    fix = ("Re-export with the configuration and buffers the model runs with (rope_theta, max positions), or "
           "recompute the table in the graph instead of folding it.")
    replaced = [(name, restored) for name, _, _, restored in chosen]

    def counterfactual(c):
        model, weights = edits.copy_model(c.onnx.skeleton), c.onnx.weights
        for name, restored in replaced:
            model, weights = edits.replace_array(model, weights, name, restored)
        return FixedSegment(model, weights)

    return Finding(Cause.WEIGHT_MISMATCH, 0.85, summary, fix, {"parameters": rows},
                   changes=weight_readers(ctx, [name for name, _ in replaced]), counterfactual=counterfactual)
