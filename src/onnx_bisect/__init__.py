"""onnx-bisect: find the first ONNX node that diverges from the PyTorch model, and say why.

The stages, one package each, in the order ``pipeline`` runs them:
``source`` → ``capture`` → ``run`` → ``align`` → ``measure`` → ``diagnose`` → ``report``;
``records`` holds what they pass each other, ``cli`` is the command line, ``coverage`` the operator triage.
"""
from __future__ import annotations

import os

# ONNX Runtime 1.31 on Linux keeps usage telemetry in ~/.cache/Microsoft/DeveloperTools and $TMPDIR/.ses; a
# debugger run on untrusted files in CI writes nothing but the outputs it is asked for.  ORT_DISABLE_TELEMETRY /
# ORT_TELEMETRY_DISABLED are the opt-outs of newer releases; 1.31 honours only ORT_RUNNING_UNIT_TESTS (which
# gates nothing but telemetry).  Set before onnxruntime is imported; a value the user set is kept.
for _name in ("ORT_DISABLE_TELEMETRY", "ORT_TELEMETRY_DISABLED", "ORT_RUNNING_UNIT_TESTS"):
    os.environ.setdefault(_name, "1")

__version__ = "0.1.0"

__all__ = ["bisect", "verify", "triage", "Config", "Report", "MatrixReport", "BisectError", "__version__"]


def __getattr__(name: str):
    # Lazy: `onnx-bisect --help` and usage errors should not wait for torch to import.
    if name in ("bisect", "Config"):
        from .pipeline import bisect as pipeline

        return getattr(pipeline, name)
    if name == "triage":
        from .pipeline.coverage import triage

        return triage
    if name == "verify":
        from .pipeline.verify import verify

        return verify
    if name in ("Report", "MatrixReport"):
        from . import records

        return getattr(records, name)
    if name == "BisectError":
        from .errors import BisectError

        return BisectError
    raise AttributeError(f"module 'onnx_bisect' has no attribute {name!r}")
