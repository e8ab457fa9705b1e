"""Precision: the segment computes in float16/bfloat16 (Casts, half-precision initializers or inputs) and
loses accuracy there: overflow, underflow, rounding, or accumulation in low precision."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto

from ..support import edits, layout
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule, attribute

LOW = {TensorProto.FLOAT16: "float16", TensorProto.BFLOAT16: "bfloat16"}
FP16 = np.finfo(np.float16)
ACCUMULATING = {"MatMul", "Gemm", "Conv", "ConvTranspose", "ReduceSum", "ReduceMean", "ReduceSumSquare",
                "LayerNormalization", "Softmax", "GlobalAveragePool", "AveragePool", "InstanceNormalization",
                "BatchNormalization", "Einsum"}


#: at most this many half-precision nodes in a float32 file make an island (rather than a converted file)
ISLAND = 4


class LowPrecision(Rule):
    """Name the half-precision parts of the segment, measure range and rounding, re-run the segment in float32.

    When no segment exceeds the tolerance alone but errors build up, the whole
    path from the graph inputs is examined and re-run instead.
    """

    cause = Cause.PRECISION

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        path = not ctx.introduced
        nodes = set(ctx.upstream) if path else set(ctx.layer.segment)
        low = _low_precision_nodes(ctx, nodes)
        feeds = ctx.segment_feeds(from_inputs=path)
        low_inputs = [t for t, v in feeds.items() if v.dtype == np.float16]
        error = ctx.error
        if not (low or low_inputs) or not ctx.significant(error):
            return None
        outputs = [o for n in low for o in ctx.node(n).output if o]
        fixed = _float32(ctx, nodes, path)
        try:
            values = ctx.run_segment(fixed.model, fixed.weights, outputs=outputs, feeds=fixed.feeds, from_inputs=path)
        except Exception:  # noqa: BLE001 - no float32 re-run: still report what the graph shows
            values = {}
        after = ctx.compare(values[ctx.tensor], ctx.reference) if ctx.tensor in values else None
        stats = _range_stats(ctx, values, outputs)
        # half-precision inputs were rounded by the nodes computing them, outside the segment: those are the ones
        # to keep in float32 (a float16 LayerNorm whose output is judged at float16's resolution)
        producers = _half_island(ctx, low_inputs) - low
        reduce_ops = sorted({ctx.node(n).op_type for n in low | producers if ctx.node(n).op_type in ACCUMULATING})
        evidence = {"low_precision_nodes": sorted(low)[:40], "n_low_precision_nodes": len(low),
                    "low_precision_producers": sorted(producers)[:40],
                    "nodes_examined": len(nodes), "scope": "path from the graph inputs" if path else "segment",
                    "low_precision_inputs": low_inputs, "max_abs": error.max_abs,
                    "max_abs_in_float32": after.max_abs if after else None,
                    "nonfinite_in_onnx": error.nonfinite, "accumulating_ops_in_low_precision": reduce_ops, **stats}
        summary = _summary(ctx, path, low, nodes, low_inputs, error, after, stats, reduce_ops)
        block = sorted(low | producers)[:8]
        fix = (f"Keep these nodes in float32, e.g. onnxconverter_common.float16.convert_float_to_float16(model, "
               f"keep_io_types=True, node_block_list={block}{' …' if len(low | producers) > 8 else ''}) or "
               f"op_block_list={reduce_ops or sorted({ctx.node(n).op_type for n in low | producers})[:4]}"
               + ("; scale the activations down or use bfloat16 where values exceed float16's range" if
                  stats["values_beyond_float16_max"] else "")
               + ("; or loosen the tolerance to what float16 can deliver" if path else "") + ".")
        confidence = 0.85 if after is not None and after.ok else (0.6 if after is None else 0.35)
        if confidence == 0.85 and not path and low and len(low) <= ISLAND and ctx.onnx.graph.half_share < 0.5:
            # a few half-precision nodes in a float32 file (a cast pair a converter or an edit inserted), and float32
            # there removes the error: more specific than any other edit that happens to absorb a rounding error
            confidence = 0.92
        return Finding(self.cause, confidence, summary, fix, evidence, changes=tuple(sorted(low | producers)),
                       counterfactual=lambda c: _float32(c, nodes, path), from_inputs=path)


def _summary(ctx: DiagnosisContext, path: bool, low, nodes, low_inputs, error, after, stats, reduce_ops) -> str:
    reasons = []
    if stats["values_beyond_float16_max"]:
        reasons.append(f"{stats['values_beyond_float16_max']} values exceed float16's range ({FP16.max:g}), "
                       f"largest {stats['largest_magnitude']:.3g}")
    if error.nonfinite:
        reasons.append(f"{error.nonfinite} outputs are inf/NaN in ONNX but finite in PyTorch")
    if stats["values_underflowing_float16"]:
        reasons.append(f"{stats['values_underflowing_float16']} non-zero values underflow to zero in float16")
    if reduce_ops:
        reasons.append(f"{', '.join(reduce_ops)} accumulate in half precision")
    half = _half_type(ctx, low)
    if path:
        reasons.append(f"each segment stays within {half}'s rounding but the errors add up along the path")
    if not reasons:
        reasons.append(f"{half} rounding (about {HALF_DIGITS[half]} decimal digits) of values and intermediate "
                       "results")
    where = "the path from the graph inputs" if path else "the segment"
    fp32_text = (f"re-run in float32 {where} differs by {after.max_abs:.2g}"
                 + (" (within tolerance)" if after.ok else " (still beyond tolerance)")) if after else \
        f"{where} could not be re-run in float32"
    return (f"{where[0].upper() + where[1:]} computing {ctx.layer.pair.activation.name} runs in half precision "
            f"({len(low)} of {len(nodes)} node(s){', inputs ' + ', '.join(low_inputs) if low_inputs else ''}) "
            f"and differs by {error.max_abs:.2g}: {'; '.join(reasons)}; {fp32_text}.")


#: significant decimal digits of each half-precision type (11 and 8 bits of significand)
HALF_DIGITS = {"float16": 3, "bfloat16": 2}


def _half_type(ctx: DiagnosisContext, low) -> str:
    """``"bfloat16"`` when the half-precision nodes write bfloat16 tensors and no float16 ones, else ``"float16"``."""
    graph = ctx.onnx.graph
    types = {graph.elem_types.get(t) for n in graph.nodes if n.name in low for t in n.outputs}
    return "bfloat16" if onnx.TensorProto.BFLOAT16 in types and onnx.TensorProto.FLOAT16 not in types else "float16"


#: nodes named as the half-precision computation behind a segment's inputs, at most
ISLAND_AT_MOST = 40


def _half_island(ctx: DiagnosisContext, tensors: list[str]) -> set[str]:
    """The nodes computing the half-precision ``tensors``, back through their half-precision inputs to the Casts
    that made them (the float16 part of the graph that rounded them)."""
    graph, found, stack = ctx.onnx.graph, set(), list(tensors)
    while stack and len(found) < ISLAND_AT_MOST:
        node = graph.node_of(stack.pop())
        if node is None or node.name in found:
            continue
        found.add(node.name)
        if not (node.op_type == "Cast" and graph.elem_types.get(node.outputs[0]) in LOW):
            stack.extend(i for i in node.inputs if i and graph.elem_types.get(i) in LOW
                         and i not in graph.initializers)
    return found


def _low_precision_nodes(ctx: DiagnosisContext, names: set[str]) -> set[str]:
    """Nodes among ``names`` that produce, cast to, or read half-precision values."""
    low = set()
    for name in names:
        p = ctx.node(name)
        if p is None:
            continue
        if p.op_type == "Cast" and attribute(p, "to") in LOW:
            low.add(p.name)
        elif any(ctx.onnx.graph.elem_types.get(o) in LOW for o in p.output):
            low.add(p.name)
        elif any(ctx.onnx.graph.elem_types.get(i) in LOW for i in p.input if i in ctx.onnx.graph.initializers):
            low.add(p.name)
    return low


def _float32(ctx: DiagnosisContext, nodes: set[str], path: bool) -> FixedSegment:
    """The nodes converted to float32, their weights and inputs the PyTorch values (not rounded to float16)."""
    model, weights = edits.convert_float_type(edits.copy_model(ctx.onnx.skeleton), ctx.onnx.weights, nodes,
                                              set(LOW), TensorProto.FLOAT)
    candidates = layout.torch_candidates(ctx) if not path else layout.all_torch_tensors(ctx)
    for name in {t for n in nodes for t in ctx.node(n).input if t in ctx.onnx.graph.initializers}:
        value = ctx.initializer(name)
        if value is not None and value.dtype == np.float16:
            exact = layout.exact_torch_value(ctx, value, candidates)
            if exact is not None:
                model, weights = edits.replace_array(model, weights, name, exact[1])
    feeds = {}
    for t, v in ctx.segment_feeds(from_inputs=path).items():
        if v.dtype == np.float16:
            exact = ctx.torch_value(t) if t in ctx.cut.references else ctx.torch_input(t)
            feeds[t] = (exact if exact is not None else v).astype(np.float32)
    return FixedSegment(model, weights, feeds)


def _range_stats(ctx: DiagnosisContext, values: dict, outputs: list[str]) -> dict:
    """Overflow and underflow of float16 over the float32 values of the half-precision tensors and the reference."""
    arrays = [np.abs(values[o].astype(np.float64)).ravel() for o in outputs if o in values
              and np.issubdtype(values[o].dtype, np.floating)]
    arrays.append(np.abs(ctx.reference.astype(np.float64)).ravel())
    flat = np.concatenate(arrays) if arrays else np.zeros(0)
    flat = flat[np.isfinite(flat)]
    return {"values_beyond_float16_max": int(np.sum(flat > FP16.max)),
            "values_underflowing_float16": int(np.sum((flat > 0) & (flat < FP16.smallest_subnormal / 2))),
            "largest_magnitude": float(flat.max()) if flat.size else 0.0}
