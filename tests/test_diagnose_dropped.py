"""Faults the eighth sweep planted (scripts/sweep_faults_eight.py), each named at its node: an op a converter
dropped (an Identity in its place) or applied twice, a residual Add that lost a branch, a bias dropped, a
constant's channels reversed, a GELU computed as the sigmoid "quick GELU", a GRU's ``linear_before_reset`` and an
LSTM's ``input_forget`` / ``clip`` — and, for a file whose nodes name no module, the same found by re-running."""
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
from fault_sweep import rename  # noqa: E402
from rewrites import ort_optimized  # noqa: E402


class _DroppedNet(torch.nn.Module):
    """A Conv (with a bias) on an RGB-like input, a LeakyReLU, a GELU MLP with a residual, a LayerNorm, a GRU and
    an LSTM, a tanh head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.conv, self.act = torch.nn.Conv1d(3, 8, 3, padding=1), torch.nn.LeakyReLU(0.2)
        self.up, self.down, self.norm = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)
        self.gru, self.lstm = torch.nn.GRU(8, 8, batch_first=True), torch.nn.LSTM(8, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)
        with torch.no_grad():
            self.conv.bias.uniform_(0.2, 0.6)
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.normal_(0.0, 0.5)

    def forward(self, x):  # (2, 3, 6)
        h = self.act(self.conv(x)).transpose(1, 2)
        h = self.norm(h + self.down(torch.nn.functional.gelu(self.up(h))))
        h, _ = self.gru(h)
        h, _ = self.lstm(h)
        return torch.tanh(self.fc(h))


@pytest.fixture(scope="module")
def exported():
    model = _DroppedNet().eval()
    inputs = (torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(12)),)
    return model, inputs, dc.export(model, inputs, "torchscript")


def _renamed(exported, tmp_path):
    """The fixture's file with every node and tensor renamed (no scopes, no names to pair by)."""
    model, inputs, proto = exported
    onnx.save(proto, tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    return model, inputs, onnx.load(tmp_path / "renamed.onnx")


def _prune_dead(proto) -> None:
    """Remove (in place) the nodes whose outputs nothing reads, until none is left."""
    while True:
        read = {t for n in proto.graph.node for t in n.input} | {o.name for o in proto.graph.output}
        dead = [n for n in proto.graph.node if not read & set(n.output)]
        if not dead:
            return
        for n in dead:
            proto.graph.node.remove(n)


def _identity(proto, node):
    node.op_type = "Identity"
    del node.input[1:]
    del node.attribute[:]


def test_clean_file_agrees(exported):
    model, inputs, proto = exported
    assert onnx_bisect.bisect(model, inputs, onnx=proto).ok


def test_a_dropped_activation_is_restored_with_the_modules_slope(exported):
    fd, name = _planted(exported, "LeakyRelu", _identity)
    _found(fd, name)
    assert "LeakyRelu" in fd.explanation and "0.2" in fd.explanation


def test_a_dropped_erf_is_named(exported):
    """The GELU's Erf left out: an Identity where PyTorch computes erf (one of the usual one-input ops)."""
    fd, name = _planted(exported, "Erf", _identity)
    assert fd.cause in ("attribute-mismatch", "gelu-approximation") and fd.confirmed is True, fd.explanation
    assert name in fd.layer.segment


def _doubled(proto, node):
    once = node.output[0] + "_once"
    again = helper.make_node(node.op_type, [once, *node.input[1:]], [node.output[0]], name=node.name + "_again")
    again.attribute.extend(node.attribute)
    node.output[0] = once
    at = list(proto.graph.node).index(node)
    proto.graph.node.insert(at + 1, again)


@pytest.mark.parametrize("op_type", ["Tanh", "LayerNormalization"])
def test_an_op_applied_twice_is_named_at_its_second_application(exported, op_type):
    fd, name = _planted(exported, op_type, _doubled)
    _found(fd, name + "_again")
    assert "Identity (the node removed)" in fd.explanation


def test_a_residual_add_that_lost_its_skip_is_restored(exported):
    """``h + down(...)`` left as ``down(...)``: the skip ``h`` is still in the file (the Transpose feeding the
    MLP), and an Add with it reproduces PyTorch."""
    model, inputs, proto = exported
    def change(proto, node):
        branch = next(t for t in node.input if any(n.op_type == "Add" and t in n.output for n in proto.graph.node))
        node.op_type = "Identity"
        del node.input[:]
        node.input.append(branch)
    norm_input = next(n for n in proto.graph.node if n.op_type == "LayerNormalization").input[0]
    fd, name = _planted(exported, "Add", change, pick=lambda nodes: next(n for n in nodes if norm_input in n.output))
    _found(fd, name)
    assert "Add with" in fd.explanation


def test_a_dropped_bias_is_a_weight_mismatch_restored_by_adding_it(exported):
    def change(proto, node):
        del node.input[2:]
    fd, name = _planted(exported, "Conv", change)
    _found(fd, name, "weight-mismatch", at_most=2)
    assert "without a bias" in fd.explanation and "conv.bias" in fd.explanation


class _AddressingHead(torch.nn.Module):
    """A neural Turing machine's head: each step a GRU cell's state projected by one Linear and split into a key,
    a sharpness, a gate, a shift and an exponent, read separately (the split, not the Linear, is what PyTorch's
    value pairs with)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(111)
        self.cell, self.params = torch.nn.GRUCell(6, 16), torch.nn.Linear(16, 8 + 1 + 1 + 3 + 1)
        self.memory = torch.nn.Parameter(torch.randn(5, 8))

    def forward(self, x):  # 2, 4, 6
        h, out = x.new_zeros(2, 16), []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h)
            k, beta, g, s, gamma = self.params(h).split((8, 1, 1, 3, 1), -1)
            w = torch.softmax(F.softplus(beta) * torch.cosine_similarity(k[:, None], self.memory[None], dim=-1), -1)
            w = torch.sigmoid(g) * w + (1 - torch.sigmoid(g)) * torch.softmax(s, -1).sum(-1, keepdim=True) / 3
            out.append(w ** (1 + F.softplus(gamma)))
        return torch.stack(out, 1)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_bias_dropped_from_a_layer_whose_output_is_split_is_the_layers_weight_mismatch(exporter):
    """The head's Gemm without its bias: the divergence pairs with the split after it (an op of the model, which
    has no bias), and PyTorch's Linear output fed to the split reproduces too — the bias of the Linear whose
    weight the Gemm reads, added back, is named first (the file's own numbers before a value fed from outside)."""
    model, x = _AddressingHead().eval(), torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(112))
    proto = dc.export(model, (x,), exporter)
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm" and n.input[2:] == ["params.bias"])
    del gemm.input[2]
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    _found(fd, gemm.name, "weight-mismatch", at_most=2)
    assert "without a bias" in fd.explanation and "params.bias" in fd.explanation, fd.explanation


