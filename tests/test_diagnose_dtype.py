"""Dtype rule: a float64 model and inputs against a float32 graph."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_float64_inputs_and_offset_cast_to_float32():
    report, _ = bisect_case(dc.dtype("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "dtype" and fd.confirmed is True
    ev = fd.evidence
    assert ev["float64_inputs"] == ["x"] and ev["float64_parameters"]
    assert max(ev["float32_rounding_max_abs"].values()) > 1e-3
    assert ev["local_max_abs_in_float64"] < 1e-6
    assert any("float64" in w for w in report.warnings)  # the preflight says so before the run
