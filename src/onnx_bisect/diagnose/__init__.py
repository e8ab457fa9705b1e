"""Diagnose stage: name the cause of the first divergence, show the evidence, prove the fix; preflight checks."""
from .context import DiagnosisContext, Finding, Rule
from .runner import CONFIDENT, RULES, diagnose

__all__ = ["diagnose", "DiagnosisContext", "Finding", "Rule", "RULES", "CONFIDENT"]
