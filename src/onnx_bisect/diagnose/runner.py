"""Diagnose stage: name the cause of the first divergence, show the evidence, prove the fix."""
from __future__ import annotations

from ..records import Cause, Divergence
from .rules.activation_kind import ActivationKind
from .rules.attribute_mismatch import AttributeMismatch
from .rules.baked_shape import BakedShape
from .rules.batch_mixing import BatchMixing
from .context import DiagnosisContext, Finding, FixedSegment, Rule
from .rules.batchnorm_fold import BatchNormFold
from .rules.dtype import Float64Cast, IntegerRoundTrip
from .rules.epsilon import EpsilonMismatch
from .rules.gelu import GeluApproximation
from .rules.precision import LowPrecision
from .rules.quantization import Quantization
from .rules.resize_mode import ResizeMode
from .rules.runtime_optimization import RuntimeOptimization
from .rules.stability import NumericalStability
from .rules.training_mode import NondeterministicReference, TrainingMode
from .rules.unknown import explain_unknown
from .rules.weight_mismatch import WeightMismatch

#: every rule class; a new cause is one new module and one line here
RULES: list[type[Rule]] = [
    RuntimeOptimization, GeluApproximation, EpsilonMismatch, BatchNormFold, WeightMismatch,
    AttributeMismatch, ActivationKind, ResizeMode, LowPrecision, Quantization, TrainingMode, Float64Cast,
    IntegerRoundTrip,
    NondeterministicReference,
    BakedShape, BatchMixing, NumericalStability,
]

#: at or above this confidence a finding names the cause; below it, it is a lead
CONFIDENT = 0.5
#: how many of the best findings are re-run with their fix before giving up on confirmation
CONFIRM_AT_MOST = 3


def diagnose(ctx: DiagnosisContext, skip: frozenset[Cause] = frozenset()) -> Divergence:
    """Run every rule on ``ctx`` (but those of the causes in ``skip``); keep the most confident finding that
    survives re-running with its fix."""
    rules = [r for r in RULES if r.cause not in skip]
    findings, failures = _findings(ctx, [r for r in rules if not r.expensive])
    if not any(f.confidence >= CONFIDENT for f in findings):
        more, more_failures = _findings(ctx, [r for r in rules if r.expensive])
        findings, failures = findings + more, failures | more_failures
    if not findings:
        return _unknown(ctx, failures)
    ranked = sorted(findings, key=lambda f: -f.confidence)
    chosen, confirmed, after = ranked[0], None, None
    for finding in ranked[:CONFIRM_AT_MOST]:
        if finding.counterfactual is None:
            continue
        ok, diff = _confirm(ctx, finding)
        if finding is ranked[0] or ok:
            chosen, confirmed, after = finding, ok, diff
        if ok:
            break
    confidence = chosen.confidence
    if confirmed is True and confidence >= CONFIDENT:
        confidence = max(confidence, 0.95)
    elif confirmed is False:
        confidence = round(confidence * 0.6, 3)  # the fix did not remove the divergence: a weaker lead
    if confidence < CONFIDENT:
        return _unknown(ctx, failures, lead=(chosen, confidence, confirmed))
    evidence = dict(chosen.evidence)
    if after is not None:
        evidence["local_max_abs_before_fix"] = ctx.layer.local.max_abs if ctx.layer.local else None
        evidence["local_max_abs_after_fix"] = after.max_abs
    if failures:
        evidence["rules_failed"] = failures
    return Divergence(
        layer=ctx.layer, introduced=ctx.introduced, cause=chosen.cause, explanation=chosen.summary,
        confidence=confidence, evidence=evidence, fix=chosen.fix, confirmed=confirmed,
        fixed_nodes=chosen.changes,
    )


