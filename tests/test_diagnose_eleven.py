"""Faults the eleventh sweep planted (scripts/sweep_faults_eleven.py), each named at its node with its cause: two
Slices of one tensor taking each other's window (rotate_half's halves read in another order), a weight holding its
parameter's numbers rearranged (reshaped where a transpose belongs; output channels permuted with the bias), a
weight quantized with a clipping scale, an Unsqueeze over the wrong axis before a broadcast, a causal mask one
diagonal off, and a bfloat16 Cast pair in a float32 file (precision, not an edit after it)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from fault_sweep import rename  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Rotary(torch.nn.Module):
    """A projection rotated by fixed angles: rotate_half by two slices of the last axis."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(95)
        self.proj, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
        angles = torch.arange(6.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.03]).repeat(2)[None]
        self.register_buffer("cos", angles.cos()), self.register_buffer("sin", angles.sin())

    def forward(self, x):  # (2, 6, 8)
        h = self.proj(x)
        first, second = h[..., :4], h[..., 4:]
        return self.out(h * self.cos + torch.cat((-second, first), -1) * self.sin)


@pytest.mark.parametrize("exporter,renamed", [("dynamo", False), ("torchscript", False), ("dynamo", True)])
def test_two_slices_taking_each_others_halves_are_named_together(exporter, renamed, tmp_path):
    model = _Rotary().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(96)),)
    proto = dc.export(model, inputs, exporter)
    if renamed:
        onnx.save(proto, tmp_path / "clean.onnx")
        rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
        proto = onnx.load(tmp_path / "renamed.onnx")
    first, second = [n for n in proto.graph.node if n.op_type == "Slice"][:2]
    assert first.input[0] == second.input[0]
    rest = list(first.input[1:])
    del first.input[1:]
    first.input.extend(second.input[1:])
    del second.input[1:]
    second.input.extend(rest)
    nodes = sorted(proto.graph.node, key=lambda n: n.op_type != "Constant")  # a TorchScript Constant read earlier
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    fd = _bisect(model, inputs, proto)
    _found(fd, first.name)
    assert second.name in fd.layer.segment and "take each other's window" in fd.explanation, fd.explanation


class _TwoLinears(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(97)
        self.up, self.down = torch.nn.Linear(8, 12), torch.nn.Linear(12, 5)

    def forward(self, x):  # (2, 4, 8)
        return self.down(torch.tanh(self.up(x)))


def _weight_initializer(proto: onnx.ModelProto, weight: torch.Tensor) -> onnx.TensorProto:
    """The initializer holding ``weight`` transposed (a MatMul's [in, out])."""
    want = weight.detach().numpy().T
    return next(i for i in proto.graph.initializer
                if tuple(i.dims) == want.shape and np.array_equal(onnx.numpy_helper.to_array(i), want))


@pytest.mark.parametrize("arrangement", ["reshaped", "permuted"])
def test_a_weight_holding_its_parameters_numbers_rearranged_is_laid_out_back(arrangement):
    """The up projection's MatMul weight holds PyTorch's numbers reshaped where a transpose belongs (a [out, in]
    matrix read as [in, out]), or with its output channels permuted together with the bias (a converter's head
    permutation): the same numbers, in no layout a transpose explains."""
    model = _TwoLinears().eval()
    inputs = (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(98)),)
    proto = dc.export(model, inputs, "dynamo")
    init = _weight_initializer(proto, model.up.weight)
    weight = model.up.weight.detach().numpy()
    if arrangement == "reshaped":
        planted = weight.reshape(8, 12)
    else:
        perm = np.random.default_rng(99).permutation(12)
        planted = weight.T[:, perm]
        bias = next(i for i in proto.graph.initializer if tuple(i.dims) == (12,))
        bias.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(bias)[perm], bias.name))
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(planted), init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader, cause="weight-mismatch")
    said = "output channels permuted" if arrangement == "permuted" else "reshape where a transpose belongs"
    assert said in fd.explanation and "up.weight" in fd.explanation, fd.explanation


