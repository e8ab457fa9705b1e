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


def test_a_batchnorm_written_out_with_the_variance_for_the_deviation_is_pinned_to_its_mul_and_add():
    """KPConv's last BatchNorm1d (TorchScript) written as a per-channel Mul and Add whose scale is γ/(var+eps),
    inside a segment of some forty nodes (neighbour search, gathers, the kernel correlation): the refolded scale
    and shift reproduce PyTorch, and the segment is pinned to the Mul and the Add that read them."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    import onnx_bisect
    import sweep_models

    model, inputs = sweep_models.build("kpconv")
    proto = dc.export(model, inputs, "torchscript")
    bn = [n for n in proto.graph.node if n.op_type == "BatchNormalization"][-1]
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in proto.graph.initializer}
    gamma, beta, mean, var = (inits[t] for t in bn.input[1:5])
    eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    shape = (-1, 1)  # a BatchNorm1d over (N, C, points)
    scale = (gamma / (var + eps)).reshape(shape).astype(np.float32)
    shift = (beta - mean * gamma / (var + eps)).reshape(shape).astype(np.float32)
    proto.graph.initializer.extend([numpy_helper.from_array(scale, "bn_scale"), numpy_helper.from_array(shift,
                                                                                                        "bn_shift")])
    at = list(proto.graph.node).index(bn)
    proto.graph.node.remove(bn)
    proto.graph.node.insert(at, helper.make_node("Mul", [bn.input[0], "bn_scale"], ["bn_scaled"], name="bn_mul"))
    proto.graph.node.insert(at + 1, helper.make_node("Add", ["bn_scaled", "bn_shift"], [bn.output[0]], name="bn_add"))
    onnx.checker.check_model(proto)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd.cause == "batchnorm-fold" and fd.confirmed is True, fd.explanation
    assert {"bn_mul", "bn_add"} <= set(fd.layer.segment) and len(fd.layer.segment) <= 4, fd.layer.segment
    assert "variance where the standard deviation belongs" in fd.explanation, fd.explanation
