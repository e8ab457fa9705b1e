"""Diagnose stage: name the cause of the first divergence, show the evidence, prove the fix; preflight checks."""
from .context import Baseline, CutRun, DiagnosisContext, Finding, FixedSegment, OnnxModel, Rule
from .runner import CONFIDENT, RULES, diagnose

__all__ = ["diagnose", "Baseline", "CutRun", "DiagnosisContext", "Finding", "FixedSegment", "OnnxModel", "Rule", "RULES",
           "CONFIDENT"]