def _reversed(axis):
    def change(proto, node):
        init = next(i for i in proto.graph.initializer if i.name == node.input[1])
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(np.flip(numpy_helper.to_array(init), axis)),
                                              init.name))
    return change


def test_reversed_input_channels_are_named_as_reversed(exported):
    """An RGB model given BGR weights: the kernel's input channels reversed."""
    fd, name = _planted(exported, "Conv", _reversed(1))
    _found(fd, name, "weight-mismatch", at_most=2)
    assert "reversed" in fd.explanation and "axis 1" in fd.explanation


def test_reversed_channels_in_a_renamed_file_are_confirmed_by_re_running(exported, tmp_path):
    fd, name = _planted(_renamed(exported, tmp_path), "Conv", _reversed(1))
    _found(fd, name, "weight-mismatch", at_most=2)
    assert "reversed order" in fd.explanation


def test_a_quick_gelu_where_pytorch_runs_erf_is_a_gelu_approximation(exported):
    """The exact GELU's ``Erf(u)`` replaced by ``Tanh(1.702/√2·u)``: the arithmetic around it then computes
    ``x·σ(1.702x)``, the sigmoid approximation."""
    def change(proto, node):
        k = node.output[0] + "_k"
        proto.graph.initializer.append(numpy_helper.from_array(np.array(1.702 / np.sqrt(2), np.float32), k))
        scaled = node.output[0] + "_in"
        mul = helper.make_node("Mul", [node.input[0], k], [scaled], name=node.name + "_quick")
        node.op_type = "Tanh"
        node.input[0] = scaled
        proto.graph.node.insert(list(proto.graph.node).index(node), mul)
    fd, name = _planted(exported, "Erf", change)
    assert fd.cause == "gelu-approximation" and fd.confirmed is True, fd.explanation
    assert name in fd.layer.segment
    assert "sigmoid form" in fd.explanation and fd.evidence["pytorch_formula"] == "erf"


