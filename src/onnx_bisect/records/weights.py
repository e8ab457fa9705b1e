"""Large initializers kept beside the graph skeleton, shared by every session."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Weights:
    """Large initializers by name, as read-only numpy arrays."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict, repr=False)

    def __contains__(self, name: str) -> bool:
        return name in self.arrays
