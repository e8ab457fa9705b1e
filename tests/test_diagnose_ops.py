"""Faults of indexing ops, activations and weight layouts that no module configuration names: a Gather's constant
indices, a Slice window, a reduction's axes, a Pad's sides, an activation's parameter or the activation itself, a
square weight stored transposed — each found by re-running the segment with the value that reproduces PyTorch."""
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
import rewrites

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _OpsNet(torch.nn.Module):
    """Conv1d + functional leaky ReLU, a Slice, a reflection Pad before a Conv1d, a hard sigmoid gate, a square
    Linear and a sigmoid, a mean over channels, a fixed index selection, a classifier."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv, self.conv2 = torch.nn.Conv1d(4, 4, 3, padding=1), torch.nn.Conv1d(4, 4, 4)
        self.fc1, self.fc2 = torch.nn.Linear(4, 4), torch.nn.Linear(3, 3)

    def forward(self, x):  # (2, 4, 6)
        h = F.leaky_relu(self.conv(x), 0.2)[:, :, 1:5]
        h = self.conv2(F.pad(h, (2, 1), mode="reflect"))
        g = h * F.hardsigmoid(h * 3.0)
        s = torch.sigmoid(self.fc1(g))
        m = s.mean(dim=1)
        return self.fc2(m[:, [0, 2, 3]])


def _bisect(exporter: str, edit):
    """Export the model, apply ``edit(proto) -> planted node name``, run onnx-bisect; ``(first divergence,
    planted node)``."""
    model, x = _OpsNet().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(4))
    proto = dc.export(model, (x,), exporter)
    planted = edit(proto)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    return report.first_divergence, planted


def _node(proto, op_type: str):
    return next(n for n in proto.graph.node if n.op_type == op_type)


def _set_input(proto, node, index: int, value: np.ndarray) -> None:
    """Give ``node`` a constant of its own at input ``index`` (exporters share small constants between nodes)."""
    name = f"{node.name}_planted_{index}"
    dtype = _constant(proto, node.input[index]).dtype
    proto.graph.initializer.append(numpy_helper.from_array(value.astype(dtype), name))
    node.input[index] = name


def _constant(proto, tensor: str) -> np.ndarray:
    for init in proto.graph.initializer:
        if init.name == tensor:
            return numpy_helper.to_array(init)
    const = next(n for n in proto.graph.node if n.op_type == "Constant" and n.output[0] == tensor)
    return numpy_helper.to_array(const.attribute[0].t)


def _found(fd, planted: str, cause: str = "attribute-mismatch", at_most: int = 3) -> dict:
    assert fd is not None and fd.cause == cause and fd.confirmed is True, fd
    assert planted in fd.layer.segment and len(fd.layer.segment) <= at_most, fd.layer.segment
    return fd.evidence


def test_a_square_weight_stored_transposed_is_a_weight_mismatch():
    def edit(proto):
        matmul = _node(proto, "MatMul")
        w = _constant(proto, matmul.input[1])
        _set_input(proto, matmul, 1, w.T.copy())
        return matmul.name

    fd, planted = _bisect("dynamo", edit)
    evidence = _found(fd, planted, "weight-mismatch")
    assert evidence["parameters"][0]["layout"] == "first two axes swapped"
    assert fd.fixed_nodes == (planted,)


def test_a_gathers_constant_indices_are_fitted_to_pytorchs_output():
    def edit(proto):
        gather = _node(proto, "Gather")
        _set_input(proto, gather, 1, np.array([0, 1, 3]))
        return gather.name

    fd, planted = _bisect("torchscript", edit)
    [row] = _found(fd, planted)["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("indices", [0, 1, 3], [0, 2, 3])


def test_a_slice_window_moved_along_its_axis_is_found():
    def edit(proto):
        sl = _node(proto, "Slice")
        _set_input(proto, sl, 1, np.array([2]))
        _set_input(proto, sl, 2, np.array([6]))
        return sl.name

    fd, planted = _bisect("dynamo", edit)
    [row] = _found(fd, planted)["attributes"]
    assert row["attribute"].startswith("window along axis") and (row["onnx_value"], row["expected"]) == ([2, 6], [1, 5])


def test_a_reduction_over_another_axis_of_the_same_size_is_found():
    def edit(proto):
        mean = _node(proto, "ReduceMean")
        if len(mean.input) > 1:
            _set_input(proto, mean, 1, np.array([2]))
        else:
            mean.attribute.remove(next(a for a in mean.attribute if a.name == "axes"))
            mean.attribute.append(helper.make_attribute("axes", [2]))
        return mean.name

    fd, planted = _bisect("dynamo", edit)
    [row] = _found(fd, planted)["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("axes", [2], [1])


def test_padding_moved_to_the_other_side_of_an_axis_is_found():
    def edit(proto):
        pad = _node(proto, "Pad")
        pads = _constant(proto, pad.input[1])
        moved = pads.copy()
        moved[2], moved[5] = pads[2] - 1, pads[5] + 1  # (2, 1) on the last axis -> (1, 2)
        _set_input(proto, pad, 1, moved)
        return pad.name

    fd, planted = _bisect("dynamo", edit)
    [row] = _found(fd, planted)["attributes"]
    assert row["attribute"] == "pads" and row["expected"][2] == 2 and row["expected"][5] == 1


@pytest.mark.parametrize("op, attribute, value, expected", [
    ("LeakyRelu", "alpha", 0.01, 0.2),
    ("HardSigmoid", "alpha", 0.2, [0.166667, 0.5]),
])
def test_an_activation_parameter_is_fitted_to_pytorchs_output(op, attribute, value, expected):
    def edit(proto):
        node = _node(proto, op)
        kept = [a for a in node.attribute if a.name != attribute]
        del node.attribute[:]
        node.attribute.extend(kept + [helper.make_attribute(attribute, value)])
        return node.name

    fd, planted = _bisect("dynamo", edit)
    [row] = _found(fd, planted)["attributes"]
    assert row["expected"] == expected


def test_a_sigmoid_written_as_a_hard_sigmoid_is_found():
    def edit(proto):
        node = _node(proto, "Sigmoid")
        node.op_type = "HardSigmoid"
        node.attribute.extend([helper.make_attribute("alpha", 1 / 6), helper.make_attribute("beta", 0.5)])
        return node.name

    fd, planted = _bisect("dynamo", edit)
    [row] = _found(fd, planted)["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("op", "HardSigmoid", "Sigmoid")


def test_a_zeroed_bias_in_a_renamed_file_is_found_after_the_product_it_no_longer_changes(tmp_path):
    """With its bias zeroed, the Add after the Linear's MatMul changes nothing, so by value the Linear pairs with
    the product: the product plus the module's own bias reproduces PyTorch, and the Add is named."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fault_sweep import rename  # noqa: PLC0415 - the sweep's renamer: every node n0..., every tensor t0...

    model, x = _OpsNet().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(4))
    proto = dc.export(model, (x,), "dynamo")
    matmul = _node(proto, "MatMul")
    add = next(n for n in proto.graph.node if matmul.output[0] in n.input)
    bias = next(t for t in add.input if t != matmul.output[0])
    _set_input(proto, add, list(add.input).index(bias), np.zeros(4, np.float32))
    onnx.save(proto, tmp_path / "zeroed.onnx")
    rename(tmp_path / "zeroed.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    position = [n.op_type for n in proto.graph.node].index("Add", list(proto.graph.node).index(add))
    planted = renamed.graph.node[position].name
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=renamed).first_divergence
    evidence = _found(fd, planted, "weight-mismatch")
    assert evidence["parameters"][0]["parameter"].endswith("fc1.bias") and "all zero" in fd.explanation


