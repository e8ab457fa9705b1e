"""Diagnose stage: name the cause of the first divergence, show the evidence, prove the fix."""
from __future__ import annotations

from ..records import Divergence
from .base import DiagnosisContext, Finding, Rule
from .unknown import explain_unknown

#: every rule class; a new cause is one new module and one line here
RULES: list[type[Rule]] = []


def diagnose(ctx: DiagnosisContext) -> Divergence:
    """Run every rule on ``ctx``; keep the most confident finding and try to confirm it."""
    findings: list[Finding] = []
    for rule in RULES:
        found = rule().match(ctx)
        if found is not None:
            findings.append(found)
    if not findings:
        return Divergence(
            layer=ctx.layer, introduced=ctx.introduced, cause="unknown",
            explanation=explain_unknown(ctx.layer, ctx.introduced, ctx.tolerance),
        )
    best = max(findings, key=lambda f: f.confidence)
    confirmed = _confirm(ctx, best) if best.counterfactual is not None else None
    return Divergence(
        layer=ctx.layer, introduced=ctx.introduced, cause=best.cause, explanation=best.summary,
        confidence=best.confidence, evidence=dict(best.evidence), fix=best.fix, confirmed=confirmed,
    )


def _confirm(ctx: DiagnosisContext, finding: Finding) -> bool:
    """Re-run the divergent segment with the fix applied: does its local error disappear?"""
    skeleton, weights = finding.counterfactual(ctx)
    values = ctx.local_run(skeleton, weights)
    tensor = ctx.layer.pair.tensor
    if tensor not in values:
        return False
    return ctx.compare(values[tensor], ctx.layer.pair.reference()).ok


__all__ = ["diagnose", "DiagnosisContext", "Finding", "Rule", "RULES"]
