"""Faults of an op's kind and operands: the wrong member of a family (LogSoftmax for Softmax, a sum for a mean, a
max pool for an average one, a strict comparison for a non-strict one), operands the other way round, a Pow's
exponent, a Conv's dilation, a norm's scale and bias exchanged, an integer offset — each named at its node and
confirmed by re-running the segment with the op that reproduces PyTorch."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from torch.nn import functional as F

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found, planted as _planted  # noqa: E402


class _KindsNet(torch.nn.Module):
    """A 3-tap Conv1d, GroupNorm, max + average pools that pad (the average not counting the padding), a
    hand-written layer norm (mean, Sub, Pow, Sqrt, Div), token positions offset by one into an embedding, a
    mask from comparing token ids (a tie on the diagonal), softmax attention and a classifier."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.conv, self.norm = torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.GroupNorm(2, 8)
        self.pos, self.fc = torch.nn.Embedding(16, 8), torch.nn.Linear(8, 3)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x, ids):  # (2, 4, 6) float, (2, 6) int64
        h = self.norm(self.conv(x))
        h = F.max_pool1d(h, 3, 1, 1) - 2.0 * F.avg_pool1d(h, 3, 1, 1, count_include_pad=False)
        t = h.transpose(1, 2) + self.pos(ids + 1)
        d = t - t.mean(-1, keepdim=True)
        t = d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5)
        scores = (t @ t.transpose(1, 2)).masked_fill(ids[:, :, None] < ids[:, None, :], -1e4)
        return self.fc(torch.softmax(scores, -1) @ t)


def _inputs():
    g = torch.Generator().manual_seed(6)
    return torch.randn(2, 4, 6, generator=g), torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])


@pytest.fixture(scope="module")
def exported():
    model, inputs = _KindsNet().eval(), _inputs()
    return model, inputs, dc.export(model, inputs, "torchscript")


def _retype(op_type: str):
    def change(proto, node):
        node.op_type = op_type
    return change


def test_clean_file_agrees(exported):
    model, inputs, proto = exported
    assert onnx_bisect.bisect(model, inputs, onnx=proto).ok


@pytest.mark.parametrize("op, planted_as", [("Softmax", "LogSoftmax"), ("ReduceMean", "ReduceMax"),
                                            ("Less", "LessOrEqual")])
def test_another_member_of_the_ops_family_is_named(exported, op, planted_as):
    fd, name = _planted(exported, op, _retype(planted_as))
    ev = _found(fd, name)
    assert f"{planted_as}" in fd.explanation and op in fd.explanation, fd.explanation
    assert ev


def test_a_sum_for_a_mean_is_named_with_its_axes_moved_to_the_form_the_opset_wants(exported):
    """ReduceSum takes its axes as an input at opset 17, ReduceMean as an attribute: the fault moves them, and
    the alternative moves them back."""
    def change(proto, node):
        axes = next(a for a in node.attribute if a.name == "axes")
        proto.graph.initializer.append(numpy_helper.from_array(np.array(axes.ints, np.int64), f"{node.name}_axes"))
        node.op_type = "ReduceSum"
        node.attribute.remove(axes)
        node.input.append(f"{node.name}_axes")
    fd, name = _planted(exported, "ReduceMean", change)
    _found(fd, name)
    assert "ReduceMean" in fd.explanation


def test_operands_the_other_way_round_are_named(exported):
    """The layer norm's ``t - mean`` computed as ``mean - t``."""
    def change(proto, node):
        node.input[0], node.input[1] = node.input[1], node.input[0]
    constants = {i.name for i in exported[2].graph.initializer}
    fd, name = _planted(exported, "Sub", change, pick=lambda nodes: next(
        n for n in nodes if not constants & set(n.input)))
    _found(fd, name)


def test_a_pow_exponent_is_found_among_the_usual_ones(exported):
    def change(proto, node):
        proto.graph.initializer.append(numpy_helper.from_array(np.array(3.0, np.float32), "pow_planted"))
        node.input[1] = "pow_planted"
    fd, name = _planted(exported, "Pow", change)
    _found(fd, name)
    assert "2" in fd.explanation


def test_an_average_pool_counting_its_padding_is_named(exported):
    def change(proto, node):
        keep = [a for a in node.attribute if a.name != "count_include_pad"]
        del node.attribute[:]
        node.attribute.extend(keep + [helper.make_attribute("count_include_pad", 1)])
    fd, name = _planted(exported, "AveragePool", change)
    _found(fd, name)
    assert "count_include_pad" in fd.explanation


def test_a_max_pool_for_an_average_one_is_named(exported):
    def change(proto, node):
        node.op_type = "MaxPool"
        keep = [a for a in node.attribute if a.name != "count_include_pad"]
        del node.attribute[:]
        node.attribute.extend(keep)
    fd, name = _planted(exported, "AveragePool", change)
    _found(fd, name)


