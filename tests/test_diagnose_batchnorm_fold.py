"""BatchNorm fold rule: which channels are off and which folding mistake fits."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose.rules.batchnorm_fold import BatchNormFold  # noqa: E402


def test_fold_without_epsilon():
    report, _ = bisect_case(dc.batchnorm_fold("cnn", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "batchnorm-fold" and fd.confirmed is True
    ev = fd.evidence
    assert ev["mistake"] == "epsilon-dropped" and abs(ev["fitted_epsilon"]) < 1e-4
    assert ev["n_channels_off"] == ev["channels"] == 8
    assert (ev["conv"], ev["batchnorm"]) == ("conv1", "bn1")
    assert ev["local_max_abs_after_fix"] < 1e-4


def test_fold_with_batch_statistics_into_a_gemm():
    """TorchScript keeps BatchNorm1d as a node; the planted fold merges it into the Gemm with batch statistics."""
    report, _ = bisect_case(dc.batchnorm_fold("mlp", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "batchnorm-fold" and fd.confirmed is True
    assert fd.evidence["mistake"] == "batch-statistics"
    assert fd.evidence["fit_error"]["batch-statistics"] < 1e-4


def test_wrong_epsilon_is_fitted():
    report, _ = bisect_case(dc.batchnorm_fold("transformer", "onnxslim"))
    fd = report.first_divergence
    assert fd.cause == "batchnorm-fold" and fd.evidence["mistake"] == "epsilon"
    assert abs(fd.evidence["fitted_epsilon"] - 0.1) < 1e-3


def test_silent_on_a_perturbed_folded_weight():
    """Noise on a correctly folded weight is not a per-channel rescale: the weight rule's case, not this one."""
    report, ctx = bisect_case(dc.weight("cnn", "dynamo"))
    assert BatchNormFold().match(ctx) is None
