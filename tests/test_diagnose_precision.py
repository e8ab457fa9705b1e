"""Precision rule: half-precision segments and paths, confirmed by re-running them in float32."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
import plant  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_float16_segment():
    report, _ = bisect_case(dc.precision("transformer", "onnxslim"))  # one block converted by onnxconverter-common
    fd = report.first_divergence
    assert fd.cause == "precision" and fd.confirmed is True
    ev = fd.evidence
    assert ev["scope"] == "segment" and ev["n_low_precision_nodes"] >= 1
    assert ev["max_abs_in_float32"] < 1e-5 < ev["max_abs"]
    assert "node_block_list" in fd.fix


def test_errors_that_build_up_over_a_float16_path():
    """A model converted to float16 whole: the first Gemm, in half precision (its row is the folded BatchNorm's,
    which no divergence is read from), carries most of the outputs' divergence, so the bisection names it; re-run
    in float32 it agrees. Its weights, a BatchNorm fold stored in float16, are off by float16's rounding only: no
    fold mistake (a fold with another epsilon was claimed from that rounding)."""
    report, _ = bisect_case(dc.precision("mlp", "dynamo"))
    fd = report.first_divergence
    amp = fd.amplification
    assert amp is not None and amp.output_ratio - amp.output_ratio_without >= 0.5 * amp.output_ratio_all
    assert fd.cause == "precision" and fd.confirmed is True
    assert "Gemm" in fd.layer.segment_ops and "Gemm" in fd.evidence["accumulating_ops_in_low_precision"]


class _Big(torch.nn.Module):
    """fc's outputs reach about 1e5, beyond float16's 65504; the model scales them back down."""

    def __init__(self):
        super().__init__()
        self.fc, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.fc.weight.mul_(100.0)

    def forward(self, x):
        return self.out(self.fc(x) / 1e5)


def test_overflow_beyond_float16_range():
    torch.manual_seed(0)
    model = _Big().eval()
    inputs = (torch.randn(4, 8) * 1000.0,)
    proto = plant.to_float16(dc.export(model, inputs, "torchscript"))
    report, _ = bisect_case(dc.Case("overflow", "precision", "mlp", "torchscript", model, inputs, proto))
    fd = report.first_divergence
    assert fd.cause == "precision" and fd.confirmed is True
    assert fd.evidence["nonfinite_in_onnx"] > 0
    assert fd.evidence["values_beyond_float16_max"] > 0 and fd.evidence["largest_magnitude"] > 65504
    assert "exceed float16's range" in fd.explanation
