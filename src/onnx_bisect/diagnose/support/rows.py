"""Rows of one table matched with the rows of another: a selection, a shift or a signed copy of PyTorch's."""
from __future__ import annotations

import numpy as np


def nearest_rows(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``a`` (2-d), the index of the nearest row of ``b`` and the squared distance to it, in
    float64 (one product of the two tables, no pairwise difference tensor)."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    distances = (a ** 2).sum(1)[:, None] + (b ** 2).sum(1)[None, :] - 2 * a @ b.T
    nearest = distances.argmin(1)
    return nearest, distances[np.arange(len(a)), nearest]