def _set(**attrs):
    def change(proto, node):
        for key, value in attrs.items():
            kept = [a for a in node.attribute if a.name != key]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.attribute.append(helper.make_attribute(key, value))
    return change


@pytest.mark.parametrize("op_type, attrs", [("GRU", {"linear_before_reset": 0}), ("LSTM", {"input_forget": 1}),
                                            ("LSTM", {"clip": 0.5})])
def test_an_rnn_attribute_pytorch_does_not_have_is_named(exported, op_type, attrs):
    fd, name = _planted(exported, op_type, _set(**attrs))
    _found(fd, name)
    (attr,) = attrs
    assert attr in fd.explanation


def test_a_gru_attribute_in_a_renamed_file_is_found_by_re_running(exported, tmp_path):
    fd, name = _planted(_renamed(exported, tmp_path), "GRU", _set(linear_before_reset=0))
    _found(fd, name)
    assert "linear_before_reset" in fd.explanation


def test_an_identity_with_nothing_to_restore_is_named_unconfirmed(exported):
    """A residual Add whose branch was removed with it: the Identity hands on the skip alone, and nothing left in
    the file computes the branch — the node is named, the cause given, nothing confirmed."""
    model, inputs, proto = exported
    faulty = onnx.ModelProto()
    faulty.CopyFrom(proto)
    norm_input = next(n for n in faulty.graph.node if n.op_type == "LayerNormalization").input[0]
    add = next(n for n in faulty.graph.node if n.op_type == "Add" and norm_input in n.output)
    skip = next(t for t in add.input if not any(n.op_type == "Add" and t in n.output for n in faulty.graph.node))
    add.op_type = "Identity"
    del add.input[:]
    add.input.append(skip)
    _prune_dead(faulty)  # the branch's nodes, now read by nothing, go with it
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=faulty).first_divergence
    assert fd is not None and add.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd
    assert fd.cause == "attribute-mismatch" and not fd.confirmed and "Identity" in fd.explanation


def _gemm_file():
    """Two Linear layers exported by TorchScript as Gemms with transB=1 (the file's convention), square weights."""
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh(), torch.nn.Linear(6, 6)).eval()
    inputs = (torch.randn(4, 6, generator=torch.Generator().manual_seed(4)),)
    return model, inputs, dc.export(model, inputs, "torchscript")


def test_a_gemm_weight_stored_transposed_is_the_weight_where_the_gemm_reads_as_the_others():
    """The first Gemm's weight transposed (transB kept at 1, like the other Gemm's): the same numbers as a transB
    flip, but the attribute agrees with the file's convention, so the weight is named."""
    def change(proto, node):
        init = next(i for i in proto.graph.initializer if i.name == node.input[1])
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).T.copy(), init.name))
    fd, name = _planted(_gemm_file(), "Gemm", change)
    _found(fd, name, "weight-mismatch", at_most=1)
    assert "transposed" in fd.explanation and "other Gemms" in fd.explanation


def test_a_gemm_transb_unlike_the_others_is_the_attribute():
    fd, name = _planted(_gemm_file(), "Gemm", _set(transB=0))
    _found(fd, name, at_most=1)
    assert "transB" in fd.explanation