def test_a_dilated_conv_is_named_with_its_padding(exported):
    def change(proto, node):
        for a in node.attribute:
            if a.name == "dilations":
                a.ints[:] = [2]
            if a.name == "pads":
                a.ints[:] = [2, 2]
    fd, name = _planted(exported, "Conv", change)
    _found(fd, name)
    assert "dilations" in fd.explanation


def test_an_integer_offset_one_off_is_named(exported):
    """``ids + 1`` into the position table: the constant 2 instead of 1 shifts every position."""
    def change(proto, node):
        const = next(i for i in node.input if any(c.name == i for c in proto.graph.initializer)
                     or any(n.op_type == "Constant" and n.output[0] == i for n in proto.graph.node))
        proto.graph.initializer.append(numpy_helper.from_array(np.array(2, np.int64), "offset_planted"))
        node.input[list(node.input).index(const)] = "offset_planted"
    ids = exported[2].graph.input[1].name
    fd, name = _planted(exported, "Add", change, pick=lambda nodes: next(n for n in nodes if ids in n.input))
    _found(fd, name)


class _CentredNorm(torch.nn.Module):
    """A layer norm written by hand (Cohere's): mean, x − mean, its square's mean, a Sqrt, a Div, a weight."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(d) + 0.5)

    def forward(self, x):
        d = x - x.mean(-1, keepdim=True)
        return self.weight * d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5)


class _NormedBlocks(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.inp = torch.nn.Linear(8, 16)
        self.norms = torch.nn.ModuleList(_CentredNorm(16) for _ in range(2))
        self.fcs = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(2))

    def forward(self, x):
        h = self.inp(x)
        for norm, fc in zip(self.norms, self.fcs):
            h = h + torch.tanh(fc(norm(h)))
        return h


def test_a_fault_in_a_hand_written_norms_statistics_is_found_in_a_renamed_file(tmp_path):
    """Every node and tensor renamed: a Pow's exponent 2 → 3 inside the first norm's variance.  Loosely paired,
    the norm's value lay nearest to ``x - mean`` (the fault is in the spread it divides by), which put the
    segment after the fault; a normalization's output is only taken from a tensor divided by a spread."""
    import fault_sweep

    model, x = _NormedBlocks().eval(), torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(8))
    onnx_file = tmp_path / "clean.onnx"
    onnx.save(dc.export(model, (x,), "dynamo"), onnx_file)
    fault_sweep.rename(onnx_file, tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    pow_node = next(n for n in proto.graph.node if n.op_type == "Pow")
    proto.graph.initializer.append(numpy_helper.from_array(np.array(3.0, np.float32), "pow_planted"))
    pow_node.input[1] = "pow_planted"
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    _found(report.first_divergence, pow_node.name)


class _Scan(torch.nn.Module):
    """A recurrence unrolled over 8 steps whose states are stacked (Mamba's selective scan), then a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.a, self.out = torch.nn.Parameter(torch.rand(6) * 0.5 + 0.4), torch.nn.Linear(6, 3)

    def forward(self, x):  # (2, 8, 6)
        h, states = torch.zeros_like(x[:, 0]), []
        for t in range(x.shape[1]):
            h = self.a * h + x[:, t]
            states.append(h)
        return self.out(torch.stack(states, dim=1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_two_steps_of_a_long_stack_exchanged_are_named_at_the_concat(exporter):
    """Inputs 2 and 6 of the 8-input Concat exchanged: no pair among the first six is tried, so the order is fitted
    to PyTorch's output piece by piece; the segment is the Concat, not the Concat and its eight Unsqueezes."""
    model, x = _Scan().eval(), torch.randn(2, 8, 6, generator=torch.Generator().manual_seed(12))
    proto = dc.export(model, (x,), exporter)
    concat = next(n for n in proto.graph.node if n.op_type == "Concat" and len(n.input) == 8)
    concat.input[2], concat.input[6] = concat.input[6], concat.input[2]
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    _found(fd, concat.name, at_most=1)
    assert "input order" in fd.explanation, fd.explanation


class _SoftCap(torch.nn.Module):
    """Gemma 2's soft-capping: scores times a scale, divided by the cap, tanh, times the cap."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.q, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        s = self.q(x) * 0.35355339
        return self.out(torch.tanh(s / 5.0) * 5.0)


def test_a_divisor_that_computes_the_divergent_tensor_wins_over_a_search_on_the_scale_before_it():
    """Float16: neither op's value pairs at float noise, so the segment holds the Mul by the scale and the Div by
    the cap; ``x·a/b`` is fixed by either constant.  The divisor, fitted where the error shows, is named (at 5,
    the simple number near its fit), not the scale a search finds ×1.5."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rewrites

    model, x = _SoftCap().eval(), torch.randn(4, 6, 8, generator=torch.Generator().manual_seed(14)) * 4
    proto = rewrites.to_float16(dc.export(model, (x,), "torchscript"))
    div = next(n for n in proto.graph.node if n.op_type == "Div")
    k = next(i for i, t in enumerate(div.input) if t != div.input[0])
    proto.graph.initializer.append(numpy_helper.from_array(np.array(7.5, np.float16), "cap_planted"))
    div.input[k] = "cap_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto, atol=1e-2, rtol=1e-2).first_divergence
    _found(fd, div.name)
    assert "implies 5.0" in fd.explanation and div.name in fd.explanation.split("=")[0], fd.explanation



def test_a_view_before_a_conv_with_its_batchnorm_folded_is_named():
    """CvT (the fault sweep's) simplified by onnx-simplifier: a key projection's Reshape of tokens to an image
    made (1, 24, 2, 8) instead of (1, 24, 4, 4).  The divergent tensor, the Conv after it, is aligned with the
    convolution but carries the BatchNorm after it folded: the fix reproduces the BatchNorm's output."""
    import onnxsim
    import sweep_models

    model, inputs = sweep_models.build("cvt")
    proto, _ = onnxsim.simplify(dc.export(model, inputs, "torchscript"))
    reshape = next(n for n in proto.graph.node if n.name == "/model/encoder/stages.1/layers.1/attention/attention/"
                   "Reshape")
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1, 24, 2, 8], np.int64), "shape_planted"))
    reshape.input[1] = "shape_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, reshape.name)
    assert "[1, 24, 4, 4]" in fd.explanation and "BatchNorm" in fd.explanation, fd.explanation


