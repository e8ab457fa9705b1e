"""Weight rule: initializers against the PyTorch parameters, by name or value, transposes and folds allowed."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose.weight_mismatch import WeightMismatch  # noqa: E402


def test_renamed_transposed_weight_of_the_dynamo_exporter():
    report, _ = bisect_case(dc.weight("transformer", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True
    [row] = fd.evidence["parameters"]
    assert row["parameter"] == "blocks.1.fc1.weight" and row["layout"] == "transposed"
    assert 0.03 < row["rel_l2"] < 0.08 and row["correlation"] > 0.99


def test_perturbed_weight_of_a_folded_conv_is_compared_with_the_fold():
    report, _ = bisect_case(dc.weight("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True
    assert fd.evidence["parameters"][0]["parameter"] == "conv3.weight"


def test_silent_on_a_wrong_fold_and_on_equal_weights():
    _, ctx = bisect_case(dc.batchnorm_fold("cnn", "dynamo"))
    assert WeightMismatch().match(ctx) is None  # a per-channel rescale: the fold rule's case
    _, ctx = bisect_case(dc.gelu("mlp", "dynamo"))
    assert WeightMismatch().match(ctx) is None
