"""Runtime-optimization rule: a divergence that disappears with ONNX Runtime's optimizations off."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_gelu_approximation_session_option():
    report, _ = bisect_case(dc.runtime("transformer", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "runtime-optimization" and fd.confirmed is True
    ev = fd.evidence
    assert ev["local_max_abs_unoptimized"] < 1e-5 < 1e-4 < ev["local_max_abs_optimized"]
    assert ev["session_config"] == {"optimization.enable_gelu_approximation": "1"}
    assert "optimization.enable_gelu_approximation=1" in fd.fix


def test_same_graph_without_the_option_is_clean():
    case = dc.runtime("transformer", "torchscript")
    case.options = {}
    report, _ = bisect_case(case)
    assert report.ok
