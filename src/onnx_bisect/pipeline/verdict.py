"""The outputs' verdict: the unmodified model's outputs against PyTorch's, and whether an instrumented copy
reproduces them."""
from __future__ import annotations

import numpy as np

from ..measure import compare
from ..records import OutputResult, Reproduction, Tolerance
from ..records.graph import GraphIndex


def compare_outputs(captured, index, final, tol) -> tuple[OutputResult, ...]:
    """The unmodified model's outputs against PyTorch's, by position."""
    results = []
    for name, ref in zip(index.graph_outputs, captured.outputs):
        if name in final:
            # np.asarray: the verdict judges the output as the dtype it declares (see Runner._computed)
            results.append(OutputResult(name, compare.compare_tensors(np.asarray(final[name]), ref, tol)))
    return tuple(results)


def reproduction_of(index: GraphIndex, instrumented, final, tol: Tolerance) -> tuple[Reproduction, float]:
    """Whether the instrumented run's graph outputs equal the unmodified run's: bit for bit, within
    tolerance, or not; and the largest difference."""
    verdict, worst = Reproduction.EXACT, 0.0
    for name in index.graph_outputs:
        a, b = instrumented.get(name), final.get(name)
        if a is None or b is None or (a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")):
            continue
        diff = compare.compare_tensors(a, b, tol)
        worst = max(worst, diff.max_abs)
        if not diff.ok:
            verdict = Reproduction.DIFFERENT
        elif verdict is Reproduction.EXACT:
            verdict = Reproduction.WITHIN_TOLERANCE
    return verdict, worst