class _PatchNet(torch.nn.Module):
    """Overlapping patches gathered with constant indices (an unfold), then transposed, then a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.register_buffer("idx", torch.tensor([[0, 1, 2, 3], [2, 3, 4, 5], [4, 5, 6, 7], [6, 7, 8, 9]]))
        self.fc = torch.nn.Linear(3, 5)

    def forward(self, x):  # (2, 10, 3)
        return self.fc(x[:, self.idx].transpose(1, 2))


def test_gather_indices_behind_a_transpose_are_fitted_to_pytorch():
    model = _PatchNet().eval()
    inputs = (torch.randn(2, 10, 3, generator=torch.Generator().manual_seed(6)),)
    exported = (model, inputs, dc.export(model, inputs, "torchscript"))

    def change(proto, node):
        name = node.input[1]
        init = next((i for i in proto.graph.initializer if i.name == name), None)
        const = None if init is not None else next(n for n in proto.graph.node if n.output[0] == name)
        tensor = init if init is not None else const.attribute[0].t
        value = numpy_helper.to_array(tensor).copy()
        value[1, 2] = 9
        tensor.CopyFrom(numpy_helper.from_array(value, tensor.name))
    fd, name = _planted(exported, "Gather", change, pick=lambda nodes: next(
        n for n in nodes if any(m.op_type == "Transpose" and n.output[0] in m.input for m in exported[2].graph.node)))
    _found(fd, name)
    assert "indices" in fd.explanation


def test_a_folded_batchnorms_dropped_bias_is_restored_as_the_fold():
    """A Conv + BatchNorm folded at export, its bias input then removed: the BatchNorm's shift is gone, and the
    fold's bias added back reproduces PyTorch."""
    torch.manual_seed(9)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 6, 3, padding=1, bias=False), torch.nn.BatchNorm2d(6),
                                torch.nn.ReLU(), torch.nn.Conv2d(6, 4, 1)).eval()
    with torch.no_grad():
        model[1].running_mean.normal_(0.0, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].bias.normal_(0.0, 0.5)
    inputs = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(10)),)
    exported = (model, inputs, dc.export(model, inputs, "torchscript"))

    def change(proto, node):
        del node.input[2:]
    fd, name = _planted(exported, "Conv", change)
    _found(fd, name, "weight-mismatch", at_most=2)
    assert "without a bias" in fd.explanation and "fold(" in fd.explanation


def test_two_layers_weights_exchanged_are_named_with_the_other_layers_parameter():
    """The two Linear layers' weights exchanged (a loader matching parameters by shape): the first Gemm holds
    exactly the second layer's weight; with its own back the segment reproduces PyTorch."""
    model, inputs, proto = _gemm_file()
    faulty = onnx.ModelProto()
    faulty.CopyFrom(proto)
    gemms = [n for n in faulty.graph.node if n.op_type == "Gemm"]
    inits = {i.name: i for i in faulty.graph.initializer}
    a, b = inits[gemms[0].input[1]], inits[gemms[1].input[1]]
    va, vb = numpy_helper.to_array(a).copy(), numpy_helper.to_array(b).copy()
    a.CopyFrom(numpy_helper.from_array(vb, a.name))
    b.CopyFrom(numpy_helper.from_array(va, b.name))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=faulty).first_divergence
    _found(fd, gemms[0].name, "weight-mismatch", at_most=1)
    assert "another module's" in fd.explanation and "2.weight" in fd.explanation


def test_a_quantized_batchnorm_with_a_node_of_its_own_is_not_folded_into_the_conv_before_it(tmp_path):
    """A ConvTranspose + BatchNorm + ReLU quantized by onnxruntime (QDQ): TorchScript keeps the BatchNormalization
    node, and the quantizer removes the ReLU (the quantizer after the BatchNorm, given the range [0, max], does
    its work).  The BatchNorm is not folded into the ConvTranspose (its node reads that tensor): the clean file's
    layers agree, and a planted Tanh → Softsign is pinpointed, not the BatchNorm.  (Its cause reads
    `quantization` here, the Softsign's segment starting at a DequantizeLinear: left as found.)"""
    import alignment_corpus

    torch.manual_seed(13)
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 8, 4, 2, 1, bias=False), torch.nn.BatchNorm2d(8),
                                torch.nn.ReLU(), torch.nn.ConvTranspose2d(8, 3, 4, 2, 1, bias=False),
                                torch.nn.Tanh()).eval()
    with torch.no_grad():
        model[1].running_mean.normal_(0.0, 0.3)
        model[1].running_var.uniform_(0.5, 2.0)
    g = torch.Generator().manual_seed(14)
    inputs = (torch.randn(2, 4, 4, 4, generator=g),)
    onnx.save(dc.export(model, inputs, "torchscript"), tmp_path / "float.onnx")
    alignment_corpus.int8([(torch.randn(2, 4, 4, 4, generator=g),) for _ in range(4)])(
        tmp_path / "float.onnx", tmp_path / "qdq.onnx")
    proto = onnx.load(tmp_path / "qdq.onnx")
    assert not any(n.op_type == "Relu" for n in proto.graph.node)  # the quantizer took the ReLU's place
    with dc.quiet():
        clean = onnx_bisect.bisect(model, inputs, onnx=proto, atol=0.05, rtol=0.05)
    assert clean.ok and not clean.warnings, clean.warnings
    fd, name = _planted((model, inputs, proto), "Tanh", lambda p, n: setattr(n, "op_type", "Softsign"))
    assert fd is not None and name in fd.layer.segment and len(fd.layer.segment) <= 2, fd
    assert fd.layer.pair.activation.module == "4"  # the Tanh's module, not the BatchNorm (1) before it


