"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value."""
from .absent import ABSENT
from .passes import PASSES, align_activations
from .scopes import ScopeMap, candidate_tensors, map_scopes
from .state import reuse_alignment

__all__ = ["ABSENT", "PASSES", "ScopeMap", "align_activations", "candidate_tensors", "map_scopes", "reuse_alignment"]
