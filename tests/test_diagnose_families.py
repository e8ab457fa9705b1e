"""Faults the seventh sweep planted (scripts/sweep_faults_seven.py), each named at its node with a confirmed fix:
an arithmetic op computing its inverse (a sign lost), another activation of the family (a hard sigmoid, a leaky
rectifier, a PReLU's slope lost), a LayerNorm computed as an RMSNorm, a norm's scale off by one (``1 + weight``
lost, a non-parametric norm given a scale), an RNN's gate blocks in another order or its direction reversed, a convolution kernel flipped."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch.nn import functional as F

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found, planted as _planted  # noqa: E402
from fault_sweep import rename  # noqa: E402


class _FamiliesNet(torch.nn.Module):
    """A Conv with a BatchNorm (folded into it at export) and a PReLU, a sigmoid gate, a rotary-like sum of two products, a LayerNorm, a norm without
    weights, a norm scaled by ``1 + weight`` (Nemotron's LayerNorm1P), a GRU and a tanh head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.conv, self.bn, self.act = torch.nn.Conv1d(4, 8, 3, padding=1), torch.nn.BatchNorm1d(8), torch.nn.PReLU(8)
        self.gate, self.norm = torch.nn.Linear(8, 8), torch.nn.LayerNorm(8)
        self.w1p = torch.nn.Parameter(torch.randn(8) * 0.3)
        self.gru, self.fc = torch.nn.GRU(8, 8, batch_first=True), torch.nn.Linear(8, 3)
        with torch.no_grad():
            self.act.weight.uniform_(0.1, 0.4)
            self.bn.running_mean.normal_(0.0, 0.3)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x):  # (2, 4, 6)
        h = self.act(self.bn(self.conv(x))).transpose(1, 2)
        h = h * torch.sigmoid(self.gate(h))
        cos, sin = torch.cos(h), torch.sin(h)
        h = self.norm(h * cos + h.flip(-1) * sin)
        h = F.layer_norm(h, (8,)) + 0.5 * F.layer_norm(h, (8,), 1 + self.w1p)
        out, _ = self.gru(h)
        return torch.tanh(self.fc(out))


@pytest.fixture(scope="module")
def exported():
    model = _FamiliesNet().eval()
    inputs = (torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(8)),)
    return model, inputs, dc.export(model, inputs, "torchscript")


def _retype(op_type: str, **attrs):
    def change(proto, node):
        node.op_type = op_type
        del node.attribute[:]
        for k, v in attrs.items():
            node.attribute.add().CopyFrom(onnx.helper.make_attribute(k, v))
    return change


def _computed(proto):
    constants = {i.name for i in proto.graph.initializer} | {o for n in proto.graph.node if n.op_type == "Constant"
                                                            for o in n.output}
    return lambda nodes: next(n for n in nodes if not constants & set(n.input))


def test_clean_file_agrees(exported):
    model, inputs, proto = exported
    assert onnx_bisect.bisect(model, inputs, onnx=proto).ok


def test_an_add_computing_a_sub_is_named(exported):
    """The rotary-like ``h·cos + flip(h)·sin`` with its sign lost."""
    fd, name = _planted(exported, "Add", _retype("Sub"), pick=_computed(exported[2]))
    _found(fd, name)
    assert "Sub" in fd.explanation and "Add" in fd.explanation


def test_a_hard_sigmoid_for_a_sigmoid_is_named(exported):
    fd, name = _planted(exported, "Sigmoid", _retype("HardSigmoid", alpha=1 / 6, beta=0.5))
    _found(fd, name)
    assert "Sigmoid" in fd.explanation


def test_a_prelu_that_lost_its_slope_is_named_with_the_modules_weight(exported):
    def change(proto, node):
        node.op_type = "Relu"
        del node.input[1:]
    fd, name = _planted(exported, "PRelu", change)
    _found(fd, name)
    assert "PRelu" in fd.explanation