class _RotaryAttention(torch.nn.Module):
    """A key rotated ``k·cos + rotate_half(k)·sin``, concatenated onto an empty cache and expanded over query
    groups (a key-value cache and grouped-query attention) before the scores."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.o = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4), torch.nn.Linear(8, 8)

    def forward(self, x):  # (1, 6, 8)
        pos = torch.arange(x.shape[1], dtype=torch.float32)[:, None] * torch.arange(1, 5, dtype=torch.float32)
        k = self.k(x)
        half = torch.cat([-k[..., 2:], k[..., :2]], dim=-1)
        k = k * torch.cos(pos) + half * torch.sin(pos)
        k = torch.cat([x.new_zeros(1, 0, 4), k], dim=1)  # the cache, empty
        k = k.unsqueeze(1).expand(1, 2, 6, 4).reshape(1, 2, 6, 4)
        q = self.q(x).reshape(1, 6, 2, 4).transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ k
        return self.o(a.transpose(1, 2).reshape(1, 6, 8))


class _RotaryKey(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(51)
        self.norm, self.attn, self.head = torch.nn.LayerNorm(8), _RotaryAttention(), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(x + self.attn(self.norm(x)))


def test_an_identity_whose_value_later_nodes_only_lay_out_is_named_where_it_computes_nothing():
    """The rotation's Add left as an Identity of ``k·cos`` (its branch pruned) in a file ONNX Runtime optimized: the
    Concat onto the empty cache and the Unsqueeze / Expand after it hold ``k·cos`` too — more names of one value,
    not where the segment starts — and the Identity alone is named."""
    model = _RotaryKey().eval()
    inputs = (torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(52)),)
    faulty = ort_optimized(dc.export(model, inputs, "torchscript"))
    cat = next(n for n in faulty.graph.node if n.op_type == "Concat" and any(
        p.op_type == "Add" and p.output[0] in n.input for p in faulty.graph.node))
    add = next(n for n in faulty.graph.node if n.op_type == "Add" and n.output[0] in cat.input)
    mul = next(n for n in faulty.graph.node if n.op_type == "Mul" and n.output[0] in add.input)
    add.op_type = "Identity"
    del add.input[:]
    add.input.append(mul.output[0])
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=faulty).first_divergence
    assert fd is not None and fd.layer.segment == (add.name,), fd.layer.segment
    assert fd.cause == "attribute-mismatch", fd.explanation


class _Periodic(torch.nn.Module):
    """A periodic activation ``x + sin(x)²`` (a snake) between two projections."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(53)
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.up(x)
        return self.down(h + torch.sin(h) ** 2)


def test_a_dropped_sin_is_restored():
    model = _Periodic().eval()
    inputs = (torch.randn(2, 8, generator=torch.Generator().manual_seed(54)),)
    faulty = dc.export(model, inputs, "torchscript")
    sin = next(n for n in faulty.graph.node if n.op_type == "Sin")
    _identity(faulty, sin)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=faulty).first_divergence
    assert fd is not None and sin.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and "Sin" in fd.explanation, fd.explanation


