"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value."""
from .absent import ABSENT
from .anchors import anchored_owners, holds_divided
from .passes import PASSES, align_activations
from .scopes import ScopeMap, candidate_tensors, map_scopes
from .state import reuse_alignment

__all__ = ["ABSENT", "PASSES", "anchored_owners", "holds_divided", "ScopeMap", "align_activations", "candidate_tensors", "map_scopes", "reuse_alignment"]
