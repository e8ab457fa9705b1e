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


def triage(target: str, inputs: tuple[str, ...] = (), providers: tuple[str, ...] = ("CPUExecutionProvider",),
           opset: int | None = None, confirm: bool = True) -> CoverageReport:
    """Triage a .py model (exported with both exporters) or an .onnx file; see ``CoverageReport``."""
    from ..pipeline.coverage import run_coverage

    return run_coverage(CoverageConfig(target=target, inputs=tuple(inputs), providers=tuple(providers),
                                       opset=opset, confirm=confirm))