class _TwoResiduals(torch.nn.Module):
    """Two residual Adds before a LayerNorm, neither a module's output: the norm's segment computes both."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(55)
        self.attn, self.fc = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.norm, self.head = torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)

    def forward(self, x):
        h = x + self.attn(x)
        return self.head(self.norm(h + torch.relu(self.fc(h))))


def test_an_identity_handing_on_a_sum_computed_in_its_segment_is_named_unconfirmed():
    """The second Add left as an Identity of the first's sum, its branch pruned: the sum is computed inside the
    norm's three-node segment (no cut holds it), and it holds the value of the add PyTorch ran — the file lacks a
    computation there: an Add with PyTorch's value of the pruned branch (the relu's) reproduces PyTorch (named,
    confirmed; before, named unconfirmed)."""
    model = _TwoResiduals().eval()
    inputs = (torch.randn(2, 8, generator=torch.Generator().manual_seed(56)),)
    faulty = dc.export(model, inputs, "torchscript")
    norm_input = next(n for n in faulty.graph.node if n.op_type == "LayerNormalization").input[0]
    add = next(n for n in faulty.graph.node if n.op_type == "Add" and norm_input in n.output)
    first = next(n for n in faulty.graph.node if n.op_type == "Add" and n.output[0] in add.input)
    add.op_type = "Identity"
    del add.input[:]
    add.input.append(first.output[0])
    _prune_dead(faulty)  # the branch's nodes, now read by nothing, go with it
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=faulty).first_divergence
    assert fd is not None and add.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and "Add with PyTorch's" in fd.explanation, \
        fd.explanation


class _NormedStack(torch.nn.Module):
    """Two pre-norm residual blocks whose LayerNorms (random weight and bias) feed a chunked MLP, and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(13)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(8) for _ in range(2))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(4))
        self.head = torch.nn.Linear(8, 3)
        with torch.no_grad():
            for norm in self.norms:
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.5)

    def forward(self, x):
        for k, norm in enumerate(self.norms):
            h = norm(x)
            x = x + torch.cat([torch.tanh(self.ups[2 * k + i](c)) for i, c in enumerate(h.chunk(2, dim=1))], dim=1)
        return self.head(x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_layernorm_a_converter_dropped_is_put_back_with_the_models_norm(exporter):
    """The LayerNormalization made an Identity of its input: the Identity's value is the stream PyTorch holds one
    op earlier, so the segment runs on past it; the model's own norm (its weight, bias and epsilon) put in its
    place reproduces PyTorch."""
    model = _NormedStack().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(14)),)
    proto = dc.export(model, inputs, exporter)
    norm = [n for n in proto.graph.node if n.op_type == "LayerNormalization"][1]
    _identity(proto, norm)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert norm.name in fd.fixed_nodes and len(set(fd.layer.segment) | set(fd.fixed_nodes)) <= 12, fd.layer.segment
    assert "norms.1" in fd.explanation, fd.explanation


class _Projection(torch.nn.Module):
    """An inverted-residual block's tail: an activated 1×1 Conv, then the linear projection Conv (no activation)
    and the residual."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(231)
        self.expand, self.project = torch.nn.Conv2d(4, 16, 1), torch.nn.Conv2d(16, 4, 1)

    def forward(self, x):
        return x + self.project(F.silu(self.expand(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_silu_written_out_after_a_linear_projection_is_an_op_pytorch_does_not_apply(exporter):
    """The projection Conv given the block's activation, written out as x·σ(x) (a converter activating every
    Conv): the Mul made an Identity of its input, the Sigmoid named with it."""
    model, x = _Projection().eval(), torch.randn(1, 4, 5, 5, generator=torch.Generator().manual_seed(232))
    proto = dc.export(model, (x,), exporter)
    conv = [n for n in proto.graph.node if n.op_type == "Conv"][-1]
    out = conv.output[0]
    conv.output[0] = out + "_linear"
    nodes = list(proto.graph.node)
    nodes[nodes.index(conv) + 1:nodes.index(conv) + 1] = [
        helper.make_node("Sigmoid", [conv.output[0]], ["planted_gate"], name="planted_gate"),
        helper.make_node("Mul", [conv.output[0], "planted_gate"], [out], name="planted_silu")]
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    _found(fd, "planted_silu")
    assert "planted_gate" in fd.layer.segment and "SiLU" in fd.explanation, fd.explanation


class _InvertedResidual(torch.nn.Module):
    """MobileNetV2's block: expand (ReLU6), depthwise (ReLU6), a linear projection, the residual."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(243)
        self.expand, self.dw = torch.nn.Conv2d(8, 16, 1), torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.project = torch.nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return x + self.project(F.relu6(self.dw(F.relu6(self.expand(x)))))


@pytest.mark.parametrize("provenance", ["dynamo", "onnxslim"])
def test_a_relu6_after_a_linear_projection_is_named_and_removed(provenance):
    """A Clip(0, 6) inserted after the block's linear projection (a port building every Conv with its block's
    activation): the Clip removed reproduces PyTorch — a Clip is an op that may not belong, like a ReLU."""
    model, x = _InvertedResidual().eval(), torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(244))
    proto = dc.export(model, (x,), "dynamo")
    if provenance == "onnxslim":
        import rewrites

        proto = rewrites.slim(proto)
    project = [n for n in proto.graph.node if n.op_type == "Conv"][-1]
    out = project.output[0]
    project.output[0] = out + "_linear"
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(0.0, np.float32), "act_min"),
                                    numpy_helper.from_array(np.array(6.0, np.float32), "act_max")])
    clip = helper.make_node("Clip", [project.output[0], "act_min", "act_max"], [out], name="projection_act")
    proto.graph.node.insert(list(proto.graph.node).index(project) + 1, clip)
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert "projection_act" in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert "projection_act.op = Clip" in fd.explanation and "removed" in fd.explanation, fd.explanation


