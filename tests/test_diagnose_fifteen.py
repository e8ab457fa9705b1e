"""Faults the fifteenth held-out set and kinds showed: each test fails on the code before its change."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import numpy as np
import onnx
from onnx import helper, numpy_helper
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402
from fault_sweep import rename  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Recurrent(torch.nn.Module):
    """A projection, a GRUCell (PyTorch runs it as one op; the file as two Gemms and the gates) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(151)
        self.inp, self.gru, self.out = torch.nn.Linear(8, 16), torch.nn.GRUCell(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x, h):
        return self.out(self.gru(torch.relu(self.inp(x)), h))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_bias_the_file_never_reads_dropped_from_a_product_inside_a_fused_op_is_named(exporter):
    """The hidden-to-hidden Gemm of a GRUCell lost its bias input (``bias_hh``): PyTorch's cell is one op, so no
    activation holds that Gemm's product.  The module has two biases; the one no initializer of the file holds
    is added back after each bias-less product of the segment, and the one that reproduces PyTorch is named."""
    model = _Recurrent().eval()
    g = torch.Generator().manual_seed(152)
    inputs = (torch.randn(3, 8, generator=g), torch.randn(3, 16, generator=g))
    proto = dc.export(model, inputs, exporter)
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) > 2 and "bias_hh" in n.input[2])
    del gemm.input[2]
    fd = _bisect(model, inputs, proto)
    _found(fd, gemm.name, cause="weight-mismatch", at_most=12)
    assert "gru.bias_hh" in fd.explanation, fd.explanation


class _Mlp(torch.nn.Module):
    """A transformer's MLP on a (batch, tokens, features) input: Linear, an activation module, Linear."""

    def __init__(self, act: torch.nn.Module):
        super().__init__()
        torch.manual_seed(153)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(8, 16), act, torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x))) + x


def _bias_after_activation(proto, activation: str) -> str:
    """fc1's bias added after the activation (``act(xW) + b``): the product hands on its value without the bias
    and an Add after the activation's last node adds it.  Returns the product's name."""
    nodes = list(proto.graph.node)
    producer = {t: n for n in nodes for t in n.output}
    inits = {t.name for t in proto.graph.initializer}
    gemm = next(n for n in nodes if n.op_type in ("Gemm", "Add") and any("fc1.bias" in t for t in n.input))
    bias = next(t for t in gemm.input if "fc1.bias" in t)
    if gemm.op_type == "Gemm":  # the product as a bias-less MatMul of the transposed weight
        product = helper.make_node("Gemm", list(gemm.input[:2]), list(gemm.output), name="planted_product",
                                   transB=1)
    else:
        product = producer[next(t for t in gemm.input if t not in inits)]
        product.name = "planted_product"
        gemm.op_type, gemm.input[:] = "Identity", [product.output[0]]
    end = next(n for n in reversed(nodes) if n.op_type == activation)
    final = end.output[0]
    end.output[0] = final + "_before_bias"
    add = helper.make_node("Add", [end.output[0], bias], [final], name="planted_bias_add")
    rebuilt = []
    for n in nodes:
        rebuilt.append(product if n is gemm and gemm.op_type == "Gemm" else n)
        if n is end:
            rebuilt.append(add)
    proto.graph.ClearField("node")
    proto.graph.node.extend(rebuilt)
    return "planted_product"


@pytest.mark.parametrize("exporter,act,last", [("dynamo", torch.nn.ReLU(), "Relu"),
                                               ("torchscript", torch.nn.GELU(), "Mul")])
def test_a_bias_added_after_the_activation_instead_of_to_the_product_is_moved_back(exporter, act, last):
    """fc1's bias added after the activation: the Linear's value is in no tensor, so the segment is the
    activation's, with the bias-less product in it.  Moving the Add onto the product reproduces PyTorch; the
    finding names the Add, the product and fc1.bias."""
    model = _Mlp(act).eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(154)),)
    proto = dc.export(model, inputs, exporter)
    product = _bias_after_activation(proto, last)
    fd = _bisect(model, inputs, proto)
    _found(fd, product, cause="weight-mismatch", at_most=12)
    assert "before the activation" in fd.explanation and "fc1.bias" in fd.explanation, fd.explanation