class _TiedLinears(torch.nn.Module):
    """Two Linear modules sharing one weight (Zamba2's shared block at two depths, each with its own adapter):
    ``late`` is registered first, so the shared weight is named ``late.weight``, and ``early`` runs first."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(101)
        self.late, self.early = torch.nn.Linear(12, 12, bias=False), torch.nn.Linear(12, 12, bias=False)
        self.early.weight = self.late.weight
        self.adapter = torch.nn.Linear(12, 12)

    def forward(self, x):  # (2, 4, 12)
        return self.late(torch.tanh(self.early(x) + self.adapter(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_permuted_weight_tied_between_modules_is_found_under_the_name_of_its_first_owner(exporter):
    """The weight both Linears read, its output channels permuted in the file: the first divergence is ``early``,
    whose weight PyTorch names ``late.weight`` — it is ``early``'s own all the same (tied), and laid out back."""
    model = _TiedLinears().eval()
    inputs = (torch.randn(2, 4, 12, generator=torch.Generator().manual_seed(102)),)
    proto = dc.export(model, inputs, exporter)
    init = _weight_initializer(proto, model.late.weight)
    perm = np.random.default_rng(103).permutation(12)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(model.late.weight.detach().numpy().T[:, perm]),
                                               init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input and n.op_type == "MatMul")
    fd = _bisect(model, inputs, proto)
    _found(fd, reader, cause="weight-mismatch")
    assert fd.layer.pair.activation.module == "early", fd.layer.pair.activation.module
    assert "output channels permuted" in fd.explanation and "late.weight" in fd.explanation, fd.explanation