class _Branches(torch.nn.Module):
    """A block adding two branches (tanh of one Linear, half of another), then a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(247)
        self.a, self.b, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def block(self, x):  # summed from zeros, as a mixture of experts sums its experts' shares
        total = torch.zeros(x.shape[0], 16)
        for share in (torch.tanh(self.a(x)), 0.5 * self.b(x)):
            total = total + share
        return total

    def forward(self, x):
        return self.head(self.block(x))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_add_dropped_with_its_branch_is_restored_with_pytorchs_branch_value(exporter):
    """The Add of the second branch made an Identity of the sum so far and the branch's nodes pruned with it (no
    tensor of the file holds what the Add read): an Add with PyTorch's value of that branch reproduces PyTorch —
    named at the Identity, the value said to be PyTorch's.  The zeros the sum starts from, a constant of one
    number, are no table folded from some module's output (it was read as a stale one)."""
    model, x = _Branches().eval(), torch.randn(3, 8, generator=torch.Generator().manual_seed(248))
    proto = dc.export(model, (x,), exporter)
    tanh = next(n for n in proto.graph.node if n.op_type == "Tanh")
    first = next(n for n in proto.graph.node if n.op_type == "Add" and tanh.output[0] in n.input)
    add = next(n for n in proto.graph.node if n.op_type == "Add" and first.output[0] in n.input)
    add.op_type = "Identity"
    del add.input[:], add.attribute[:]
    add.input.append(first.output[0])
    _prune_dead(proto)
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and add.name in fd.layer.segment, fd.explanation
    assert len(fd.layer.segment) <= 3 and "Add with PyTorch's" in fd.explanation, fd.explanation


class _Strided(torch.nn.Module):
    """A Conv, a ReLU, a strided Conv, a head Conv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(249)
        self.conv1, self.down = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.head(torch.relu(self.down(torch.relu(self.conv1(x)))))


@pytest.mark.parametrize("provenance", ["dynamo", "renamed"])
def test_a_blur_before_a_strided_conv_is_named_and_removed(provenance, tmp_path):
    """A fixed depthwise [1, 2, 1] / 4 blur (BlurPool's anti-aliasing) inserted before the strided Conv, the shape
    kept: the filter removed reproduces PyTorch — named at the blur, also in a renamed file (no scopes)."""
    model, x = _Strided().eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(250))
    proto = dc.export(model, (x,), "dynamo")
    down = next(n for n in proto.graph.node if n.op_type == "Conv" and any(
        a.name == "strides" and list(a.ints) == [2, 2] for a in n.attribute))
    taps = np.array([1.0, 2.0, 1.0]) / 4
    kernel = np.broadcast_to(np.outer(taps, taps), (8, 1, 3, 3)).astype(np.float32)
    proto.graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(kernel), "blur_kernel"))
    blur = helper.make_node("Conv", [down.input[0], "blur_kernel"], ["blurred"], name="blur", group=8,
                            kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    down.input[0] = "blurred"
    proto.graph.node.insert(list(proto.graph.node).index(down), blur)
    name = "blur"
    if provenance == "renamed":
        index = list(proto.graph.node).index(blur)
        onnx.save(proto, tmp_path / "blurred.onnx")
        rename(tmp_path / "blurred.onnx", tmp_path / "renamed.onnx")
        proto = onnx.load(tmp_path / "renamed.onnx")
        name = proto.graph.node[index].name
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and name in fd.layer.segment, fd.explanation
    assert len(fd.layer.segment) <= 3 and f"{name}.op = Conv" in fd.explanation and "removed" in fd.explanation, \
        fd.explanation


class _Attention(torch.nn.Module):
    """Two heads of self-attention with explicit scores (q·kᵀ / √d, a softmax, the values' weighted sum) and a
    residual head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(257)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8) for _ in range(4))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):  # (1, 6, 8)
        q, k, v = (p(x).reshape(1, 6, 2, 4).transpose(1, 2) for p in (self.q, self.k, self.v))
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        return self.head(x + self.o(a.transpose(1, 2).reshape(1, 6, 8)))


