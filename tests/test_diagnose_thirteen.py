"""Faults the thirteenth stop's sweeps left misplaced or unexplained: an input rewired to one of many tensors of
its shape (a block-sparse attention's gathered key blocks)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_bisect
from onnx_bisect.capture.modules import capture_activations
from onnx_bisect.records import ModelInputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


def test_an_input_rewired_to_one_of_many_tensors_of_its_shape_is_found_where_it_lies_far_back():
    """BigBird's block-sparse attention gathers a dozen key blocks of one shape; an Einsum reading one of them is
    wired to a product of that shape computed after it.  The right tensor lies eight tensors of its shape back
    (a Gather's output no module holds): the rewiring is read only when that many of the graph's own tensors are
    tried in its place."""
    import sweep_models
    model, inputs = sweep_models.build("bigbird")
    proto = onnx.shape_inference.infer_shapes(dc.export(model, inputs, "dynamo"))
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in proto.graph.value_info}
    nodes, producer = list(proto.graph.node), {t: i for i, n in enumerate(proto.graph.node) for t in n.output}
    einsum, slot, wrong, best = None, None, None, 0
    for i, n in enumerate(nodes):
        for j, t in enumerate(n.input):
            if n.op_type != "Einsum" or t not in producer or nodes[producer[t]].op_type != "Gather":
                continue
            later = [m.output[0] for m in nodes[producer[t] + 1:i] if m.op_type == "MatMul"
                     and shapes.get(m.output[0]) == shapes.get(t)]
            same = [m.output[0] for m in nodes[producer[t] + 1:i] if shapes.get(m.output[0]) == shapes.get(t)]
            if later and len(same) > best:
                einsum, slot, wrong, best = n, j, later[-1], len(same)
    assert best >= 8, "no Einsum reads a Gather with eight tensors of its shape between them (six were tried)"
    einsum.input[slot] = wrong
    fd = _bisect(model, inputs, proto)
    _found(fd, einsum.name, cause="attribute-mismatch")
    assert f"reads '{wrong}' as its input {slot}" in fd.explanation, fd.explanation


class _Shared(torch.nn.Module):
    """One Linear + BatchNorm block registered under two names (TabNet's shared GLU blocks), called twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(133)
        block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
        self.first, self.second = block, block
        with torch.no_grad():
            block[1].running_mean.uniform_(-1, 1)
            block[1].running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


class _Half(torch.nn.Module):
    """A bfloat16 buffer (RecurrentGemma's embedding normaliser) cast to the activations' type in forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(134)
        self.proj = torch.nn.Linear(6, 6)
        self.register_buffer("normalizer", torch.tensor(2.5, dtype=torch.bfloat16), persistent=False)

    def forward(self, x):
        return self.proj(x * self.normalizer.type(x.dtype))


@pytest.mark.parametrize("model", [_Shared, _Half], ids=["module-under-two-names", "bfloat16-buffer"])
def test_a_clean_model_with_a_shared_module_or_a_bfloat16_buffer_runs_clean(model):
    """Both crashed the weight comparison (a KeyError for the second name of the shared block; numpy has no
    bfloat16); clean, they agree with no warning."""
    inputs = (torch.randn(4, 6, generator=torch.Generator().manual_seed(135)),)
    with dc.quiet():
        report = onnx_bisect.bisect(model().eval(), inputs)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status.value == "diverged"]


class _Mix(torch.nn.Module):
    """A query-key mixing block with ops of its own (a scaled softmax of q·kᵀ)."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return x + torch.softmax(self.q(x) @ self.k(x).transpose(-1, -2) * 0.5, -1) @ x


class _Steps(torch.nn.Module):
    """One _Mix shared by three steps, each step's list holding it (TabNet's layout): steps.1.0 is steps.0.0."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        shared = _Mix()
        self.steps = torch.nn.ModuleList(torch.nn.ModuleList([shared, torch.nn.Linear(8, 8)]) for _ in range(3))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        for mix, ff in self.steps:
            x = x + torch.tanh(ff(mix(x)))
        return self.head(x)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_fault_in_the_second_call_of_a_block_shared_under_three_names_is_owned_by_that_call(exporter):
    """Each call of a block registered under three names is recorded once (it was recorded under every name,
    three times), and the dynamo exporter's scope of the name a call was reached through (steps.1.0) is that
    block's: the Softmax of its second call, given the wrong axis, is owned by the block's second call, not by a
    child module of another name's record."""
    model = _Steps().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(4)),)
    with dc.quiet():
        capture = capture_activations(model, ModelInputs(inputs))
    assert [a.call for a in capture.activations if a.module == "steps.0.0"] == [0, 1, 2]
    assert not [a for a in capture.activations if a.module.startswith(("steps.1.0", "steps.2.0"))]
    proto = dc.export(model, inputs, exporter)
    target = [n for n in proto.graph.node if n.op_type == "Softmax"][1]
    del target.attribute[:]
    target.attribute.append(onnx.helper.make_attribute("axis", 1))
    fd = _bisect(model, inputs, proto)
    _found(fd, target.name, cause="attribute-mismatch")
    assert (fd.layer.pair.activation.module, fd.layer.pair.activation.call) == ("steps.0.0", 1), fd.layer.pair


