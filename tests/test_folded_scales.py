"""Folds: a factor folded out of a module's output into the next layer's weights (onnx-simplifier moves an Erf
GELU's ×0.5 into a following bias-free convolution): the module's tensor then holds its value times 2, which
is no divergence — the reader holds its own value exactly — while a wrong factor there still is one; a
BatchNorm folded into a Conv downstream of a fault keeps the Conv's tensor."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class Extractor(torch.nn.Module):
    """wav2vec-style: bias-free Conv1d, GroupNorm, GELU, twice, then a Linear over time steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.conv0, self.norm = torch.nn.Conv1d(1, 8, 5, stride=2, bias=False), torch.nn.GroupNorm(8, 8)
        self.act0, self.act1 = torch.nn.GELU(), torch.nn.GELU()
        self.conv1 = torch.nn.Conv1d(8, 8, 3, stride=2, bias=False)
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.act0(self.norm(self.conv0(x.unsqueeze(1))))
        return self.proj(self.act1(self.conv1(h)).transpose(1, 2))


def _fold_half(proto: onnx.ModelProto, factor: float = 0.5) -> onnx.ModelProto:
    """The first GELU's last Mul (by 0.5) removed, ``factor`` multiplied into the next Conv's weight."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    nodes, inits = list(proto.graph.node), {i.name: i for i in proto.graph.initializer}
    consts = {n.output[0]: n for n in nodes if n.op_type == "Constant"}
    conv = [n for n in nodes if n.op_type == "Conv"][1]
    half = next(n for n in nodes if n.op_type == "Mul" and conv.input[0] in n.output)
    scalar = next(i for i in half.input if i in consts or i in inits)
    value = numpy_helper.to_array(consts[scalar].attribute[0].t if scalar in consts else inits[scalar])
    assert np.allclose(value, 0.5), value
    kept = next(i for i in half.input if i != scalar)
    for n in nodes:
        n.input[:] = [kept if i == half.output[0] else i for i in n.input]
    proto.graph.node.remove(half)
    w = inits[conv.input[1]]
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * np.float32(factor), w.name))
    return proto


def _bisect(model, x, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto)


def test_a_scale_folded_into_the_next_convolution_is_no_divergence_and_no_warning():
    model, x = Extractor().eval(), torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    folded = _fold_half(dc.export(model, (x,), "torchscript"))
    report = _bisect(model, x, folded)
    assert report.ok and report.first_divergence is None and not report.warnings, report.warnings
    act0 = next(r for r in report.layers if r.pair.activation.module == "act0")
    assert act0.pair.tensor is None and "times one factor 2" in act0.pair.note, act0.pair.note
    assert not [r for r in report.layers if r.status.value == "diverged"]


def test_a_wrong_factor_there_is_still_the_first_divergence():
    """Folded as 0.6 instead of 0.5: the GELU's tensor holds exactly twice its value, as an Erf GELU's last ×0.5
    folded out leaves it (nothing scales it by a constant: no wrong constant there), so it is the fold's; the
    convolution that took the wrong factor is where the two disagree, and its weights are named."""
    model, x = Extractor().eval(), torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    folded = _fold_half(dc.export(model, (x,), "torchscript"), factor=0.6)
    report = _bisect(model, x, folded)
    fd = report.first_divergence
    assert not report.ok and fd is not None
    assert fd.layer.pair.activation.module == "conv1" and "/conv1/Conv" in fd.layer.segment, fd.layer.segment
    assert fd.cause == "weight-mismatch" and "conv1.weight" in fd.explanation, fd.explanation


def test_noise_in_the_convolution_a_gelu_was_folded_into_is_that_convolutions():
    """The fold is right (×0.5 into conv1) but conv1's weight is noisy: everything after it diverges, so no tensor
    downstream agrees to excuse the GELU's doubled value — its weights, holding a PyTorch weight's squares
    divided by 4, do; the first divergence is conv1, not the GELU (a SwiftFormer simplified by onnxsim)."""
    model, x = Extractor().eval(), torch.randn(2, 64, generator=torch.Generator().manual_seed(3))
    folded = _fold_half(dc.export(model, (x,), "torchscript"))
    conv = [n for n in folded.graph.node if n.op_type == "Conv"][1]
    init = next(i for i in folded.graph.initializer if i.name == conv.input[1])
    w = numpy_helper.to_array(init)
    noisy = w + 0.3 * w.std() * np.random.default_rng(1).standard_normal(w.shape).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(noisy, init.name))
    report = _bisect(model, x, folded)
    fd = report.first_divergence
    assert not report.ok and fd is not None and fd.layer.pair.activation.module == "conv1", \
        fd and fd.layer.pair.activation.module
    act0 = next(r for r in report.layers if r.pair.activation.module == "act0")
    assert act0.status.value == "fused", act0.status


class Decoder(torch.nn.Module):
    """SegFormer-like head: tokens reshaped to a map, upsampled, concatenated with a skip, a bias-free Conv and a
    BatchNorm the exporter folds into it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.proj = torch.nn.Linear(8, 8)
        self.fuse, self.bn = torch.nn.Conv2d(16, 8, 1, bias=False), torch.nn.BatchNorm2d(8)
        with torch.no_grad():
            self.bn.running_mean.normal_(0.0, 0.5)
            self.bn.running_var.uniform_(0.25, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)

    def forward(self, tokens, skip):
        x = self.proj(tokens).transpose(1, 2).reshape(1, 8, 4, 4)
        x = torch.nn.functional.interpolate(x, size=(8, 8), mode="bilinear", align_corners=False)
        return torch.relu(self.bn(self.fuse(torch.cat([x, skip], dim=1))))