def test_a_zeroed_float16_bias_is_no_float16_clamp():
    """A float16 file's bias of zeros is not PyTorch's bias clamped to float16's range: a weight-mismatch."""
    def edit(proto):
        matmul = _node(proto, "MatMul")
        add = next(n for n in proto.graph.node if matmul.output[0] in n.input)
        bias = next(t for t in add.input if t != matmul.output[0])
        _set_input(proto, add, list(add.input).index(bias), np.zeros(4, np.float16))
        return add.name

    model, x = _OpsNet().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(4))
    proto = rewrites.to_float16(dc.export(model, (x,), "dynamo"))
    planted = edit(proto)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto, atol=1e-2, rtol=1e-2).first_divergence
    evidence = _found(fd, planted, "weight-mismatch")
    assert evidence["parameters"][0]["parameter"].endswith("fc1.bias")


class _Masked(torch.nn.Module):
    """Causal self-attention written out (masked_fill with -inf), rotate-half on the queries (a Concat of two
    halves), a LayerNorm, a Linear head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.qkv, self.norm, self.head = torch.nn.Linear(8, 24), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)

    def forward(self, x):  # (1, 6, 8)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = torch.cat([-q[..., 4:], q[..., :4]], dim=-1) + q
        scores = q @ k.transpose(-1, -2) / 8 ** 0.5
        causal = torch.ones(6, 6, dtype=torch.bool).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.head(self.norm(att @ v + x))


def _masked(edit):
    model, x = _Masked().eval(), torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(8))
    proto = dc.export(model, (x,), "dynamo")
    planted = edit(proto)
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence, planted


def test_a_concats_inputs_in_another_order_are_found():
    def edit(proto):
        concat = next(n for n in proto.graph.node if n.op_type == "Concat" and len(n.input) == 2)
        concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
        return concat.name

    fd, planted = _masked(edit)
    [row] = _found(fd, planted)["attributes"]
    assert (row["attribute"], row["expected"]) == ("input order", [1, 0])


def test_a_weak_mask_fill_is_found_at_the_value_pytorch_filled_with():
    def edit(proto):
        where = next(n for n in proto.graph.node if n.op_type == "Where")
        position = next(i for i in (1, 2) if _constant(proto, where.input[i]).size == 1)
        _set_input(proto, where, position, np.array(-1.0, np.float32))
        return where.name

    fd, planted = _masked(edit)
    [row] = _found(fd, planted)["attributes"]
    assert row["onnx_value"] == -1.0 and row["expected"] == float("-inf")



def test_a_splits_chunks_taken_in_another_order_are_found():
    """q and k of one projection split in the wrong order: the Split's outputs exchanged reproduce PyTorch."""
    def edit(proto):
        split = _node(proto, "Split")
        split.output[0], split.output[1] = split.output[1], split.output[0]
        return split.name

    fd, planted = _masked(edit)
    rows = _found(fd, planted, at_most=4)["attributes"]  # the Split with the layout ops reading its chunks
    assert any(r["attribute"] == "output order" and r["onnx_node"] == planted for r in rows), rows


