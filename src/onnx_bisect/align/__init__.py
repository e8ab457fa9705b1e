"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value."""
from .scopes import ABSENT, ScopeMap, align_activations, candidate_tensors, map_scopes, reuse_alignment

__all__ = ["ABSENT", "ScopeMap", "align_activations", "candidate_tensors", "map_scopes", "reuse_alignment"]
