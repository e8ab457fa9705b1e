"""Diagnosis rules, one known cause per module."""