class _AdaIN(torch.nn.Module):
    """Instance statistics written by hand (no norm module): ``(var + 1e-5).sqrt()``, content normalised and
    given the style's statistics."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(17)
        self.enc, self.dec = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 3, 3, padding=1)

    def forward(self, content, style):
        fc, fs = self.enc(content), self.enc(style)
        mc, sc = fc.mean((2, 3), keepdim=True), (fc.var((2, 3), keepdim=True) + 1e-5).sqrt()
        ms, ss = fs.mean((2, 3), keepdim=True), (fs.var((2, 3), keepdim=True) + 1e-5).sqrt()
        return self.dec((fc - mc) / sc * ss + ms)


def test_an_epsilon_added_by_hand_before_a_square_root_is_an_epsilon_mismatch():
    """No module has an ``eps``: the epsilon is the small float PyTorch's ``aten.add`` added before the root."""
    g = torch.Generator().manual_seed(18)
    model, inputs = _AdaIN().eval(), (torch.randn(1, 3, 8, 8, generator=g) * 0.1, torch.randn(1, 3, 8, 8, generator=g))
    proto = dc.export(model, inputs, "torchscript")
    add = next(n for n in proto.graph.node if n.op_type == "Add" and any(
        c.op_type == "Sqrt" for c in proto.graph.node if n.output[0] in c.input))
    k = next(i for i, t in enumerate(add.input) if any(c.output[0] == t and c.op_type == "Constant"
                                                         for c in proto.graph.node))
    proto.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "eps_planted"))
    add.input[k] = "eps_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, add.name, cause="epsilon-mismatch")
    assert "1e-05" in fd.explanation, fd.explanation


class _SingletonSum(torch.nn.Module):
    """MobileViT-V2's context vector: a sum over a trailing axis of size 1, times the values."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(21)
        self.key, self.value, self.out = torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(8, 8, 1), torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):  # (1, 8, 5, 1)
        context = (self.key(x) * torch.softmax(x[:, :1], dim=2)).sum(-1, keepdim=True)
        return self.out(torch.relu(self.value(x)) * context)


def test_a_sum_over_a_singleton_axis_made_over_channels_is_named_with_pytorchs_dims():
    """ReduceSum over axis 3 (size 1: a no-op) made over axis 1 (the channels, broadcast back): the axes
    PyTorch's sum ran over are tried first, and a singleton axis at all."""
    model, x = _SingletonSum().eval(), torch.randn(1, 8, 5, 1, generator=torch.Generator().manual_seed(22))
    proto = dc.export(model, (x,), "dynamo")
    node = next(n for n in proto.graph.node if n.op_type == "ReduceSum")
    proto.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "axes_planted"))
    node.input[1] = "axes_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    [row] = _found(fd, node.name)["attributes"]
    assert (row["attribute"], row["expected"]) == ("axes", [3]), row



def test_a_mean_made_a_sum_is_named_though_a_scalar_after_it_absorbs_the_scale():
    """Mamba (the fault sweep's, TorchScript): its last RMSNorm's ReduceMean made a ReduceSum multiplies the
    variance by 32; the narrowing stops at the Div computing rsqrt (1 / Sqrt), whose numerator fitted to √32
    undoes that.  A discrete alternative that reproduces PyTorch wins over a fitted scalar."""
    import sweep_models

    model, inputs = sweep_models.build("mamba")
    proto = dc.export(model, inputs, "torchscript")
    node = next(n for n in proto.graph.node if n.name == "/model/norm_f/ReduceMean")
    node.op_type = "ReduceSum"
    axes = next(a for a in node.attribute if a.name == "axes")
    proto.graph.initializer.append(numpy_helper.from_array(np.array(axes.ints, np.int64), "axes_planted"))
    node.attribute.remove(axes)
    node.input.append("axes_planted")
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, node.name)
    assert "ReduceMean" in fd.explanation, fd.explanation