def test_an_unexplained_narrowed_op_is_searched_around_in_the_wider_segment():
    """With the mask fill weakened to −1, op values narrow the error to the Softmax (the masked scores no op of
    PyTorch's holds); the wider segment's alternatives are tried nearest the Softmax first, so the Where's
    constant is reached within the search's budget."""
    def edit(proto):
        where = next(n for n in proto.graph.node if n.op_type == "Where")
        position = next(i for i in (1, 2) if _constant(proto, where.input[i]).size == 1)
        _set_input(proto, where, position, np.array(-1.0, np.float32))
        return where.name

    class _Causal(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
            self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(6))

        def forward(self, x, memory):
            return self.layer(x, memory, tgt_mask=self.mask, tgt_is_causal=True)

    torch.manual_seed(11)
    causal = _Causal().eval()
    g = torch.Generator().manual_seed(12)
    inputs = (torch.randn(1, 6, 16, generator=g), torch.randn(1, 5, 16, generator=g))
    proto = dc.export(causal, inputs, "torchscript")
    planted = edit(proto)
    with dc.quiet():
        fd = onnx_bisect.bisect(causal, inputs, onnx=proto).first_divergence
    [row] = _found(fd, planted, at_most=12)["attributes"]
    assert row["onnx_value"] == -1.0 and row["expected"] == float("-inf")