class _ConvBn(torch.nn.Module):
    """A Conv with a BatchNorm after it (both exporters fold it into the Conv), a ReLU, a pooled head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(101)
        self.conv, self.bn = torch.nn.Conv2d(6, 8, (1, 3), padding=(0, 1), bias=False), torch.nn.BatchNorm2d(8)
        self.head = torch.nn.Linear(8, 3)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.normal_(0.0, 0.3)
            self.bn.running_mean.normal_(0.0, 0.3)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).mean((2, 3)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_folded_kernel_of_another_layout_reshaped_is_laid_out_back(exporter):
    """The folded kernel (the BatchNorm's scale in it) written from an HWIO layout by a reshape where a transpose
    belongs: its numbers are the fold's, up to the exporter's rounding, in no layout a transpose explains."""
    model = _ConvBn().eval()
    inputs = (torch.randn(2, 6, 4, 5, generator=torch.Generator().manual_seed(102)),)
    proto = dc.export(model, inputs, exporter)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    kernel = onnx.numpy_helper.to_array(init)  # (8, 6, 1, 3), the fold
    planted = np.ascontiguousarray(kernel.transpose(2, 3, 1, 0)).reshape(kernel.shape)  # HWIO read as OIHW
    init.CopyFrom(onnx.numpy_helper.from_array(planted, init.name))
    fd = _bisect(model, inputs, proto)
    _found(fd, conv.name, cause="weight-mismatch")
    assert "reshape where a transpose belongs" in fd.explanation and "BatchNorm folded" in fd.explanation, \
        fd.explanation


def test_a_weight_quantized_with_a_clipping_scale_is_a_quantization_fault():
    """The up projection's weight stored as int8 with a per-tensor scale a quarter of max |w| / 127 (a symmetric
    quantizer: ±127): a third of it saturates.  Quantizing PyTorch's weight with that scale gives exactly these
    integers, so the numbers are no other checkpoint's: the scale is at fault, and PyTorch's float weight fixes
    the segment."""
    from onnx import helper

    model = _TwoLinears().eval()
    inputs = (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(100)),)
    proto = dc.export(model, inputs, "dynamo")
    init = _weight_initializer(proto, model.up.weight)
    w = onnx.numpy_helper.to_array(init)
    scale = np.float32(np.abs(w).max() / 127 / 4)
    q = np.clip(np.round(w / scale), -127, 127).astype(np.int8)
    proto.graph.initializer.extend([onnx.numpy_helper.from_array(q, "up_q"),
                                    onnx.numpy_helper.from_array(np.array(scale, np.float32), "up_scale")])
    reader = next(n for n in proto.graph.node if init.name in n.input)
    dq = helper.make_node("DequantizeLinear", ["up_q", "up_scale"], ["up_w"], name="up_dq")
    reader.input[list(reader.input).index(init.name)] = "up_w"
    nodes = [dq, *proto.graph.node]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    proto.graph.initializer.remove(init)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader.name, cause="quantization")
    assert "clipped at the integer bounds" in fd.explanation and "up_q" in fd.fix, (fd.explanation, fd.fix)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_unsqueeze_over_the_wrong_axis_before_a_broadcast_is_named(exporter):
    """Grouped key/value heads repeated by ``[:, :, None].expand(...)``: the Unsqueeze's axis moved from 2 to 1 still
    broadcasts to the same shape, over the wrong axis (heads interleaved where they were tiled)."""
    from test_diagnose_ten import _GroupedAttention

    model = _GroupedAttention().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(101)),)
    proto = dc.export(model, inputs, exporter)
    consts = {i.name: i for i in proto.graph.initializer}
    consts.update({n.output[0]: n.attribute[0].t for n in proto.graph.node if n.op_type == "Constant"})
    expands = {i for n in proto.graph.node if n.op_type == "Expand" for i in n.input}
    node = next(n for n in proto.graph.node if n.op_type == "Unsqueeze" and n.output[0] in expands
                and onnx.numpy_helper.to_array(consts[n.input[1]]).tolist() == [2])
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array([1], np.int64), "axes_planted"))
    node.input[1] = "axes_planted"
    fd = _bisect(model, inputs, proto)
    _found(fd, node.name)
    assert "axes = [1] where the PyTorch output implies [2]" in fd.explanation, fd.explanation


class _CausalAttention(torch.nn.Module):
    """One head of causal self-attention, its mask a constant (0 on and below the diagonal, -1e4 above)."""

    def __init__(self, t=6):
        super().__init__()
        torch.manual_seed(102)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 3)
        self.register_buffer("mask", torch.triu(torch.full((t, t), -1e4), 1))

    def forward(self, x):  # (2, 6, 8)
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.out(torch.softmax(q @ k.transpose(1, 2) + self.mask, -1) @ v)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_causal_mask_shifted_by_one_diagonal_is_named(exporter):
    """The constant causal mask rebuilt one diagonal off: each query sees one future key."""
    model = _CausalAttention().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(103)),)
    proto = dc.export(model, inputs, exporter)
    mask = model.mask.numpy()
    init = next(i for i in proto.graph.initializer if tuple(i.dims) == mask.shape
                and np.array_equal(onnx.numpy_helper.to_array(i), mask))
    init.CopyFrom(onnx.numpy_helper.from_array(np.triu(np.full((6, 6), -1e4, np.float32), 2), init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader)
    assert "triangle from diagonal 1 where the PyTorch output implies from diagonal 0" in fd.explanation, fd.explanation


class _Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(104)
        self.q, self.k, self.o = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x):  # (1, 16, 32)
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 8).permute(0, 2, 1, 3)
        k = self.k(x).view(b, t, 4, 8).permute(0, 2, 1, 3)
        att = torch.softmax(q @ k.transpose(-1, -2), -1)
        return self.o((att @ k).permute(0, 2, 1, 3).reshape(b, t, 32))


def test_a_cast_pair_through_bfloat16_in_a_float32_file_is_precision_not_the_reshape_after_it():
    """A projection's output rounded through bfloat16 (a Cast pair inserted in a float32 file), then split into
    heads: keeping those two nodes in float32 removes the error, and no other edit of the segment may be named."""
    from onnx import TensorProto, helper

    model = _Heads().eval()
    inputs = (torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(105)),)
    proto = dc.export(model, inputs, "dynamo")
    mm = next(n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm"))
    reader = next(n for n in proto.graph.node if mm.output[0] in n.input)
    node = reader if reader.op_type == "Add" else mm
    out = node.output[0]
    to = helper.make_node("Cast", [out], [out + "_bf"], to=TensorProto.BFLOAT16, name="to_bf16")
    back = helper.make_node("Cast", [out + "_bf"], [out + "_back"], to=TensorProto.FLOAT, name="from_bf16")
    for n in proto.graph.node:
        n.input[:] = [out + "_back" if x == out else x for x in n.input]
    nodes = list(proto.graph.node)
    nodes[nodes.index(node) + 1:nodes.index(node) + 1] = [to, back]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    fd = _bisect(model, inputs, proto)
    _found(fd, "to_bf16", cause="precision")
    assert "bfloat16" in fd.explanation and not any(n.startswith("node_view") for n in fd.fixed_nodes), fd
