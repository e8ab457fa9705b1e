"""Constants that are a Dropout's mask frozen into a graph: read by the training-mode rule (its cause) and left
alone by the readings that would take them for an op to remove."""
from __future__ import annotations

import numpy as np

#: a constant mask of zeros and one value s > 1 is a frozen Dropout's when its share of zeros is within this of
#: the drop probability s implies (1 − 1/s), over at least MASK_MIN elements (a Dropout2d's mask: one per channel)
MASK_SHARE_SLACK, MASK_MIN = 0.15, 8
#: the fewest values a mask of one value per head or channel is read from
SHORT_MIN = 4


def dropout_probability(mask: np.ndarray | None) -> float | None:
    """The drop probability p of a constant holding zeros and 1/(1−p) in about that share (a Dropout traced or
    exported in training mode, its random mask folded into a constant); None for any other value.  Over
    MASK_MIN elements or more the share of zeros must be within MASK_SHARE_SLACK of p; a shorter mask (a
    Dropout2d's over four heads or channels, at least SHORT_MIN values) counts only for a whole-percent p of at most
    one half, as models configure them, with a zeros' count a Bernoulli(p) draw gives (within three standard
    deviations)."""
    if mask is None or mask.size < SHORT_MIN or not np.issubdtype(mask.dtype, np.floating):
        return None
    values = np.unique(np.asarray(mask, np.float64))
    if len(values) != 2 or values[0] != 0 or not values[1] > 1:
        return None
    p, n = 1 - 1 / float(values[1]), mask.size
    zeros = float(np.sum(np.asarray(mask) == 0))
    if n >= MASK_MIN:
        return p if abs(zeros / n - p) <= MASK_SHARE_SLACK else None
    whole = abs(p * 100 - round(p * 100)) <= 1e-3 and p <= 0.5
    return p if whole and abs(zeros - n * p) <= 3 * np.sqrt(n * p * (1 - p)) else None