def test_a_zeroed_gemm_bias_in_a_renamed_file_is_the_modules_bias(tmp_path):
    """Values pair nothing with a weight of zeros, and a renamed file has no names: the zeroed weight in the
    divergent Linear's bias slot is that Linear's bias."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fault_sweep import rename  # noqa: PLC0415

    model, x = _OpsNet().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(4))
    proto = dc.export(model, (x,), "torchscript")
    gemm = _node(proto, "Gemm")
    _set_input(proto, gemm, 2, np.zeros(3, np.float32))
    onnx.save(proto, tmp_path / "zeroed.onnx")
    rename(tmp_path / "zeroed.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    planted = renamed.graph.node[list(proto.graph.node).index(gemm)].name
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=renamed).first_divergence
    evidence = _found(fd, planted, "weight-mismatch")
    assert evidence["parameters"][0]["parameter"] == "fc2.bias"


class _Positions(torch.nn.Module):
    """A learned position table gathered at fixed positions (a buffer, sliced to the input's length)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(19)
        self.pos, self.fc = torch.nn.Embedding(10, 8), torch.nn.Linear(8, 4)
        self.register_buffer("ids", torch.tensor([[1, 3, 5, 7, 9, 0]]))

    def forward(self, x):  # (2, 6, 8)
        return self.fc(torch.relu(x + self.pos(self.ids[:, : x.shape[1]])))


def test_a_gathers_indices_behind_a_qdq_pair_are_fitted():
    """In a quantized file the gathered positions are quantized straight after the Gather: the divergent tensor is
    the DequantizeLinear's output, and the indices are fitted to PyTorch's value there (rounding aside)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import plant  # noqa: PLC0415

    model, x = _Positions().eval(), torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(20))
    exported = dc.export(model, (x,), "torchscript")
    proto = plant.quantize_static_qdq(exported, {exported.graph.input[0].name: x.numpy()})
    gather = _node(proto, "Gather")
    assert any(n.op_type == "QuantizeLinear" and gather.output[0] in n.input for n in proto.graph.node)
    _set_input(proto, gather, 1, np.array([[1, 3, 4, 7, 9, 0]]))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto, atol=0.01, rtol=0.01).first_divergence
    [row] = _found(fd, gather.name)["attributes"]
    assert row["attribute"] == "indices" and row["expected"] == [[1, 3, 5, 7, 9, 0]]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_stale_bias_of_a_conv_with_a_folded_batchnorm_is_a_weight_mismatch(exporter):
    """The Conv's kernel is the fold exactly and only its bias differs (zeroed): no way of folding (eps, batch
    statistics, defaults) explains that, so it is a stale value compared with the fold's bias, not a fold mistake."""
    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 1)).eval()
    with torch.no_grad():
        model[1].running_mean.uniform_(-1, 1)
        model[1].running_var.uniform_(0.5, 2)
        model[1].bias.uniform_(-1, 1)
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(14))
    proto = dc.export(model, (x,), exporter)
    conv = _node(proto, "Conv")
    _set_input(proto, conv, 2, np.zeros(8, np.float32))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    evidence = _found(fd, conv.name, "weight-mismatch")
    assert evidence["parameters"][0]["parameter"].startswith("fold(0.bias, 1)")


