"""Helpers for users' own test suites."""
from __future__ import annotations

from typing import Any

from .pipeline.bisect import bisect
from .report.text import render_text


def assert_no_divergence(model: Any, inputs: Any, onnx: Any = None, **options: Any):
    """Fail with the onnx-bisect verdict when the ONNX model diverges from ``model``.

    ``options`` are those of :func:`onnx_bisect.bisect` (``atol``, ``rtol``,
    ``exporter``, ``opset``, ``provider``).  Returns the report when it passes.
    """
    report = bisect(model, inputs, onnx=onnx, **options)
    if not report.ok:
        raise AssertionError(render_text(report))
    return report
