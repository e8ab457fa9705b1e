"""Op-coverage triage: what the exporters, the opset and each execution provider cannot run.

``onnx-bisect coverage MODEL`` on the command line; from Python::

    from onnx_bisect.coverage import triage
    report = triage("model.onnx", providers=("CUDAExecutionProvider", "CPUExecutionProvider"), opset=13)
    for finding in report.findings:
        print(finding.node.display, finding.status.value, finding.reason)
"""
from __future__ import annotations

from .records import CoverageConfig, CoverageReport, KernelVerdict, NodeFinding, RegistryState, Slug, Status

__all__ = ["triage", "CoverageConfig", "CoverageReport", "NodeFinding", "Status", "KernelVerdict",
           "RegistryState", "Slug"]


def __getattr__(name: str):
    # ``triage`` is the package's API face; the job that runs the stages lives in the pipeline package.
    if name == "triage":
        from .. import triage

        return triage
    raise AttributeError(f"module 'onnx_bisect.coverage' has no attribute {name!r}")