class _Heads(torch.nn.Module):
    """Four attention heads' outputs (batch, heads, tokens, dim) mixed by a projection."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(155)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

    def forward(self, x):  # (1, 6, 8)
        q, k, v = self.qkv(x).view(1, 6, 3, 4, 2).permute(2, 0, 3, 1, 4)
        heads = torch.softmax(q @ k.transpose(-1, -2), -1) @ v
        return self.out(heads.transpose(1, 2).reshape(1, 6, 8))


def test_a_frozen_dropout_mask_over_four_heads_is_training_mode_not_an_op_to_remove():
    """A Dropout left in training mode on the heads, its mask folded to a constant of one value per head (four
    values, one zero, the rest 1/0.9): too few values for their share of zeros to tell p, but 1/(1 − p) of a
    whole-percent p and a zeros' count a Bernoulli(0.1) draw gives make it a Dropout's mask, not a constant
    operand to remove."""
    model = _Heads().eval()
    inputs = (torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(156)),)
    proto = dc.export(model, inputs, "dynamo")
    nodes = list(proto.graph.node)
    first = next(n for n in nodes if n.op_type == "MatMul" and len(n.input) == 2
                 and all(t not in {i.name for i in proto.graph.initializer} for t in n.input))
    second = next(n for n in nodes[nodes.index(first) + 1:] if n.op_type == "MatMul")
    mask = np.full((1, 4, 1, 1), 1 / 0.9, np.float32)
    mask[0, 2] = 0
    proto.graph.initializer.append(numpy_helper.from_array(mask, "planted_mask"))
    out = second.output[0]
    second.output[0] = out + "_undropped"
    drop = helper.make_node("Mul", [out + "_undropped", "planted_mask"], [out], name="planted_dropout")
    proto.graph.node.insert(list(proto.graph.node).index(second) + 1, drop)
    fd = _bisect(model, inputs, proto)
    _found(fd, "planted_dropout", cause="training-mode", at_most=12)


class _Normed(torch.nn.Module):
    """A projection, a LayerNorm with trained (random) scale and shift, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(157)
        self.inp, self.norm, self.head = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.3, 0.3)

    def forward(self, x):
        return self.head(self.norm(self.inp(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_norms_shift_collapsed_to_its_mean_beside_its_exact_scale_is_paired_by_elimination(exporter):
    """The LayerNorm's shift replaced by its mean repeated (per-channel → per-tensor) under a new name: no value
    pairs it, and the segment holds two initializers of its size.  The scale pairs exactly, so the shift is the
    one left on both sides, and it is named as collapsed."""
    model = _Normed().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(158)),)
    proto = dc.export(model, inputs, exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    shift = model.norm.bias.detach().numpy()
    proto.graph.initializer.append(numpy_helper.from_array(np.full_like(shift, shift.mean()), "collapsed_shift"))
    norm.input[2] = "collapsed_shift"
    fd = _bisect(model, inputs, proto)
    _found(fd, norm.name, cause="weight-mismatch", at_most=3)
    assert "norm.bias has one per channel" in fd.explanation, fd.explanation


class _Convs(torch.nn.Module):
    """Two convolutions with a BatchNorm and a ReLU, pooled to a head (an image model's stem)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(159)
        self.conv1, self.bn1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.conv2, self.head = torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.Linear(8, 4)
        with torch.no_grad():
            self.bn1.running_mean.uniform_(-0.2, 0.2)
            self.bn1.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        y = self.conv2(torch.relu(self.bn1(self.conv1(x))))
        return self.head(y.mean((2, 3)))


def _before_first_reader(proto, new_nodes, source: str, out: str) -> None:
    """Insert ``new_nodes`` (computing ``out`` from the graph input ``source``) and make the readers of
    ``source`` read ``out``."""
    for n in proto.graph.node:
        n.input[:] = [out if t == source else t for t in n.input]
    for i, n in enumerate(new_nodes):
        proto.graph.node.insert(i, n)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("planted", ["normalised again", "flipped"])
def test_ops_the_model_does_not_apply_on_its_input_are_named_as_left_out_together(planted, exporter):
    """ImageNet normalisation applied once more to the graph input (a Sub of the means, a Div by the stds:
    neither alone undoes it) or the image flipped along its width (a Slice with step −1): left out together,
    the segment reproduces PyTorch, and the finding names the ops and the graph input."""
    model = _Convs().eval()
    inputs = (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(160)),)
    proto = dc.export(model, inputs, exporter)
    source = proto.graph.input[0].name
    if planted == "flipped":
        for name, value in (("s", [-1]), ("e", [-(2 ** 62)]), ("a", [3]), ("st", [-1])):
            proto.graph.initializer.append(numpy_helper.from_array(np.array(value, np.int64), f"flip_{name}"))
        nodes = [helper.make_node("Slice", [source, "flip_s", "flip_e", "flip_a", "flip_st"], ["flipped"],
                                  name="planted_flip")]
        out, want = "flipped", ["planted_flip"]
    else:
        mean = np.array([0.485, 0.456, 0.406], np.float32).reshape(1, 3, 1, 1)
        std = np.array([0.229, 0.224, 0.225], np.float32).reshape(1, 3, 1, 1)
        proto.graph.initializer.extend([numpy_helper.from_array(mean, "pre_mean"),
                                        numpy_helper.from_array(std, "pre_std")])
        nodes = [helper.make_node("Sub", [source, "pre_mean"], ["centred"], name="planted_sub"),
                 helper.make_node("Div", ["centred", "pre_std"], ["normalised"], name="planted_div")]
        out, want = "normalised", ["planted_sub", "planted_div"]
    _before_first_reader(proto, nodes, source, out)
    fd = _bisect(model, inputs, proto)
    for node in want:
        _found(fd, node, cause="attribute-mismatch", at_most=4)
    assert f"on the graph input '{source}'" in fd.explanation, fd.explanation
    assert ("reversing axis 3" if planted == "flipped" else "0.485, 0.456, 0.406") in fd.explanation, fd.explanation


class _Attention(torch.nn.Module):
    """Single-head attention over 10 tokens with an output projection."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(161)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):  # (2, 10, 8)
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 8 ** 0.5
        return self.o(torch.softmax(scores, -1) @ self.v(x))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_softmax_computed_per_block_of_its_axis_is_named_as_one_softmax_of_the_whole(exporter):
    """The attention's Softmax split into blocks of 4 and 6 along its axis, each normalised alone and
    concatenated (a chunked softmax without the rescaling between blocks): the Concat made one Softmax of the
    Split's input reproduces PyTorch."""
    model = _Attention().eval()
    inputs = (torch.randn(2, 10, 8, generator=torch.Generator().manual_seed(162)),)
    proto = dc.export(model, inputs, exporter)
    soft = next(n for n in proto.graph.node if n.op_type == "Softmax")
    axis = next((a.i for a in soft.attribute if a.name == "axis"), -1)
    proto.graph.initializer.append(numpy_helper.from_array(np.array([4, 6], np.int64), "block_sizes"))
    split = helper.make_node("Split", [soft.input[0], "block_sizes"], ["block0", "block1"], name="planted_split",
                             axis=axis)
    blocks = [helper.make_node("Softmax", [f"block{i}"], [f"soft{i}"], name=f"planted_softmax{i}", axis=axis)
              for i in range(2)]
    concat = helper.make_node("Concat", ["soft0", "soft1"], list(soft.output), name="planted_concat", axis=axis)
    at = list(proto.graph.node).index(soft)
    proto.graph.node.remove(soft)
    for i, n in enumerate([split, *blocks, concat]):
        proto.graph.node.insert(at + i, n)
    fd = _bisect(model, inputs, proto)
    for node in ("planted_softmax0", "planted_softmax1"):
        _found(fd, node, cause="attribute-mismatch", at_most=4)
    assert "Softmax per block" in fd.explanation and "(2 blocks along axis" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter,renamed", [("dynamo", False), ("torchscript", False), ("dynamo", True)])
def test_a_norms_scale_moved_before_the_norm_is_named_with_both_places(exporter, renamed, tmp_path):
    """The LayerNorm's scale γ multiplied in before the norm (a rewrite folding it into the layer before) and
    the norm's own scale set to ones: restoring γ alone does not reproduce PyTorch; restoring it and leaving the
    Mul out does, and the finding names both nodes.  In a file whose every name was replaced the ones pair with
    the norm's weight by elimination, though the Mul holds that weight's numbers exactly."""
    model = _Normed().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(163)),)
    proto = dc.export(model, inputs, exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    gamma = model.norm.weight.detach().numpy()
    scale = next(t for t in proto.graph.initializer if t.name == norm.input[1])
    scale.CopyFrom(numpy_helper.from_array(np.ones_like(gamma), scale.name))
    proto.graph.initializer.append(numpy_helper.from_array(gamma, "gamma_before"))
    source = norm.input[0]
    norm.input[0] = "scaled_before"
    mul = helper.make_node("Mul", [source, "gamma_before"], ["scaled_before"], name="planted_mul")
    proto.graph.node.insert(list(proto.graph.node).index(norm), mul)
    planted, norm_name = "planted_mul", norm.name
    if renamed:
        onnx.save(proto, tmp_path / "planted.onnx")
        rename(tmp_path / "planted.onnx", tmp_path / "renamed.onnx")
        proto = onnx.load(tmp_path / "renamed.onnx")
        at = next(i for i, n in enumerate(proto.graph.node) if n.op_type == "LayerNormalization")
        planted, norm_name = proto.graph.node[at - 1].name, proto.graph.node[at].name
    fd = _bisect(model, inputs, proto)
    _found(fd, planted, cause="weight-mismatch", at_most=3)
    assert norm_name in fd.layer.segment and "norm.weight" in fd.explanation, fd.explanation
    assert "before the normalisation" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_segment_holding_an_onnx_sequence_is_narrowed_without_failing(exporter):
    """A diverging segment whose nodes pass an ONNX sequence (SplitToSequence → ConcatFromSequence, as the
    TorchScript exporter writes chunked loops): ONNX Runtime hands the sequence over as a list, which holds no
    activation to pair; the fault after it (a LayerNorm's shift collapsed) is still found."""
    model = _Normed().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(164)),)
    proto = dc.export(model, inputs, exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    source = norm.input[0]
    norm.input[0] = "joined"
    added = [helper.make_node("Identity", [source], ["passed_a"], name="planted_pass0"),  # long enough to narrow
             helper.make_node("Identity", ["passed_a"], ["passed"], name="planted_pass1"),
             helper.make_node("SplitToSequence", ["passed"], ["pieces"], name="planted_pieces", axis=-1, keepdims=1),
             helper.make_node("ConcatFromSequence", ["pieces"], ["joined"], name="planted_join", axis=-1)]
    at = list(proto.graph.node).index(norm)
    for i, n in enumerate(added):
        proto.graph.node.insert(at + i, n)
    shift = model.norm.bias.detach().numpy()
    proto.graph.initializer.append(numpy_helper.from_array(np.full_like(shift, shift.mean()), "collapsed_shift"))
    norm.input[2] = "collapsed_shift"
    fd = _bisect(model, inputs, proto)
    _found(fd, norm.name, cause="weight-mismatch", at_most=4)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_output_channel_zeroed_in_a_folded_conv_is_a_pruned_weight_not_a_fold_mistake(exporter):
    """One output channel of a Conv carrying its BatchNorm's fold zeroed, weight and bias (pruned): a rescale by
    zero fits no way of folding; it is named as the weight's channel zeroed, the others the fold's."""
    model = _Convs().eval()
    inputs = (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(165)),)
    proto = dc.export(model, inputs, exporter)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    inits = {t.name: t for t in proto.graph.initializer}
    for name in conv.input[1:3]:
        value = numpy_helper.to_array(inits[name]).copy()
        value[5] = 0
        inits[name].CopyFrom(numpy_helper.from_array(value, name))
    fd = _bisect(model, inputs, proto)
    _found(fd, conv.name, cause="weight-mismatch", at_most=3)
    assert "output channel(s) 5 of 8 zeroed" in fd.explanation, fd.explanation


