"""Quantization rule: clipping and SQNR of the real activation, per-channel advice for weights."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_activation_quantizer_that_clips():
    report, _ = bisect_case(dc.quantization("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "quantization" and fd.confirmed is True
    [act] = fd.evidence["activations"]
    assert act["clip_fraction"] > 0.01 and 0 < act["sqnr_db"] < 40
    assert "recalibrate" in fd.fix.lower() and "nodes_to_exclude" in fd.fix


def test_per_tensor_weight_quantization():
    report, _ = bisect_case(dc.quantization("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "quantization" and fd.confirmed is True
    [w] = fd.evidence["weights"]
    assert w["parameter"] == "conv3.weight" and not w["per_channel"]
    assert w["sqnr_db_per_channel"] > w["sqnr_db"]
