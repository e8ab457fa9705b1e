"""Align stage: pair each PyTorch activation with the ONNX tensor computing the same value."""
from .absent import ABSENT
from .anchors import anchored_owners
from .passes import PASSES, align_activations
from .scopes import ScopeMap, candidate_tensors, map_scopes
from .state import reuse_alignment

__all__ = ["ABSENT", "PASSES", "anchored_owners", "ScopeMap", "align_activations", "candidate_tensors", "map_scopes", "reuse_alignment"]
