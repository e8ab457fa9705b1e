"""Typed records passed between the pipeline stages (no stage imports another; they share these)."""
from .core import *  # noqa: F401,F403
from .core import __all__ as _core
from .graph import GraphIndex, NodeInfo, outer_inputs  # noqa: F401
from .kinds import module_kind  # noqa: F401
from .matrix import *  # noqa: F401,F403
from .matrix import __all__ as _matrix
from .repro import Extraction, Repro, StandaloneSegment  # noqa: F401
from .weights import Weights  # noqa: F401

__all__ = [*_core, *_matrix, "Extraction", "Repro", "StandaloneSegment", "GraphIndex", "NodeInfo", "Weights",
           "module_kind", "outer_inputs"]