def test_a_module_output_the_file_prunes_is_not_paired_with_a_tensor_no_output_reads():
    """ViTMAE's embedding returns the kept patches and the mask of those dropped; nothing downstream reads the
    mask, so the file prunes it, keeping the unused values of the TopK sorting the noise it came from.  The mask
    was paired by scope with those values and measured as a hidden fault of the embedding ('the outputs agree,
    but 2 layers introduce error'): a tensor no graph output is computed from is no layer's output to measure."""
    import sweep_models
    model, inputs = sweep_models.build("vitmae")
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status.value == "diverged"]


class _Decoder(torch.nn.Module):
    """Transposed convolutions each followed by a BatchNorm (a decoder's or a GAN generator's upsampling): the
    dynamo exporter folds each BatchNorm into its ConvTranspose, whose weight is (in, out/groups, k...)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(138)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up, self.bn = torch.nn.ConvTranspose2d(8, 6, 4, stride=2, padding=1), torch.nn.BatchNorm2d(6)
        self.up1, self.bn1 = torch.nn.ConvTranspose1d(6, 4, 3, padding=1, groups=2), torch.nn.BatchNorm1d(4)
        with torch.no_grad():
            for bn in (self.bn, self.bn1):
                bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2)
                bn.weight.uniform_(0.5, 1.5), bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = torch.relu(self.bn(self.up(torch.relu(self.conv(x)))))
        return self.bn1(self.up1(y.mean(3)))


def _refold(proto, node, bn, eps=None, noise=None):
    """The ConvTranspose ``node``'s folded weight and bias refolded with ``eps`` (or its weight given 5 % noise)."""
    from onnx import numpy_helper
    inits = {i.name: i for i in proto.graph.initializer}
    w = numpy_helper.to_array(inits[node.input[1]]).astype(np.float64)
    if noise is not None:
        w = w * (1 + 0.05 * np.random.default_rng(noise).standard_normal(w.shape))
    else:
        var = bn.running_var.detach().double().numpy()
        f = np.sqrt(var + bn.eps) / np.sqrt(var + eps)  # the fold's scale made γ/√(var+eps')
        g, (cin, cog) = node_groups(node), w.shape[:2]
        w = (w.reshape(g, cin // g, cog, -1) * f.reshape(g, 1, cog, 1)).reshape(w.shape)
        b = numpy_helper.to_array(inits[node.input[2]]).astype(np.float64)
        beta = bn.bias.detach().double().numpy()
        inits[node.input[2]].CopyFrom(numpy_helper.from_array(((b - beta) * f + beta).astype(np.float32), node.input[2]))
    inits[node.input[1]].CopyFrom(numpy_helper.from_array(w.astype(np.float32), node.input[1]))
    return proto


def node_groups(node):
    return next((a.i for a in node.attribute if a.name == "group"), 1)


@pytest.mark.parametrize("which", [0, 1], ids=["convtranspose2d", "convtranspose1d-grouped"])
@pytest.mark.parametrize("fault", ["eps", "noise"])
def test_a_batchnorm_folded_into_a_transposed_convolution_is_refolded_per_output_channel(which, fault):
    """A BatchNorm folded into a ConvTranspose with eps 0.1 is a batchnorm-fold fault naming the epsilon, and 5 %
    noise in the folded weight a weight mismatch against the fold, each confirmed by re-running: the fold scales
    a transposed convolution's axis 1 (per group), and the folded weight keeps the conv's parameter name.  Both
    were compared with the raw weight: weight-mismatch, unconfirmed.  The clean file warns of nothing."""
    model = _Decoder().eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(139)),)
    proto = dc.export(model, inputs, "dynamo")
    with dc.quiet():
        clean = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert clean.ok and not clean.warnings, clean.warnings
    node = [n for n in proto.graph.node if n.op_type == "ConvTranspose"][which]
    bn = (model.bn, model.bn1)[which]
    bad = _refold(proto, node, bn, eps=0.1) if fault == "eps" else _refold(proto, node, bn, noise=140)
    fd = _bisect(model, inputs, bad)
    if fault == "eps":
        evidence = _found(fd, node.name, cause="batchnorm-fold")
        assert evidence["mistake"] == "epsilon" and abs(evidence["fitted_epsilon"] - 0.1) < 1e-3, evidence
    else:
        _found(fd, node.name, cause="weight-mismatch", at_most=1)
        assert f"vs fold({('up', 'up1')[which]}.weight, {('bn', 'bn1')[which]})" in fd.explanation, fd.explanation