@pytest.mark.parametrize("mask,p", [
    ([0.0, 1 / 0.9, 1 / 0.9, 1 / 0.9], 0.1),      # a Dropout2d(0.1)'s mask over four heads
    ([0.0, 2.0], None),                           # too few values to be a mask
    ([0.0, 4.0, 4.0, 4.0], None),                 # p = 0.75: more than models drop
    ([0.0, 0.0, 0.0, 1 / 0.9], None),             # three of four zeros is no Bernoulli(0.1) draw
    ([0.0] * 2 + [2.0] * 14, None),               # 16 values, 2 zeros where p = 0.5 implies 8
    ([0.0] * 7 + [2.0] * 9, 0.5),
])
def test_a_frozen_dropout_mask_is_told_from_other_constants_of_zeros_and_one_value(mask, p):
    """The values a frozen Dropout mask holds: a short mask counts only for a whole-percent p of at most one half
    and a zeros' count a Bernoulli(p) draw gives; a longer one by its share of zeros."""
    from onnx_bisect.diagnose.support.masks import dropout_probability

    found = dropout_probability(np.array(mask, np.float32))
    assert (found is None) if p is None else abs(found - p) < 1e-6, found


class _Heads4(torch.nn.Module):
    """Four-head self-attention over 16 channels (heads of 4), an output projection."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(166)
        self.qkv, self.o = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x):  # (2, 6, 16)
        q, k, v = (t.view(2, 6, 4, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        heads = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
        return self.o(heads.transpose(1, 2).reshape(2, 6, 16))


def test_attention_run_with_another_head_count_is_named_from_pytorchs_softmax():
    """The three Reshapes splitting q, k and v into heads written for 8 heads of 2 (the channels split the same,
    so the split holds PyTorch's numbers in another shape and the first wrong value is the scores): PyTorch's
    softmax has 4 heads, and the Reshapes rewritten for 4 heads of 4 reproduce it."""
    model = _Heads4().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(167)),)
    proto = dc.export(model, inputs, "torchscript")
    inits = {t.name: t for t in proto.graph.initializer}
    consts = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    split = []
    for node in proto.graph.node:
        if node.op_type != "Reshape":
            continue
        source = inits.get(node.input[1])
        value = numpy_helper.to_array(source) if source is not None else \
            numpy_helper.to_array(consts[node.input[1]].attribute[0].t) if node.input[1] in consts else None
        if value is not None and list(value) == [2, 6, 4, 4]:
            name = f"planted_shape_{len(split)}"
            proto.graph.initializer.append(numpy_helper.from_array(np.array([2, 6, 8, 2], np.int64), name))
            node.input[1] = name
            split.append(node.name)
    assert len(split) == 3, split
    fd = _bisect(model, inputs, proto)
    for node in split:
        _found(fd, node, cause="attribute-mismatch", at_most=12)
    assert "8 heads of 2" in fd.explanation and "4 heads of 4" in fd.explanation, fd.explanation


class _FusedHeads(torch.nn.Module):
    """Eight tokens, four heads of 8 through ``F.scaled_dot_product_attention`` (the dynamo exporter writes it out
    with a batch × heads Reshape; PyTorch records no softmax of its own)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(251)
        self.qkv, self.o = torch.nn.Linear(32, 96), torch.nn.Linear(32, 32)

    def forward(self, x):  # (1, 8, 32)
        q, k, v = (t.view(1, 8, 4, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        return self.o(torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(1, 8, 32))


def test_another_head_count_is_read_where_the_sequence_is_as_long_as_the_files_head_count():
    """Every Reshape of the written-out attention made for 8 heads of 4 where the model has 4 heads of 8, with 8
    tokens: the keys' batch × heads Reshape (8, 8, 4) reads two ways — (heads, head size) adjacent, or batch ×
    heads apart from the head size — and only the second reproduces PyTorch. Each reading is tried, and the head
    count comes from the fused attention's operands."""
    model = _FusedHeads().eval()
    inputs = (torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(252)),)
    proto = dc.export(model, inputs, "dynamo")
    planted = {(1, 8, 4, 8): [1, 8, 8, 4], (-1, 8, 8): [-1, 8, 4], (1, 4, 8, 8): [1, 8, 4, 8]}
    inits = {t.name: t for t in proto.graph.initializer}
    changed = []
    for node in proto.graph.node:
        source = inits.get(node.input[1]) if node.op_type == "Reshape" else None
        value = tuple(numpy_helper.to_array(source).tolist()) if source is not None else None
        if value in planted:
            name = f"planted_heads_{len(changed)}"
            proto.graph.initializer.append(numpy_helper.from_array(np.array(planted[value], np.int64), name))
            node.input[1] = name
            changed.append(node.name)
    assert len(changed) == 5, changed
    del proto.graph.value_info[:]  # the exporter's shapes, now stale
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert set(changed) <= set(fd.layer.segment) and len(fd.layer.segment) <= 12, fd.layer.segment
    assert "8 heads of 4" in fd.explanation and "4 heads of 8" in fd.explanation, fd.explanation