def test_a_batchnorm_folded_after_a_fault_still_takes_the_convolutions_tensor():
    """A Reshape to a wrong shape upstream: the folded Conv's tensor is far from both the Conv's and the
    BatchNorm's value, so no value tells the fold. It is the BatchNorm's (it has no node of its own), not the
    Conv's — paired to the Conv, the fold looked like an error of its own and hid the Reshape."""
    model = Decoder().eval()
    g = torch.Generator().manual_seed(5)
    inputs = (torch.randn(1, 16, 8, generator=g), torch.randn(1, 8, 8, 8, generator=g))
    proto = dc.export(model, inputs, "torchscript")
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape")
    shape = numpy_helper.from_array(np.array([1, 8, 1, 16], np.int64), "planted_shape")
    proto.graph.initializer.append(shape)
    reshape.input[1] = "planted_shape"
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    fd = report.first_divergence
    assert not report.ok and reshape.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    rows = {r.pair.activation.module: r for r in report.layers}
    assert rows["fuse"].pair.tensor is None and rows["bn"].pair.tensor is not None


class GlobalStage(torch.nn.Module):
    """SwiftFormer's last stage on a 1×1 map: x + layer_scale · pw2(gelu(pw1(x))), layer scale per channel."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.stem = torch.nn.Conv2d(3, 16, 4, stride=4)
        self.pw1, self.act, self.pw2 = torch.nn.Conv2d(16, 32, 1), torch.nn.GELU(), torch.nn.Conv2d(32, 16, 1)
        self.layer_scale = torch.nn.Parameter(torch.rand(16, 1, 1) + 0.2)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):  # (1, 3, 4, 4): a 1×1 map after the stem
        h = self.stem(x)
        h = h + self.layer_scale * self.pw2(self.act(self.pw1(h)))
        return self.head(h.flatten(1))


def _fold_layer_scale(proto: onnx.ModelProto) -> onnx.ModelProto:
    """As onnx-simplifier does: the Mul by the layer scale removed, the scale multiplied into pw2's weight and
    bias per output channel."""
    proto = onnx.ModelProto.FromString(proto.SerializeToString())
    nodes, inits = list(proto.graph.node), {i.name: i for i in proto.graph.initializer}
    conv = [n for n in nodes if n.op_type == "Conv"][-1]
    mul = next(n for n in nodes if n.op_type == "Mul" and conv.output[0] in n.input)
    scale_name = next(i for i in mul.input if i in inits)
    scale = numpy_helper.to_array(inits[scale_name]).reshape(-1)
    for k, shape in ((1, (-1, 1, 1, 1)), (2, (-1,))):
        init = inits[conv.input[k]]
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * scale.reshape(shape), init.name))
    for n in nodes:
        n.input[:] = [conv.output[0] if i == mul.output[0] else i for i in n.input]
    proto.graph.node.remove(mul)
    return proto


def test_a_layer_scale_folded_into_a_convolution_on_a_one_by_one_map_is_no_divergence():
    """One value per channel: any per-channel factors fit, so no fit tells the fold; the residual sum after it
    agreeing within float noise does (a clean SwiftFormer simplified by onnxsim warned of four layers)."""
    model = GlobalStage().eval()
    x = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    proto = _fold_layer_scale(dc.export(model, (x,), "torchscript"))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status == "diverged"]


def test_noise_in_that_convolution_is_still_its_divergence():
    model = GlobalStage().eval()
    x = torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(5))
    proto = _fold_layer_scale(dc.export(model, (x,), "torchscript"))
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][-1]
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    w = numpy_helper.to_array(init)
    noisy = w + 0.3 * w.std() * np.random.default_rng(0).standard_normal(w.shape).astype(w.dtype)
    init.CopyFrom(numpy_helper.from_array(noisy, init.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert not report.ok and fd is not None and conv.name in fd.layer.segment and len(fd.layer.segment) <= 3, \
        fd and fd.layer.segment