def test_a_mask_fill_value_changed_is_not_read_as_batch_mixing():
    """A graph attention layer's masked_fill(-inf) made -1: re-run one sample at a time from the segment's own
    feeds the softmax agreed, so the rows were said to be mixed ('batch-mixing', no node named, unconfirmed) —
    but the whole batch agrees from those feeds too: they are not what the local run fed.  The Where is named."""
    import sweep_models
    model, inputs = sweep_models.build("gat")
    proto = dc.export(model, inputs, "dynamo")
    consts = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    inits = {i.name: i for i in proto.graph.initializer}

    def is_neg_inf(t):
        value = (onnx.numpy_helper.to_array(consts[t].attribute[0].t) if t in consts
                 else onnx.numpy_helper.to_array(inits[t]) if t in inits else None)
        return value is not None and value.size == 1 and np.isneginf(value).all()
    where = next(n for n in proto.graph.node if n.op_type == "Where" and is_neg_inf(n.input[1]))
    minus_one = onnx.helper.make_tensor(where.input[1] + "_planted", onnx.TensorProto.FLOAT, [], [-1.0])
    proto.graph.initializer.append(minus_one)
    where.input[1] = minus_one.name
    fd = _bisect(model, inputs, proto)
    _found(fd, where.name, cause="attribute-mismatch")


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(141)
        self.fc1, self.fc2 = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _masked_after_relu(proto, mask: np.ndarray):
    """``proto`` with the first Relu's output multiplied by the constant ``mask`` (a Mul named planted_dropout)."""
    relu = next(n for n in proto.graph.node if n.op_type == "Relu")
    proto.graph.initializer.append(onnx.numpy_helper.from_array(mask.astype(np.float32), "planted_mask"))
    out = relu.output[0]
    for n in proto.graph.node:
        n.input[:] = [out + "_dropped" if t == out else t for t in n.input]
    mul = onnx.helper.make_node("Mul", [out, "planted_mask"], [out + "_dropped"], name="planted_dropout")
    proto.graph.node.insert(list(proto.graph.node).index(relu) + 1, mul)
    return proto


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_dropout_mask_frozen_into_the_graph_is_training_mode(exporter):
    """A Mul by a constant mask of zeros and 1/(1−p) after the ReLU (a Dropout traced in training mode, its random
    mask folded into a constant): named training-mode at that Mul, with p; removing it reproduces PyTorch."""
    model = _Mlp().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(142)),)
    proto = dc.export(model, inputs, exporter)
    keep = np.random.default_rng(143).random((3, 32)) >= 0.3
    fd = _bisect(model, inputs, _masked_after_relu(proto, keep / 0.7))
    evidence = _found(fd, "planted_dropout", cause="training-mode")
    assert evidence["active_dropout_nodes"] == ["planted_dropout"] and abs(evidence["dropout_ratios"][0] - 0.3) < 1e-3


