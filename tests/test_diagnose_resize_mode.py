"""Resize rule: the Resize setting that reproduces F.interpolate."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_align_corners_in_onnx_but_not_in_pytorch():
    report, _ = bisect_case(dc.resize("cnn", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "resize-mode" and fd.confirmed is True
    ev = fd.evidence
    assert ev["onnx_config"]["coordinate_transformation_mode"] == "align_corners"
    assert ev["matching_config"]["mode"] == "linear"
    assert ev["matching_config"]["coordinate_transformation_mode"] in ("half_pixel", "pytorch_half_pixel")
    assert ev["pytorch"] == {"module": "Upsample", "mode": "bilinear", "align_corners": False}
    assert "align_corners=False" in fd.explanation


def test_cubic_where_pytorch_is_bilinear_with_align_corners():
    report, _ = bisect_case(dc.resize("transformer", "onnxslim"))
    fd = report.first_divergence
    assert fd.cause == "resize-mode" and fd.confirmed is True
    assert fd.evidence["matching_config"]["coordinate_transformation_mode"] == "align_corners"