def _scores_and_values(proto):
    """The attention's scores MatMul and its values MatMul (the one reading the softmax)."""
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    values = next(n for n in proto.graph.node if n.op_type == "MatMul" and softmax.output[0] in n.input)
    seen, frontier = set(), [softmax.input[0]]
    producers = {o: n for n in proto.graph.node for o in n.output}
    while frontier:
        node = producers.get(frontier.pop())
        if node is None or node.name in seen:
            continue
        if node.op_type == "MatMul":
            return node, values
        seen.add(node.name)
        frontier.extend(node.input)
    raise AssertionError("no scores MatMul")


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_queries_keys_and_values_clipped_are_named_and_removed_together(exporter):
    """Clips on the queries, keys (before the scores) and values (before their product), each at a bound of its
    own (a port's ``clip_qkv``): removing any one leaves the others' error, so the three are left out together
    and named — those past the divergent segment too."""
    model, x = _Attention().eval(), torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(258))
    proto = dc.export(model, (x,), exporter)
    scores, values = _scores_and_values(proto)
    clips = []
    for node, index, bound in ((scores, 0, 0.3), (scores, 1, 0.25), (values, 1, 0.2)):
        name = f"clip_{len(clips)}"
        proto.graph.initializer.extend([numpy_helper.from_array(np.array(-bound, np.float32), name + "_min"),
                                        numpy_helper.from_array(np.array(bound, np.float32), name + "_max")])
        proto.graph.node.insert(list(proto.graph.node).index(node), helper.make_node(
            "Clip", [node.input[index], name + "_min", name + "_max"], [name + "_out"], name=name))
        node.input[index] = name + "_out"
        clips.append(name)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert set(clips) <= set(fd.layer.segment) and len(fd.layer.segment) <= 5, fd.layer.segment
    assert "Clip applied to 3 tensors" in fd.explanation, fd.explanation


class _RotaryHeads(torch.nn.Module):
    """Two heads of self-attention with rotary queries and keys (``x·cos + rotate_half(x)·sin``); with
    ``on_values`` the values are rotated too (a port rotating a fused qkv before splitting it)."""

    def __init__(self, on_values: bool = False):
        super().__init__()
        torch.manual_seed(259)
        self.qkv, self.o, self.head = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
        self.on_values = on_values

    @staticmethod
    def rotated(x, cos, sin):
        return x * cos + torch.cat((-x[..., 2:], x[..., :2]), -1) * sin

    def forward(self, x, pos):  # (1, 6, 8), the 6 positions
        angles = pos[:, None] * torch.tensor([1.0, 0.1, 1.0, 0.1])
        cos, sin = angles.cos(), angles.sin()
        q, k, v = (t.reshape(1, 6, 2, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        q, k = self.rotated(q, cos, sin), self.rotated(k, cos, sin)
        if self.on_values:
            v = self.rotated(v, cos, sin)
        a = torch.softmax(q @ k.transpose(-1, -2) / 2.0, dim=-1) @ v
        return self.head(x + self.o(a.transpose(1, 2).reshape(1, 6, 8)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_rotary_embedding_applied_to_the_values_too_is_left_out_as_a_whole(exporter):
    """The file rotates the values as it rotates queries and keys (exported from the same weights with the
    rotation applied to v): the seven nodes computing the rotated values from the values, several branches
    with cos / sin read beside them, are left out together — the values read as they are — and named."""
    model, x = _RotaryHeads().eval(), torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(260))
    pos = torch.arange(6, dtype=torch.float32)
    rotating = _RotaryHeads(on_values=True).eval()
    rotating.load_state_dict(model.state_dict())
    proto = dc.export(rotating, (x, pos), exporter)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x, pos), onnx=proto).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    product = next(n for n in proto.graph.node if n.op_type == "MatMul" and softmax.output[0] in n.input)
    rotated = next(t for t in product.input if t != softmax.output[0])  # the values the product reads
    assert f"7 nodes computing '{rotated}'" in fd.explanation and "(none of them applied)" in fd.explanation, \
        fd.explanation
    assert len(fd.layer.segment) <= 12, fd.layer.segment
