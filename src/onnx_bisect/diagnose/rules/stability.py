"""Numerical stability: a float32 segment turns finite inputs into inf/NaN where PyTorch stays finite.

PyTorch implements many functions in a numerically stable way (``logsigmoid``,
``softplus``, ``logsumexp``, ``log_softmax``); an exporter that decomposes them
into textbook formulas — ``Log(Sigmoid(x))``, ``Log(Sum(Exp(x)))`` — overflows
or underflows for inputs PyTorch handles.  Half precision is the precision
rule's business; this one looks at float32/float64 segments.
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from ..support import edits
from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule

#: stable rewrites of unstable op sequences, by (producer op, consumer op)
REWRITES = {
    ("Sigmoid", "Log"): "log(sigmoid(x)) = -softplus(-x) (F.logsigmoid); ONNX: Neg → Softplus → Neg",
    ("Exp", "Log"): "log(sum(exp(x))) = m + log(sum(exp(x - m))) with m = max(x) (ReduceLogSumExp)",
    ("Exp", "ReduceSum"): "subtract the maximum before Exp (or use ReduceLogSumExp / Softmax)",
    ("Softmax", "Log"): "use LogSoftmax instead of Log(Softmax(x))",
}


class NumericalStability(Rule):
    """Find the first segment node whose finite float32 inputs give non-finite outputs."""

    cause = Cause.NUMERICAL_STABILITY

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        local = ctx.layer.local
        if local is None or local.nonfinite == 0 or local.dtype not in ("float32", "float64"):
            return None
        protos = ctx.segment_protos
        outputs = [t for p in protos for t in p.output if t]
        values = {**ctx.segment_feeds(), **ctx.run_segment(outputs=outputs)}
        for proto in protos:
            ins = [values.get(t) for t in proto.input if t]
            outs = [values.get(t) for t in proto.output if t]
            floats = [v for v in ins if v is not None and v.dtype.kind == "f"]
            weights = [w for w in (ctx.initializer(t) for t in proto.input if t) if w is not None and w.dtype.kind == "f"]
            if not floats or not all(np.isfinite(v).all() for v in floats + weights):
                continue  # non-finite inputs or weights make non-finite outputs: no formula is to blame
            bad = [v for v in outs if v is not None and v.dtype.kind == "f" and not np.isfinite(v).all()]
            if not bad:
                continue
            return self._finding(ctx, proto, floats, bad[0])
        return None

    def _finding(self, ctx: DiagnosisContext, proto, inputs, output) -> Finding:
        producer = ctx.onnx.graph.node_of(proto.input[0]) if proto.input else None
        pattern = (producer.op_type if producer else "", proto.op_type)
        if pattern in REWRITES and producer.inputs:  # the chain's own input says more than the intermediate
            upstream = ctx.run_segment(outputs=[producer.inputs[0]]).get(producer.inputs[0])
            inputs = [upstream] if upstream is not None else inputs
        lo = min(float(v.min()) for v in inputs)
        hi = max(float(v.max()) for v in inputs)
        count = int(np.size(output) - np.isfinite(output).sum())
        chain = f"{pattern[0]} → {proto.op_type}" if pattern[0] else proto.op_type
        summary = (f"{proto.name} ({chain}) turns finite float32 inputs (range [{lo:.3g}, {hi:.3g}]) into inf/NaN "
                   f"for {count} of {np.size(output)} values, where PyTorch stays finite: the graph computes "
                   f"{ctx.layer.pair.activation.name} with a formula that is not numerically stable for these inputs.")
        rewrite = REWRITES.get(pattern)
        fix = ("Compute it the stable way: " + (rewrite + "; " if rewrite else "")
               + "if PyTorch's op was stable and the exporter decomposed it, rewrite the graph or the model code "
                 "with the stable form, or clamp the input to the range the formula survives.")
        evidence = {"node": proto.name, "ops": list(pattern), "input_range": [lo, hi], "nonfinite_values": count}
        stable = (lambda c: _stable_log_sigmoid(c, producer, proto)) if pattern == ("Sigmoid", "Log") else None
        return Finding(self.cause, 0.8, summary, fix, evidence, counterfactual=stable)


def _stable_log_sigmoid(ctx: DiagnosisContext, sigmoid, log) -> FixedSegment:
    """The graph with ``Log(Sigmoid(x))`` computed as ``-Softplus(-x)``."""
    model = edits.copy_model(ctx.onnx.skeleton)
    x, out, base = sigmoid.inputs[0], log.output[0], log.name
    edits.replace_nodes(model, {log.name}, [
        helper.make_node("Neg", [x], [f"{base}_neg_x"], name=f"{base}_stable_neg_in"),
        helper.make_node("Softplus", [f"{base}_neg_x"], [f"{base}_softplus"], name=f"{base}_stable_softplus"),
        helper.make_node("Neg", [f"{base}_softplus"], [out], name=f"{base}_stable_neg_out"),
    ])
    return FixedSegment(model, ctx.onnx.weights)
