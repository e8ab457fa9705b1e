"""Runtime optimization: the segment diverges only when ONNX Runtime optimizes the graph."""
from __future__ import annotations

from ...records import Cause
from ..context import DiagnosisContext, Finding, FixedSegment, Rule

#: session options known to trade accuracy for speed, with what they do
LOSSY_OPTIONS = {
    "optimization.enable_gelu_approximation": "rewrites erf-GELU into the tanh approximation (FastGelu)",
    "session.set_denormal_as_zero": "flushes denormal numbers to zero",
    "mlas.enable_gemm_fastmath_arm64_bfloat16": "runs float32 GEMMs in bfloat16",
}


class RuntimeOptimization(Rule):
    """Re-run the segment with graph optimizations off: does the divergence disappear?"""

    cause = Cause.RUNTIME_OPTIMIZATION

    def match(self, ctx: DiagnosisContext) -> Finding | None:
        if not ctx.significant(ctx.layer.local):
            return None
        optimized = ctx.compare(ctx.local_value, ctx.reference)
        plain = ctx.compare(ctx.run_segment(optimize=False)[ctx.tensor], ctx.reference)
        if optimized.ok or not plain.ok or not ctx.significant(optimized):
            return None
        config = dict(ctx.cut.runtime.session_config)
        level = ctx.cut.runtime.opt_level
        lossy = {k: v for k, v in config.items() if k in LOSSY_OPTIONS and str(v) not in ("0", "")}
        evidence = {
            "local_max_abs_optimized": optimized.max_abs, "local_max_abs_unoptimized": plain.max_abs,
            "tolerance_ratio_optimized": optimized.tol_ratio, "tolerance_ratio_unoptimized": plain.tol_ratio,
            "optimization_level": level, "session_config": config,
        }
        if lossy:
            culprit = "; ".join(f"{k}={v} ({LOSSY_OPTIONS[k]})" for k, v in lossy.items())
            fix = f"Remove {', '.join(f'{k}={v}' for k, v in lossy.items())} from the ONNX Runtime session options."
        else:
            culprit = f"a graph optimization (level '{level}')"
            fix = ("Lower the session's graph_optimization_level (e.g. ORT_ENABLE_BASIC) or exclude the offending "
                   "optimizer with the session option 'optimization.disable_specified_optimizers'.")
        summary = (
            f"The segment computing {ctx.layer.pair.activation.name} agrees with PyTorch when ONNX Runtime's graph "
            f"optimizations are off (max abs {plain.max_abs:.2g}) and diverges when they are on "
            f"(max abs {optimized.max_abs:.2g}): the model is right, {culprit} changes its numbers."
        )
        return Finding(self.cause, 0.9, summary, fix, evidence,
                       counterfactual=lambda c: FixedSegment(c.onnx.skeleton, c.onnx.weights), optimize=False)