def test_a_single_gathered_index_is_tried_at_every_position_of_a_short_axis():
    """The last time step selected as step 9 of 12: the Gather is not the divergent tensor (the Linear after it
    is), so no fit; one index on a short axis is tried everywhere, nearest first."""
    class _Last(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(15)
            self.rnn, self.head = torch.nn.GRU(4, 8, batch_first=True), torch.nn.Linear(8, 3)

        def forward(self, x):
            return self.head(self.rnn(x)[0][:, -1])

    model, x = _Last().eval(), torch.randn(2, 12, 4, generator=torch.Generator().manual_seed(16))
    proto = dc.export(model, (x,), "torchscript")
    head = next(n for n in proto.graph.node if "head" in n.name and n.op_type in ("Gemm", "MatMul"))
    gather = next(n for n in proto.graph.node if n.op_type == "Gather" and n.output[0] == head.input[0])
    _set_input(proto, gather, 1, np.array(-3))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    [row] = _found(fd, gather.name)["attributes"]
    assert row["attribute"] == "indices" and row["expected"] == 11


def test_a_gemms_alpha_is_found_at_a_linears():
    def edit(proto):
        gemm = _node(proto, "Gemm")
        kept = [a for a in gemm.attribute if a.name != "alpha"]
        del gemm.attribute[:]
        gemm.attribute.extend(kept + [helper.make_attribute("alpha", 0.5)])
        return gemm.name

    fd, planted = _bisect("torchscript", edit)
    [row] = _found(fd, planted)["attributes"]
    assert (row["attribute"], row["onnx_value"], row["expected"]) == ("alpha", 0.5, 1.0)


class _Hard(torch.nn.Module):
    """Conv + BatchNorm + ReLU6 twice, pooling, a Linear: a network a static int8 quantizer handles whole."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(17)
        self.a = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6())
        self.b = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU6())
        self.fc = torch.nn.Linear(8, 5)
        with torch.no_grad():
            for m in (self.a[0], self.b[0]):
                m.weight.mul_(3.0)

    def forward(self, x):
        return self.fc(self.b(self.a(x)).mean(dim=(2, 3)))


def test_a_clipping_quantization_scale_is_the_fault_not_rounding_noise():
    """One activation's QuantizeLinear/DequantizeLinear scale divided by 8: a fifth of the values and more clip. The
    layers before it differ by their rounding alone (passed over); the clipping pair is named, not narrowed away."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import plant  # noqa: PLC0415

    model, x = _Hard().eval(), torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(18))
    exported = dc.export(model, (x,), "torchscript")
    proto = plant.quantize_static_qdq(exported, {exported.graph.input[0].name: x.numpy()})
    quantizers = [n for n in proto.graph.node if n.op_type == "QuantizeLinear" and not _is_weight(proto, n)]
    q = quantizers[2]  # after the second block's ReLU6 (the first is the input's)
    dq = next(n for n in proto.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0])
    scale = _constant(proto, q.input[1]) / np.float32(8)
    name = f"{q.name}_planted_scale"
    proto.graph.initializer.append(numpy_helper.from_array(scale.astype(np.float32), name))
    q.input[1] = dq.input[1] = name
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto, atol=0.05, rtol=0.05).first_divergence
    assert fd is not None and fd.cause == "quantization" and fd.confirmed is True, fd
    assert q.name in fd.layer.segment and dq.name in fd.layer.segment and len(fd.layer.segment) <= 12
    assert max(a["clip_fraction"] for a in fd.evidence["activations"]) >= 0.05


def _is_weight(proto, q) -> bool:
    return any(i.name == q.input[0] for i in proto.graph.initializer)


def test_a_folded_kernel_with_its_channels_exchanged_is_a_weight_mismatch(tmp_path):
    """A 1×1 Conv with a BatchNorm folded into it (TorchScript folds it), every name replaced: its kernel holds no
    parameter's numbers, so no weight differs from one; with output and input channels exchanged back the
    segment reproduces PyTorch — the swap is the evidence."""
    from fault_sweep import rename

    torch.manual_seed(19)
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3)).eval()
    with torch.no_grad():
        model[1].running_mean.normal_(0, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    x = torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(20))
    proto = dc.export(model, (x,), "torchscript")
    onnx.save(proto, tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    conv = _node(proto, "Conv")
    _set_input(proto, conv, 1, np.swapaxes(_constant(proto, conv.input[1]), 0, 1).copy())
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    evidence = _found(fd, conv.name, "weight-mismatch")
    assert evidence["parameters"][0]["layout"] == "first two axes swapped"


def test_an_initializer_no_node_reads_is_not_asked_of_onnx_runtime(tmp_path):
    """A file without names holding an initializer nothing reads (an edit left it behind) of a module's shape:
    ONNX Runtime drops it, so exposing it as an output failed the run; the tool leaves it out and runs."""
    from fault_sweep import rename

    model, x = _OpsNet().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(4))
    onnx.save(dc.export(model, (x,), "torchscript"), tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    proto.graph.initializer.append(numpy_helper.from_array(np.ones((2, 3), np.float32), "left_behind"))
    with dc.quiet():
        assert onnx_bisect.bisect(model, (x,), onnx=proto).ok
