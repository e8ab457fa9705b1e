"""Diagnose stage: name the cause of the first divergence, show the evidence, prove the fix; preflight checks."""
from .context import Baseline, CutRun, DiagnosisContext, Finding, FixedSegment, OnnxModel, Rule
from .runner import CONFIDENT, RULES, confirmed_fix, diagnose, fix_reference
from .rules.quantization import clips, explained_by_quantization, float_twin

__all__ = ["diagnose", "clips", "explained_by_quantization", "float_twin", "confirmed_fix", "fix_reference", "Baseline", "CutRun", "DiagnosisContext", "Finding", "FixedSegment", "OnnxModel", "Rule", "RULES",
           "CONFIDENT"]
