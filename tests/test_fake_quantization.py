"""A quantization-aware model: PyTorch fake-quantizes its own activations and weights, and the exported file's
QuantizeLinear / DequantizeLinear pairs compute the same values.  Those pairs are the model's, not a quantizer's
approximation of it: a fault after them is judged against them, not against a float twin without them."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


class _FakeQuantNet(torch.nn.Module):
    """Conv (per-channel int8 weights by absmax), BatchNorm, ReLU, the activation fake-quantized to uint8 with a
    fixed scale, a global mean, a float classifier."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(241)
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        w = self.conv.weight
        scale = w.detach().abs().amax((1, 2, 3)) / 127  # an observer's statistic: no gradient
        w = torch.fake_quantize_per_channel_affine(w, scale, torch.zeros(8, dtype=torch.int32), 0, -128, 127)
        y = torch.relu(self.bn(torch.nn.functional.conv2d(x, w, self.conv.bias, padding=1)))
        y = torch.fake_quantize_per_tensor_affine(y, 0.025, 0, 0, 255)
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_classifier_weight_after_a_fake_quantized_activation_is_named_not_the_quantizer(exporter):
    """The classifier's weight noised: the segment reaching it holds the activation's Q/DQ pair.  Searched in a
    float twin without that pair, the quantizer's output looked wrong (PyTorch's value is quantized too) and was
    named, as quantization; the pair is PyTorch's own, so the classifier's weight is named."""
    model = _FakeQuantNet().eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(242)),)
    proto = dc.export(model, inputs, exporter)
    assert any(n.op_type == "QuantizeLinear" for n in proto.graph.node)
    weight = model.fc.weight.detach().numpy()
    init = next(i for i in proto.graph.initializer if numpy_helper.to_array(i).shape in (weight.shape, weight.T.shape)
                and np.allclose(np.sort(numpy_helper.to_array(i).reshape(-1)), np.sort(weight.reshape(-1))))
    value = numpy_helper.to_array(init)
    noise = np.random.default_rng(243).normal(0, 0.3 * weight.std(), value.shape).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(value + noise, init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, reader, cause="weight-mismatch", at_most=12)
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(fd.layer.segment_ops), fd.layer.segment_ops


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_clean_fake_quantized_export_agrees_with_no_warning(exporter):
    model = _FakeQuantNet().eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(242)),)
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=dc.export(model, inputs, exporter))
    assert report.first_divergence is None and not report.warnings, report.warnings


def test_a_wrong_scale_in_the_models_own_quantizer_is_still_named():
    """The activation quantizer's scale doubled in the file (TorchScript): the pair is PyTorch's own, kept in the
    twin — which keeps the file's wrong scale, so the twin does not reproduce PyTorch and the quantizer is named."""
    model = _FakeQuantNet().eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(242)),)
    proto = dc.export(model, inputs, "torchscript")
    consts = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    inits = {i.name: i for i in proto.graph.initializer}
    q = next(n for n in proto.graph.node if n.op_type == "QuantizeLinear" and (
        (t := consts.get(n.input[1])) is not None and numpy_helper.to_array(t.attribute[0].t).size == 1
        and abs(float(numpy_helper.to_array(t.attribute[0].t)) - 0.025) < 1e-6
        or n.input[1] in inits and abs(float(numpy_helper.to_array(inits[n.input[1]])) - 0.025) < 1e-6))
    doubled = np.array(0.05, np.float32)
    proto.graph.initializer.append(numpy_helper.from_array(doubled, "doubled_scale"))
    for n in proto.graph.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and n.input[1] == q.input[1]:
            n.input[1] = "doubled_scale"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd is not None and fd.cause in ("quantization", "attribute-mismatch", "weight-mismatch"), fd and (fd.cause, fd.explanation)
    readers = {n.name for n in proto.graph.node if "doubled_scale" in n.input}
    assert readers & set(fd.layer.segment + fd.fixed_nodes) and len(fd.layer.segment) <= 4, fd.layer.segment
