"""GELU approximation rule: real exports, a planted formula swap, real ONNX Runtime sessions."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose.rules.gelu import GeluApproximation, gelu_erf, gelu_tanh  # noqa: E402


def test_tanh_gelu_in_the_graph_is_named_and_switched_back():
    report, ctx = bisect_case(dc.gelu("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "gelu-approximation" and fd.confirmed is True and fd.confidence >= 0.9
    ev = fd.evidence
    assert (ev["onnx_formula"], ev["pytorch_formula"]) == ("tanh", "erf")
    assert ev["max_abs_onnx_vs_tanh"] < 1e-5 < 1e-4 < ev["max_abs_onnx_vs_erf"]
    assert ev["max_abs_pytorch_vs_erf"] < 1e-5
    assert ev["local_max_abs_after_fix"] < 1e-5
    assert "erf" in fd.fix


def test_decomposed_tanh_subgraph_and_fast_gelu_are_found():
    for provenance in ("torchscript", "onnxslim"):  # a Tanh subgraph; a com.microsoft FastGelu
        report, _ = bisect_case(dc.gelu("transformer", provenance))
        fd = report.first_divergence
        assert fd.cause == "gelu-approximation" and fd.confirmed is True, (provenance, fd.explanation)


def test_reverse_pytorch_tanh_onnx_erf():
    report, _ = bisect_case(dc.gelu_reverse("cnn", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "gelu-approximation" and fd.confirmed is True
    assert (fd.evidence["onnx_formula"], fd.evidence["pytorch_formula"]) == ("erf", "tanh")


def test_rule_stays_silent_on_another_fault():
    _, ctx = bisect_case(dc.weight("mlp", "dynamo"))
    assert GeluApproximation().match(ctx) is None


def test_formulas():
    import numpy as np

    x = np.array([-3.0, 0.0, 1.0])
    assert np.allclose(gelu_erf(x), [-0.0040497, 0.0, 0.8413447], atol=1e-6)
    assert np.allclose(gelu_tanh(x), [-0.0036374, 0.0, 0.8411920], atol=1e-6)