def _findings(ctx: DiagnosisContext, rules: list[type[Rule]]) -> tuple[list[Finding], dict[str, str]]:
    """Every rule's finding; a rule that raises is skipped and named (a rule bug must not sink the report)."""
    found, failed = [], {}
    for rule in rules:
        try:
            finding = rule().match(ctx)
        except Exception as exc:  # noqa: BLE001 - reported in the evidence, not swallowed silently
            failed[rule.cause] = f"{type(exc).__name__}: {str(exc)[:200]}"
            continue
        if finding is not None:
            found.append(finding)
    return found, failed


def _confirm(ctx: DiagnosisContext, finding: Finding, fixed: FixedSegment | None = None):
    """Re-run the divergent segment with the fix applied: ``(does its local error disappear?, its diff)``.

    Only the segment's nodes run (fed the same PyTorch values as the local
    run), so confirming costs a few-node session even on a large model.
    """
    try:
        fixed = finding.counterfactual(ctx) if fixed is None else fixed
        values = ctx.run_segment(fixed.model, fixed.weights, feeds=fixed.feeds, optimize=finding.optimize,
                                 from_inputs=finding.from_inputs)
    except Exception:  # noqa: BLE001 - a fix that cannot be re-run leaves the finding a hypothesis
        return None, None
    if ctx.tensor not in values:
        return None, None
    reference = fix_reference(ctx, finding)
    diff = ctx.compare(values[ctx.tensor], reference)
    if not diff.ok:  # PyTorch's rows in the order the file's sort gives them are PyTorch's value
        diff = ctx.reordered_diff(values[ctx.tensor], reference) or diff
    return diff.ok, diff


def fix_reference(ctx: DiagnosisContext, finding: Finding):
    """The PyTorch value the fixed segment must compute (the divergent tensor's, unless the finding says)."""
    return ctx.reference if finding.reference is None else finding.reference(ctx)


def confirmed_fix(ctx: DiagnosisContext, divergence: Divergence) -> tuple[Finding, FixedSegment] | None:
    """The fix that confirmed ``divergence`` (made by ``diagnose`` on ``ctx``), applied again: the first rule of
    its cause whose counterfactual removes the divergence, with that counterfactual.  Only asked for by a repro
    (``--extract``): the diagnosis itself keeps no fixed model."""
    if divergence.confirmed is not True:
        return None
    for rule in RULES:
        if rule.cause is not divergence.cause:
            continue
        try:
            finding = rule().match(ctx)
            fixed = finding.counterfactual(ctx) if finding is not None and finding.counterfactual else None
        except Exception:  # noqa: BLE001 - as in diagnose: a rule that fails here confirms nothing
            continue
        if fixed is not None and _confirm(ctx, finding, fixed)[0]:
            return finding, fixed
    return None


def _unknown(ctx: DiagnosisContext, failures: dict[str, str], lead=None) -> Divergence:
    """No confident cause: the measured numbers, what was ruled out, and a weak lead if there is one."""
    causes = list(dict.fromkeys(r.cause for r in RULES))
    explanation = explain_unknown(ctx.layer, ctx.introduced, ctx.tolerance)
    explanation += f" None of the known causes fits ({', '.join(causes)} checked)."
    local = ctx.layer.local
    evidence = {"segment_ops": sorted(set(ctx.layer.segment_ops)), "checked": causes}
    if local is not None:
        evidence.update(local_max_abs=local.max_abs, local_max_rel=local.max_rel, tolerance_ratio=local.tol_ratio)
    if lead is not None:
        finding, confidence, confirmed = lead
        explanation += (f" A weak lead ({finding.cause}, confidence {confidence:.0%}"
                        f"{', its fix did not remove the divergence' if confirmed is False else ''}): {finding.summary}")
        evidence["weak_lead"] = {"cause": finding.cause, "confidence": confidence, "evidence": dict(finding.evidence)}
    if failures:
        evidence["rules_failed"] = failures
    return Divergence(layer=ctx.layer, introduced=ctx.introduced, cause=Cause.UNKNOWN, explanation=explanation,
                      evidence=evidence)