class _Attention(torch.nn.Module):
    """Bidirectional single-head self-attention."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(144)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.out(torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1) @ v)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_causal_mask_added_to_a_bidirectional_attention_is_named(exporter):
    """An Add of a constant upper-triangular −10000 mask inserted before the softmax of an attention PyTorch runs
    without one: the Add applies a constant PyTorch does not; leaving it out reproduces PyTorch."""
    model = _Attention().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(145)),)
    proto = dc.export(model, inputs, exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    mask = onnx.numpy_helper.from_array(np.triu(np.full((6, 6), -1e4, np.float32), 1), "planted_causal_mask")
    proto.graph.initializer.append(mask)
    scores = softmax.input[0]
    add = onnx.helper.make_node("Add", [scores, mask.name], [scores + "_masked"], name="planted_causal")
    softmax.input[0] = scores + "_masked"
    proto.graph.node.insert(list(proto.graph.node).index(softmax), add)
    fd = _bisect(model, inputs, proto)
    _found(fd, "planted_causal", cause="attribute-mismatch")
    assert "the constant operand not applied" in fd.explanation, fd.explanation


class _Heads(torch.nn.Module):
    """Two-head self-attention, heads split with view(b, s, h, d)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(148)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 8)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.reshape(b, s, 2, 4).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        y = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1) @ v
        return self.out(y.transpose(1, 2).reshape(b, s, 8))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_heads_split_column_major_are_named_at_the_reshape(exporter):
    """A head split done as (d h) instead of (h d): the Reshape splits the last axis into [4, 2] and a Transpose
    turns it back into [2, 4].  The Reshape splitting the axis the other way round, the Transpose left out,
    reproduces PyTorch: named at the Reshape, shown in the Transpose."""
    model = _Heads().eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(149)),)
    proto = dc.export(model, inputs, exporter)
    consts = {n.output[0]: n for n in proto.graph.node if n.op_type == "Constant"}
    inits = {i.name: i for i in proto.graph.initializer}

    def shape_of(t):
        return (onnx.numpy_helper.to_array(consts[t].attribute[0].t) if t in consts
                else onnx.numpy_helper.to_array(inits[t]) if t in inits else None)
    reshape = next(n for n in proto.graph.node if n.op_type == "Reshape" and shape_of(n.input[1]) is not None
                   and len(shape_of(n.input[1])) == 4 and list(shape_of(n.input[1])[2:]) == [2, 4])
    planted = onnx.numpy_helper.from_array(np.array([*shape_of(reshape.input[1])[:2], 4, 2], np.int64), "planted_dh")
    proto.graph.initializer.append(planted)
    reshape.input[1] = planted.name
    out = reshape.output[0]
    reshape.output[0] = out + "_dh"
    back = onnx.helper.make_node("Transpose", [out + "_dh"], [out], name="planted_back", perm=[0, 1, 3, 2])
    proto.graph.node.insert(list(proto.graph.node).index(reshape) + 1, back)
    fd = _bisect(model, inputs, proto)
    _found(fd, reshape.name, cause="attribute-mismatch")
    assert "planted_back" in fd.layer.segment and "split order" in fd.explanation, fd.explanation


def test_a_channel_dropout_mask_frozen_into_a_conv_net_is_training_mode():
    """A Dropout2d's mask frozen per channel (eight channels, one dropped, the rest times 8/7) after a Conv's
    ReLU: training-mode at the Mul (a mask of eight numbers; the removal of a constant operand also fits, and
    is left to this rule)."""
    torch.manual_seed(150)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, padding=1)).eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(151)),)
    proto = dc.export(model, inputs, "torchscript")
    keep = np.ones((1, 8, 1, 1))
    keep[0, 5] = 0
    fd = _bisect(model, inputs, _masked_after_relu(proto, keep * 8 / 7))
    _found(fd, "planted_dropout", cause="training-mode")
