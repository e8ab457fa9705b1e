"""Faults the ninth sweep planted (scripts/sweep_faults_nine.py), each named at its node with the attribute that
reproduces PyTorch: a cumulative sum made exclusive or reversed (position ids), a causal mask's diagonal one off,
PixelShuffle's DepthToSpace in the other layout, a bicubic Resize with another kernel coefficient."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


def _set(proto: onnx.ModelProto, op_type: str, **attrs) -> str:
    node = next(n for n in proto.graph.node if n.op_type == op_type)
    for name, value in attrs.items():
        for a in list(node.attribute):
            if a.name == name:
                node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(name, value))
    return node.name


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Positions(torch.nn.Module):
    """Position ids counted over the non-padding tokens (RoBERTa's cumsum), embedded with the tokens."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(61)
        self.tokens, self.positions = torch.nn.Embedding(32, 8), torch.nn.Embedding(20, 8)
        self.head = torch.nn.Linear(8, 4)

    def forward(self, ids):
        mask = ids.ne(1).int()
        pos = torch.cumsum(mask, dim=1) * mask + 1
        return self.head(self.tokens(ids) + self.positions(pos))


@pytest.mark.parametrize("flag", ["exclusive", "reverse"])
def test_a_cumulative_sum_made_exclusive_or_reversed_is_named(flag):
    model = _Positions().eval()
    inputs = (torch.tensor([[5, 7, 9, 3, 1, 1]]),)
    proto = dc.export(model, inputs, "torchscript")
    name = _set(proto, "CumSum", **{flag: 1})
    evidence = _found(_bisect(model, inputs, proto), name)
    assert evidence["attributes"][0]["attribute"] == flag, evidence


class _Causal(torch.nn.Module):
    """Scores masked to the lower triangle, the mask made at run time from the sequence length."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(62)
        self.qk, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(8, 4)

    def forward(self, x):  # (1, 5, 8)
        q, k = self.qk(x).split(8, dim=-1)
        n = x.shape[1]
        mask = torch.tril(torch.ones(n, n))
        scores = (q @ k.transpose(1, 2)).masked_fill(mask == 0, -1e4)
        return self.out(torch.softmax(scores, dim=-1) @ x)


def test_a_causal_mask_one_diagonal_off_is_named():
    model = _Causal().eval()
    inputs = (torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(63)),)
    proto = dc.export(model, inputs, "torchscript")
    trilu = next(n for n in proto.graph.node if n.op_type == "Trilu")  # TorchScript keeps the mask's Trilu
    k = numpy_helper.from_array(np.array(1, np.int64), "k_planted")
    proto.graph.initializer.append(k)
    del trilu.input[1:]
    trilu.input.append("k_planted")
    fd = _bisect(model, inputs, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert trilu.name in fd.layer.segment and len(fd.layer.segment) <= 4, fd.layer.segment


class _Shuffle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(64)
        self.conv, self.shuffle, self.out = torch.nn.Conv2d(3, 12, 3, padding=1), torch.nn.PixelShuffle(2), \
            torch.nn.Conv2d(3, 2, 3, padding=1)

    def forward(self, x):
        return self.out(self.shuffle(self.conv(x)))


def test_pixel_shuffle_in_the_other_depth_to_space_layout_is_named():
    model = _Shuffle().eval()
    inputs = (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(65)),)
    proto = dc.export(model, inputs, "torchscript")
    node = next(n for n in proto.graph.node if n.op_type == "DepthToSpace")
    mode = next((a.s.decode() for a in node.attribute if a.name == "mode"), "DCR")
    name = _set(proto, "DepthToSpace", mode="DCR" if mode == "CRD" else "CRD")
    evidence = _found(_bisect(model, inputs, proto), name)
    assert evidence["attributes"][0]["expected"] == mode, evidence


class _Bicubic(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(66)
        self.conv, self.out = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        return self.out(torch.nn.functional.interpolate(self.conv(x), scale_factor=2, mode="bicubic"))


def test_a_bicubic_resize_with_another_kernel_coefficient_is_a_resize_mode():
    model = _Bicubic().eval()
    inputs = (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(67)),)
    proto = dc.export(model, inputs, "torchscript")
    name = _set(proto, "Resize", cubic_coeff_a=-0.5)
    evidence = _found(_bisect(model, inputs, proto), name, cause="resize-mode")
    assert evidence["onnx_config"]["cubic_coeff_a"] == -0.5 and evidence["matching_config"]["cubic_coeff_a"] == -0.75


class _HardSwishHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(68)
        self.fc, self.act, self.out = torch.nn.Linear(8, 16), torch.nn.Hardswish(), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(self.act(self.fc(x) * 4))


def test_an_activation_swapped_for_another_family_s_is_restored_as_the_module_s_op():
    """A HardSwish exported as a HardSigmoid (no family holds both): the activation module next to it says what
    PyTorch computes, and its op reproduces PyTorch."""
    model = _HardSwishHead().eval()
    inputs = (torch.randn(2, 8, generator=torch.Generator().manual_seed(69)),)
    proto = dc.export(model, inputs, "torchscript")
    node = next(n for n in proto.graph.node if n.op_type == "HardSwish")
    node.op_type = "HardSigmoid"
    evidence = _found(_bisect(model, inputs, proto), node.name)
    assert evidence["attributes"][0]["expected"] == "HardSwish", evidence


def test_a_node_without_a_name_is_named_and_its_alternative_applied(tmp_path):
    """ONNX Runtime's optimizer leaves some nodes unnamed: the tool names them ``<op>_<position>`` in its own copy
    (the user's file untouched), and an alternative finds the node it edits by that name."""
    model = _HardSwishHead().eval()
    inputs = (torch.randn(2, 8, generator=torch.Generator().manual_seed(69)),)
    proto = dc.export(model, inputs, "torchscript")
    for n in proto.graph.node:
        n.name = ""
    i, node = next((i, n) for i, n in enumerate(proto.graph.node) if n.op_type == "HardSwish")
    node.op_type = "HardSigmoid"
    path = tmp_path / "unnamed.onnx"
    onnx.save(proto, path)
    before = path.read_bytes()
    fd = _bisect(model, inputs, str(path))
    assert fd is not None and fd.layer.segment == (f"HardSigmoid_{i}",), fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert path.read_bytes() == before


class _Vocoder(torch.nn.Module):
    """HiFi-GAN's residual units: a functional ``leaky_relu(x, 0.1)`` (no module holds its slope) before each Conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(70)
        self.convs = torch.nn.ModuleList(torch.nn.Conv1d(4, 4, 3, padding=1) for _ in range(2))

    def forward(self, x):
        for conv in self.convs:
            x = x + conv(torch.nn.functional.leaky_relu(x, 0.1))
        return x


@pytest.mark.parametrize("fault", ["slope", "kind"])
def test_a_functional_leaky_relu_is_judged_by_the_slope_pytorch_s_op_ran_with(fault):
    model = _Vocoder().eval()
    inputs = (torch.randn(1, 4, 12, generator=torch.Generator().manual_seed(71)),)
    proto = dc.export(model, inputs, "torchscript")
    node = [n for n in proto.graph.node if n.op_type == "LeakyRelu"][1]
    if fault == "slope":
        for a in node.attribute:
            if a.name == "alpha":
                a.f = 0.2
    else:
        node.op_type = "Relu"
        del node.attribute[:]
    fd = _bisect(model, inputs, proto)
    assert fd is not None and node.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd and fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and "0.1" in fd.explanation, fd.explanation


class _RootNorm(torch.nn.Module):
    """Hand-written statistics: ``x / sqrt(mean(x²) + eps)`` (RMS), or ``(x - mean) / (std + eps)`` (``after``)."""

    def __init__(self, after: bool, rsqrt: bool = False):
        super().__init__()
        torch.manual_seed(64)
        self.after, self.eps, self.rsqrt = after, 1e-5, rsqrt
        self.inp, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.inp(x) * 0.01  # small statistics: where an epsilon matters
        if self.after:
            c = h - h.mean(-1, keepdim=True)
            return self.out(c / (torch.sqrt(c.pow(2).mean(-1, keepdim=True)) + self.eps))
        if self.rsqrt:  # exported as a Sqrt and a Reciprocal
            return self.out(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))
        return self.out(h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + self.eps))


def _swap_root_and_add(proto: onnx.ModelProto) -> str:
    """``sqrt(v + eps)`` ↔ ``sqrt(v) + eps`` in place (the Add and the Sqrt exchange places); the Add's name."""
    nodes = list(proto.graph.node)
    sqrt = next(n for n in nodes if n.op_type == "Sqrt")
    made = {o: n for n in nodes for o in n.output}
    before = made.get(sqrt.input[0])
    if before is not None and before.op_type == "Add":  # v + eps → sqrt: make sqrt(v) + eps
        add = before
        k = next(i for i, t in enumerate(add.input) if t not in made or made[t].op_type == "Constant")
        value, result = add.input[1 - k], sqrt.output[0]
        sqrt.input[0], sqrt.output[0] = value, "rooted_first"
        add.input[1 - k], add.output[0] = "rooted_first", result
        first, second = sqrt, add
    else:  # sqrt(v) + eps: make sqrt(v + eps)
        add = next(n for n in nodes if n.op_type == "Add" and sqrt.output[0] in n.input)
        k = 1 - list(add.input).index(sqrt.output[0])
        value, result = sqrt.input[0], add.output[0]
        add.input[1 - k], add.output[0] = value, "summed_first"
        sqrt.input[0], sqrt.output[0] = "summed_first", result
        first, second = add, sqrt
    kept = [n for n in nodes if n.name not in (first.name, second.name)]
    at = max(i for i, n in enumerate(nodes) if n.name in (first.name, second.name))  # after both's inputs
    at = sum(1 for n in nodes[:at] if n.name not in (first.name, second.name))
    ordered = kept[:at] + [first, second] + kept[at:]
    copies = [onnx.NodeProto() for _ in ordered]
    for new, old in zip(copies, ordered):
        new.CopyFrom(old)
    proto.graph.ClearField("node")
    proto.graph.node.extend(copies)
    return add.name


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("after", [False, True], ids=["pytorch-adds-before-root", "pytorch-adds-after-root"])
def test_an_epsilon_on_the_other_side_of_the_square_root_is_named(after, exporter):
    model = _RootNorm(after).eval()
    inputs = (torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(65)),)
    proto = dc.export(model, inputs, exporter)
    name = _swap_root_and_add(proto)
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, name, cause="epsilon-mismatch")
    mismatch = evidence["mismatches"][0]
    assert mismatch["onnx_adds_after_root"] is (not after) and mismatch["pytorch_eps"] == pytest.approx(1e-5)
    root = next(n.name for n in proto.graph.node if n.op_type == "Sqrt")
    assert root in fd.layer.segment, fd.layer.segment  # the fix moves the Add across it: both are the place


def test_an_epsilon_moved_between_a_square_root_and_its_reciprocal_is_named_at_both():
    """``rsqrt(v + eps)`` exported as Add, Sqrt, Reciprocal; the Add moved after the Sqrt: it now feeds the
    Reciprocal (a root op too) but is after the root — a placement, the Sqrt and the Add its place."""
    model = _RootNorm(False, rsqrt=True).eval()
    inputs = (torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(66)),)
    proto = dc.export(model, inputs, "dynamo")
    if not any(n.op_type == "Reciprocal" for n in proto.graph.node):
        pytest.skip("rsqrt not exported as Sqrt and Reciprocal")
    name = _swap_root_and_add(proto)
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, name, cause="epsilon-mismatch")
    assert evidence["mismatches"][0]["onnx_adds_after_root"] is True, evidence
    root = next(n.name for n in proto.graph.node if n.op_type == "Sqrt")
    assert root in fd.layer.segment, fd.layer.segment
