"""Attribute rule: node attributes against the module's configuration, else found by trying alternatives."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_softmax_axis_against_the_module_dim():
    report, _ = bisect_case(dc.attribute("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    [row] = fd.evidence["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("axis", 0, -1)
    assert "softmax" in row["source"]


def test_conv_pads_against_the_conv2d():
    report, _ = bisect_case(dc.attribute("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    row = fd.evidence["attributes"][0]
    assert (row["attribute"], row["expected"]) == ("pads", [1, 1, 1, 1])


def test_transpose_perm_found_by_search():
    """k.transpose(-2, -1) inside forward has no module configuration: the alternative perm reproduces PyTorch."""
    report, _ = bisect_case(dc.attribute("transformer", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    row = fd.evidence["attributes"][0]
    assert row["attribute"] == "perm" and row["expected"] == [0, 1, 3, 2]