def test_a_layer_norm_computed_as_an_rms_norm_is_named_with_its_bias_back(exported):
    def change(proto, node):
        node.op_type = "SimplifiedLayerNormalization"
        del node.input[2:]
        del node.output[1:]
    fd, name = _planted(exported, "LayerNormalization", change)
    _found(fd, name)
    assert "SimplifiedLayerNormalization" in fd.explanation


def _constant(proto, name: str) -> np.ndarray:
    init = next((i for i in proto.graph.initializer if i.name == name), None)
    if init is not None:
        return numpy_helper.to_array(init)
    const = next(n for n in proto.graph.node if n.op_type == "Constant" and n.output[0] == name)
    return numpy_helper.to_array(const.attribute[0].t)


@pytest.mark.parametrize("which, step", [(1, 1.0), (2, -1.0), (2, 1.0)])
def test_a_norm_scale_off_by_one_is_a_weight_mismatch(exported, which, step):
    """Norm 1 has no weight in PyTorch (the file's scale is ones), norm 2 multiplies by ``1 + weight``: a scale
    of ``weight`` alone holds a parameter's exact numbers, so nothing else differs.  (Norm 1's scale made zeros
    is left out: its output is then zeros and the Add after it passes the other term on unchanged, so that
    term's PyTorch value pairs with the sum — a value-pairing ambiguity, not this rule's.)"""
    def change(proto, node):
        value = _constant(proto, node.input[1])
        proto.graph.initializer.append(numpy_helper.from_array((value + step).astype(value.dtype), "scale_planted"))
        node.input[1] = "scale_planted"
    fd, name = _planted(exported, "LayerNormalization", change, pick=lambda nodes: nodes[which])
    _found(fd, name, "weight-mismatch")
    assert "off by one" in fd.explanation


def test_gru_gate_blocks_in_another_order_are_a_weight_mismatch(exported):
    def change(proto, node):
        for k in (1, 2):
            init = next(i for i in proto.graph.initializer if i.name == node.input[k])
            v = numpy_helper.to_array(init)
            z, r, h = np.split(v, 3, axis=1)
            init.CopyFrom(numpy_helper.from_array(np.concatenate([r, z, h], axis=1), init.name))
    fd, name = _planted(exported, "GRU", change)
    _found(fd, name, "weight-mismatch", at_most=12)


def test_a_gru_run_the_other_way_is_named(exported):
    def change(proto, node):
        node.attribute.add().CopyFrom(onnx.helper.make_attribute("direction", "reverse"))
    fd, name = _planted(exported, "GRU", change)
    _found(fd, name, at_most=12)
    assert "reverse" in fd.explanation


def test_a_flipped_folded_kernel_is_a_weight_mismatch(exported):
    """The Conv's kernel (its BatchNorm folded in: no PyTorch parameter holds its numbers) flipped in time."""
    def change(proto, node):
        init = next(i for i in proto.graph.initializer if i.name == node.input[1])
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(numpy_helper.to_array(init)[..., ::-1]), init.name))
    fd, name = _planted(exported, "Conv", change)
    _found(fd, name, "weight-mismatch")
    assert "flipped" in fd.explanation


class _RMSNormNet(torch.nn.Module):
    """A Linear, then a hand-written RMSNorm (x.pow(2).mean, rsqrt) with a weight, then a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.up, self.w, self.down = torch.nn.Linear(8, 8), torch.nn.Parameter(torch.rand(8) + 0.5), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.up(x) + x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.w
        return self.down(h)


def test_a_pow_made_an_identity_inside_a_segment_is_where_the_narrowed_divergence_starts(tmp_path):
    """Exponent 2 made 1: the Pow's output holds the residual sum's value exactly, which PyTorch has too, so
    the op-level pairing took it as good and began the divergence at the mean after it.  No PyTorch op after
    the sum holds that value: the Pow computed nothing where PyTorch's did."""
    model = _RMSNormNet().eval()
    x = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(12))
    proto = dc.export(model, (x,), "dynamo")
    node = next(n for n in proto.graph.node if n.op_type == "Pow")
    proto.graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "exponent_planted"))
    node.input[1] = "exponent_planted"
    onnx.save(proto, tmp_path / "bad.onnx")
    rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")  # no scopes: one segment, narrowed by values
    renamed = onnx.load(tmp_path / "renamed.onnx")
    planted = next(n.name for n in renamed.graph.node if n.op_type == "Pow")
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=renamed).first_divergence
    _found(fd, planted)
    assert "aten.pow" in fd.layer.pair.activation.name, fd.layer.pair.activation.name  # not the sum before it


class _MHANet(torch.nn.Module):
    """nn.MultiheadAttention (batch first, no weights returned: its eval-mode fast path, one fused ATen op)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.attn, self.out = torch.nn.MultiheadAttention(16, 2, batch_first=True), torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.out(self.attn(x, x, x, need_weights=False)[0])


def test_a_reshape_inside_multihead_attention_is_narrowed_to_its_node():
    """In eval mode PyTorch computes nn.MultiheadAttention as one ``_native_multi_head_attention`` op, so no op
    inside it could pair with the exported Reshapes and MatMuls: the segment was the whole attention (40-odd
    nodes).  The op-level capture runs it off the fast path, on the ops an exporter traces."""
    model = _MHANet().eval()
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(14))
    proto = dc.export(model, (x,), "torchscript")
    consts = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    node = next(n for n in proto.graph.node if n.op_type == "Reshape" and n.input[1] in consts
                and list(numpy_helper.to_array(consts[n.input[1]].attribute[0].t)) == [6, 4, 8])
    proto.graph.initializer.append(numpy_helper.from_array(np.array([6, 8, 4], np.int64), "shape_planted"))
    node.input[1] = "shape_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    _found(fd, node.name)


def test_a_prelu_that_lost_its_slope_in_a_renamed_file_is_named_with_a_prelu_of_the_model(exported, tmp_path):
    """No node names a module: the PReLU is looked for among the model's (its size fits the channels)."""
    model, inputs, proto = exported
    faulty = type(proto)()
    faulty.CopyFrom(proto)
    node = next(n for n in faulty.graph.node if n.op_type == "PRelu")
    node.op_type = "Relu"
    del node.input[1:]
    onnx.save(faulty, tmp_path / "bad.onnx")
    rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    planted = next(n.name for n in renamed.graph.node if n.op_type == "Relu")
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=renamed).first_divergence
    _found(fd, planted)
    assert "act.weight" in fd.explanation, fd.explanation


class _ConstantBiasNet(torch.nn.Module):
    """Two Linears whose biases are initialised to one constant (Hiera's 0.02): the exporter keeps one
    initializer for the equal biases."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(15)
        self.fc1, self.fc2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        for fc in (self.fc1, self.fc2):
            torch.nn.init.constant_(fc.bias, 0.02)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def test_a_stale_copy_of_a_constant_bias_is_a_weight_mismatch():
    """A bias of one number repeated correlates with nothing, so a stale copy of it (noise and a shift) paired
    with no parameter and the cause was unknown; near it in relative L2, it is the same tensor changed."""
    model = _ConstantBiasNet().eval()
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(16))
    proto = dc.export(model, (x,), "dynamo")
    add = [n for n in proto.graph.node if n.op_type in ("Add", "Gemm")][-1]
    k = next(i for i, t in enumerate(add.input) if t in {i.name for i in proto.graph.initializer}
             and len(numpy_helper.to_array(next(j for j in proto.graph.initializer if j.name == t)).shape) == 1)
    stale = 0.02 + 0.01 + 0.003 * np.random.default_rng(3).standard_normal(8)
    proto.graph.initializer.append(numpy_helper.from_array(stale.astype(np.float32), "bias_stale"))
    add.input[k] = "bias_stale"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    _found(fd, add.name, "weight-mismatch")
