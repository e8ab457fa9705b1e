"""Align stage: fusions, folded scales, containers, ambiguous scopes and loose pairs.

The first tests build small graphs by hand and call the align stage directly
(no runtime); the later ones debug real exports rewritten by onnxslim and
ONNX Runtime's offline optimizer.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import onnx_bisect
from onnx_bisect import align
from onnx_bisect.source import graph, onnx_file
from onnx_bisect.records import Activation, Capture, MatchMethod, Status
from onnx_bisect.report.text import leaf_coverage

import rewrites
from archs import build

RNG = np.random.default_rng(0)


# ----------------------------------------------------------------- hand-made graphs

def _graph(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in inputs],
                          [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits])
    return graph.index_graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _acts(*specs):
    """Activations from ``(module, type, value, inputs, is_leaf)`` tuples, in call order."""
    return tuple(Activation(index=i, module=m, module_type=t, call=0, path="", value=v, is_leaf=leaf, inputs=ins)
                 for i, (m, t, v, ins, leaf) in enumerate(specs))


def _align(acts, index, values, outputs=None):
    capture = Capture(activations=acts, outputs=tuple(outputs or ()), output_names=())
    scopes = align.map_scopes(capture, index)
    return {p.activation.module: p for p in align.align_activations(capture, index, scopes, values)}


def test_a_choice_between_scope_tensors_needs_a_value_that_supports_it():
    """Two tensors of the block's shape leave its scope: the one holding its value wins; when
    neither does (an optimizer fused the real output away) there is no pair, not a diverged one."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    index = _graph([helper.make_node("MatMul", ["x", "w"], ["/block/MatMul_output_0"], name="/block/MatMul"),
                    helper.make_node("Relu", ["/block/MatMul_output_0"], ["/block/Relu_output_0"], name="/block/Relu"),
                    helper.make_node("Add", ["/block/MatMul_output_0", "/block/Relu_output_0"], ["y"], name="/Add")],
                   ["x"], ["y"], [("w", w)])
    h = x @ w
    values = {"/block/MatMul_output_0": h, "/block/Relu_output_0": np.maximum(h, 0), "y": h + np.maximum(h, 0)}
    good = _align(_acts(("block", "Block", np.maximum(h, 0), (), True), ("", "Model", values["y"], (0,), False)),
                  index, values)
    assert good["block"].tensor == "/block/Relu_output_0"
    bad = _align(_acts(("block", "Block", 2 * h + 1, (), True), ("", "Model", values["y"], (0,), False)), index, values)
    assert bad["block"].tensor is None and bad["block"].method is MatchMethod.NONE
    assert "none holds its value" in bad["block"].note


def test_a_container_shares_its_childs_tensor_instead_of_another_copy():
    """An optimizer copied a tensor for each consumer; the container returning its child's tensor
    must not take a later copy, or the modules reading it could not be matched before that copy."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    wq, wk = (RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    shape = np.array([4, 8], np.int64)
    index = _graph([helper.make_node("Relu", ["x"], ["r"], name="n0"),
                    helper.make_node("Reshape", ["r", "shape"], ["copy1"], name="n1"),
                    helper.make_node("MatMul", ["copy1", "wk"], ["k"], name="n2"),
                    helper.make_node("Reshape", ["r", "shape"], ["copy2"], name="n3"),
                    helper.make_node("MatMul", ["copy2", "wq"], ["q"], name="n4"),
                    helper.make_node("Add", ["q", "k"], ["y"], name="n5")],
                   ["x"], ["y"], [("wq", wq), ("wk", wk), ("shape", shape)])
    r = np.maximum(x, 0)
    values = {"copy2": r, "copy1": r, "r": r, "k": r @ wk, "q": r @ wq, "y": r @ wq + r @ wk}
    acts = _acts(("emb.act", "ReLU", r, (), True), ("emb", "Embeddings", r, (0,), False),
                 ("q", "Linear", r @ wq, (1,), True), ("k", "Linear", r @ wk, (1,), True),
                 ("", "Model", values["y"], (2, 3), False))
    pairs = _align(acts, index, values)
    assert pairs["emb"].tensor == pairs["emb.act"].tensor == "r"
    assert pairs["q"].tensor == "q" and pairs["k"].tensor == "k"


def test_a_graph_output_taken_by_the_model_does_not_block_the_last_leaf():
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    index = _graph([helper.make_node("Relu", ["x"], ["y"], name="n0")], ["x"], ["y"])
    y = np.maximum(x, 0)
    pairs = _align(_acts(("act", "ReLU", y.copy(), (), True), ("", "Model", y.copy(), (0,), False)), index, {"y": y})
    assert pairs["act"].tensor == "y" and pairs["act"].method is MatchMethod.STRUCTURE


def _conv_graph(with_conv: bool):
    x = RNG.standard_normal((1, 3, 6, 6)).astype(np.float32)
    k = RNG.standard_normal((4, 3, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], name="node_Conv_0")] if with_conv else \
        [helper.make_node("Identity", ["x"], ["c"], name="node_Identity_0")]
    nodes.append(helper.make_node("Relu", ["c"], ["y"], name="node_Relu_1"))
    conv = np.einsum("oi,bihw->bohw", k[:, :, 0, 0], x) if with_conv else x
    scale = np.linspace(0.5, 2.0, conv.shape[1], dtype=np.float32)[None, :, None, None]
    return _graph(nodes, ["x"], ["y"], [("k", k)]), conv, scale


def test_conv_folded_with_its_batchnorm_is_fused_into_the_conv_node():
    index, conv, scale = _conv_graph(with_conv=True)
    bn = conv * scale  # the graph's Conv computes the BatchNorm's output: its kernel holds the fold
    values = {"c": bn, "y": np.maximum(bn, 0)}
    acts = _acts(("conv", "Conv2d", conv, (), True), ("bn", "BatchNorm2d", bn, (0,), True),
                 ("relu", "ReLU", np.maximum(bn, 0), (1,), True), ("", "Model", values["y"], (2,), False))
    pairs = _align(acts, index, values, outputs=[values["y"]])
    assert pairs["bn"].tensor == "c" and pairs["bn"].method is MatchMethod.STRUCTURE
    assert pairs["conv"].method is MatchMethod.FUSED and pairs["conv"].tensor is None
    assert pairs["conv"].node == "node_Conv_0" and "folded into node_Conv_0" in pairs["conv"].note


def test_a_module_is_not_declared_fused_into_nodes_that_cannot_compute_it():
    """No Conv between the input and the BatchNorm's tensor: the Conv2d's computation is missing,
    not fused (the module→op table decides)."""
    index, x, scale = _conv_graph(with_conv=False)
    values = {"c": x * scale, "y": np.maximum(x * scale, 0)}
    acts = _acts(("conv", "Conv2d", x * 3.0 + 1.0, (), True), ("bn", "BatchNorm2d", x * scale, (0,), True),
                 ("", "Model", values["y"], (1,), False))
    pairs = _align(acts, index, values, outputs=[values["y"]])
    assert pairs["bn"].tensor == "c"
    assert pairs["conv"].method is MatchMethod.NONE


def _chain(fault: float):
    """x → MatMul → Relu → MatMul without scope names; the first weight off by ``fault`` (relative)."""
    x = RNG.standard_normal((6, 8)).astype(np.float32)
    w1, w2 = (RNG.standard_normal((8, 8)).astype(np.float32) for _ in range(2))
    bad = w1 * (1 + fault * np.random.default_rng(1).standard_normal(w1.shape).astype(np.float32))
    index = _graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="node_MatMul_0"),
                    helper.make_node("Relu", ["h"], ["r"], name="node_Relu_1"),
                    helper.make_node("MatMul", ["r", "w2"], ["y"], name="node_MatMul_2")],
                   ["x"], ["y"], [("w1", bad), ("w2", w2)])
    h, hb = x @ w1, x @ bad
    values = {"h": hb, "r": np.maximum(hb, 0), "y": np.maximum(hb, 0) @ w2}
    ref_y = np.maximum(h, 0) @ w2
    acts = _acts(("fc1", "Linear", h, (), True), ("act", "ReLU", np.maximum(h, 0), (0,), True),
                 ("fc2", "Linear", ref_y, (1,), True), ("dead", "Linear", RNG.standard_normal((6, 8)).astype(np.float32),
                                                         (), True),
                 ("", "Model", ref_y.copy(), (2,), False))
    return _align(acts, index, values, outputs=[ref_y])


def test_without_scopes_a_fault_still_gets_its_own_segment():
    """Downstream of a fault no tensor equals its activation: while the outputs diverge, the
    nearest value after the inputs pairs (cuttable), so the fault is located at its own node."""
    pairs = _chain(fault=0.05)
    for module, tensor in (("fc1", "h"), ("act", "r"), ("fc2", "y")):
        p = pairs[module]
        assert p.tensor == tensor and p.method is MatchMethod.STRUCTURE and p.cuttable, (module, p)
    assert pairs["fc1"].confidence < 1.0 and "outputs diverge" in pairs["fc1"].note
    assert pairs["dead"].tensor is None


def test_clean_graph_without_scopes_pairs_exact_values_only():
    pairs = _chain(fault=0.0)
    assert all(pairs[m].confidence > 0.99 for m in ("fc1", "act", "fc2"))
    assert pairs["dead"].tensor is None, "a module the graph does not compute must not take a nearby tensor"


def test_checker_errors_about_ops_onnx_does_not_know_are_left_to_the_runtime():
    """ONNX Runtime writes SimplifiedLayerNormalization into the default domain of files it optimizes."""
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], ["y"], name="sln", axis=-1, epsilon=1e-6)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [numpy_helper.from_array(np.ones(4, np.float32), "scale")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    assert onnx_file.validate_onnx(model, "test model").graph.node[0].op_type == "SimplifiedLayerNormalization"


# ----------------------------------------------------------------- rewritten exports

class LayerScale(nn.Module):
    """A Linear times a learned per-channel scale (ConvNeXt's layer scale) in a residual block."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.gamma = nn.Parameter(torch.linspace(0.1, 2.0, 16))
        self.drop_path = nn.Identity()
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        y = self.gamma * self.fc(x)
        return self.norm(x + self.drop_path(y.permute(0, 2, 1)).permute(0, 2, 1))


class ScaledQuery(nn.Module):
    """Attention whose query is scaled by a constant after its projection."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):
        q = self.q(x) * 0.35
        return self.o(torch.softmax(q @ self.k(x).transpose(1, 2), -1) @ self.v(x))


def _small(cls):
    torch.manual_seed(0)
    return cls().eval(), (torch.randn(2, 8, 16),)


def _rows(report):
    return {r.pair.activation.module: r for r in report.layers}


def _assert_clean(report):
    assert report.ok
    assert not [r.pair.activation.name for r in report.layers if r.status is Status.DIVERGED]


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_layer_scale_folded_into_the_matmul_is_fused_not_diverged(exporter):
    """onnxslim multiplies gamma into the Gemm's weights: the Linear's output is never computed."""
    model, inputs = _small(LayerScale)
    proto = rewrites.slim(rewrites.export(model, inputs, exporter))
    report = onnx_bisect.bisect(model, inputs, onnx=proto)
    _assert_clean(report)
    fc = _rows(report)["fc"]
    assert fc.status is Status.FUSED and fc.pair.op_type == "Gemm" and "a factor per channel" in fc.pair.note
    assert _rows(report)["drop_path"].status is Status.MATCHED


def test_a_fault_in_the_folded_matmul_is_not_taken_for_a_fold():
    model, inputs = _small(LayerScale)
    proto = rewrites.slim(rewrites.export(model, inputs, "torchscript"))
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    report = onnx_bisect.bisect(model, inputs, onnx=rewrites.perturb(proto, gemm.input[1], 0.05))
    assert not report.ok and report.first_divergence.introduced
    assert report.first_divergence.layer.pair.activation.module == "fc"
    assert gemm.name in report.first_divergence.layer.segment


def test_attention_scale_folded_into_the_query_projection_is_fused():
    model, inputs = _small(ScaledQuery)
    report = onnx_bisect.bisect(model, inputs, onnx=rewrites.slim(rewrites.export(model, inputs, "torchscript")))
    _assert_clean(report)
    q = _rows(report)["q"]
    assert q.status is Status.FUSED and "one factor 0.35" in q.pair.note


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_conv_batchnorm_relu_in_one_fused_conv_are_fused(exporter):
    """ONNX Runtime's offline optimizer turns Conv(+folded BN)+Relu into one FusedConv."""
    model, inputs = build("cnn")
    proto = rewrites.ort_optimized(rewrites.export(model, inputs, exporter), "extended")
    assert any(n.op_type == "FusedConv" for n in proto.graph.node)
    report = onnx_bisect.bisect(model, inputs, onnx=proto)
    _assert_clean(report)
    rows = _rows(report)
    for conv, bn, relu in (("conv1", "bn1", "relu1"), ("conv2", "bn2", "relu2")):
        assert rows[conv].status is Status.FUSED and rows[conv].pair.op_type == "FusedConv"
        assert rows[bn].status is Status.FUSED and rows[bn].pair.op_type == "FusedConv"
        assert rows[relu].pair.tensor is not None and rows[relu].diff.ok
    aligned, total, absent = leaf_coverage(report.layers)
    assert (aligned, absent) == (total, 0)


def test_conv_batchnorm_fold_without_scopes_is_fused():
    model, inputs = build("cnn")
    report = onnx_bisect.bisect(model, inputs, onnx=rewrites.slim(rewrites.export(model, inputs, "dynamo")))
    _assert_clean(report)
    rows = _rows(report)
    assert rows["conv1"].status is Status.FUSED and rows["conv1"].pair.op_type == "Conv"
    assert rows["bn1"].pair.method is MatchMethod.STRUCTURE and rows["bn1"].diff.ok


def test_a_transposed_scope_tensor_is_not_taken_for_a_reshape_on_the_name_alone():
    """ONNX Runtime dropped the batch-first Transpose after a GRU: the scope exports the
    sequence-first tensor, whose elements are in another order."""
    seq_first = RNG.standard_normal((12, 2, 4)).astype(np.float32)
    index = _graph([helper.make_node("Relu", ["x"], ["/gru/Squeeze_output_0"], name="/gru/Squeeze"),
                    helper.make_node("Neg", ["/gru/Squeeze_output_0"], ["y"], name="/Neg")], ["x"], ["y"])
    values = {"/gru/Squeeze_output_0": seq_first, "y": -seq_first}
    batch_first = seq_first.transpose(1, 0, 2).copy()
    pairs = _align(_acts(("gru", "GRU", batch_first, (), True), ("", "Model", -batch_first, (0,), False)), index, values)
    assert pairs["gru"].tensor == "/gru/Squeeze_output_0" and pairs["gru"].perm == (1, 0, 2)
    merged = _align(_acts(("gru", "GRU", seq_first.reshape(1, 24, 4), (), True), ("", "Model", -seq_first, (0,), False)),
                    index, values)
    assert merged["gru"].tensor == "/gru/Squeeze_output_0" and merged["gru"].method is MatchMethod.SCOPE_NAME


def test_an_activation_folded_into_a_constant_is_absent_with_the_constant_named():
    """onnxslim folds position embeddings (which do not depend on the inputs) into an initializer."""
    x = RNG.standard_normal((1, 6, 8)).astype(np.float32)
    pos = RNG.standard_normal((1, 6, 8)).astype(np.float32)
    index = _graph([helper.make_node("Add", ["x", "folded"], ["y"], name="node_add")], ["x"], ["y"],
                   [("folded", pos)])
    acts = _acts(("pos", "Embedding", pos.copy(), (), True), ("", "Model", x + pos, (0,), False))
    capture = Capture(activations=acts, outputs=(x + pos,), output_names=())
    scopes = align.map_scopes(capture, index)
    assert "folded" in align.candidate_tensors(capture, index, scopes)
    pairs = _align(acts, index, {"y": x + pos, "folded": pos}, outputs=[x + pos])
    assert pairs["pos"].tensor is None and pairs["pos"].note.startswith(align.ABSENT)
    assert "the constant folded" in pairs["pos"].note
    leftover = _align(_acts(("pos", "Embedding", pos * 2, (), True), ("", "Model", x + pos, (0,), False)), index,
                      {"y": x + pos, "folded": pos}, outputs=[x + pos])
    assert not leftover["pos"].note.startswith(align.ABSENT), "a constant with other values proves nothing"


def test_an_output_nothing_reads_still_pairs_with_its_module():
    """A GRU's final state when the model uses only the sequence: the graph computes it (an RNN
    node's second output) but no node reads it, so it leaves the module's scope nowhere."""
    x = RNG.standard_normal((2, 8)).astype(np.float32)
    index = _graph([helper.make_node("Split", ["x"], ["/gru/Split_output_0", "/gru/Split_output_1"], name="/gru/Split",
                                     axis=0, num_outputs=2),
                    helper.make_node("Neg", ["/gru/Split_output_0"], ["/head/Neg_output_0"], name="/head/Neg")],
                   ["x"], ["/head/Neg_output_0"])
    seq, state = x[:1], x[1:]
    values = {"/gru/Split_output_0": seq, "/gru/Split_output_1": state, "/head/Neg_output_0": -seq}
    acts = tuple(Activation(index=i, module=m, module_type=t, call=0, path=path, value=v, inputs=ins)
                 for i, (m, t, path, v, ins) in enumerate([("gru", "GRU", "[0]", seq.copy(), ()),
                                                           ("gru", "GRU", "[1]", state.copy(), ()),
                                                           ("head", "Neg", "", -seq, (0,))]))
    capture = Capture(activations=acts, outputs=(-seq,), output_names=())
    pairs = align.align_activations(capture, index, align.map_scopes(capture, index), values)
    assert [p.tensor for p in pairs[:2]] == ["/gru/Split_output_0", "/gru/Split_output_1"]
    assert pairs[1].method is MatchMethod.SCOPE_NAME


@pytest.mark.parametrize("quantized", [True, False])
def test_a_scope_output_read_through_quantize_dequantize_is_judged_with_quantization_noise(quantized):
    """A QDQ file: the quantizer's nodes and the Split after them carry no scope, so the Linear's
    output is read by nodes of unknown scope and must agree in value: within quantization noise
    when it is quantized on its way, within float noise otherwise."""
    x = RNG.standard_normal((4, 8)).astype(np.float32)
    w = RNG.standard_normal((8, 8)).astype(np.float32)
    h = x @ w
    out = "/fc/Gemm_output_0"
    nodes = [helper.make_node("Gemm", ["x", "w"], [out], name="/fc/Gemm")]
    if quantized:
        nodes += [helper.make_node("QuantizeLinear", [out, "s"], ["q"], name="q"),
                  helper.make_node("DequantizeLinear", ["q", "s"], ["dq"], name="dq")]
    nodes.append(helper.make_node("Relu", ["dq" if quantized else out], ["y"], name="relu_fused"))
    index = _graph(nodes, ["x"], ["y"], [("w", w), ("s", np.array(0.05, np.float32))])
    noisy = h * (1 + 0.03 * np.random.default_rng(2).standard_normal(h.shape)).astype(np.float32)
    values = {out: h, "y": np.maximum(h, 0)}
    pairs = _align(_acts(("fc", "Linear", noisy, (), True), ("", "Model", np.maximum(noisy, 0), (0,), False)),
                   index, values)
    assert (pairs["fc"].tensor == out) is quantized


class _SharedBlock(nn.Module):
    """One block applied three times (ALBERT shares its layer this way): its earlier calls' outputs are read
    only inside its own scope, so the scope exports one tensor for three calls."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.LayerNorm(16))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return self.head(x)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_shared_block_is_not_paired_with_another_calls_tensor(exporter):
    model, x = _SharedBlock().eval(), torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    proto = rewrites.export(model, (x,), exporter)
    report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok
    assert not [(r.pair.activation.name, r.pair.activation.call) for r in report.layers
                if r.status is Status.DIVERGED], "a call paired with another call's tensor"
    last = [r for r in report.layers if r.pair.activation.module == "block" and r.pair.activation.call == 2]
    assert last and last[0].pair.tensor is not None  # the call whose tensor leaves the scope keeps it


@pytest.mark.parametrize("transformers_model", ["albert"])
def test_albert_shared_layer_clean_export_shows_no_divergence(transformers_model):
    from transformers import AlbertConfig, AlbertModel

    torch.manual_seed(0)
    m = AlbertModel(AlbertConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                                 num_attention_heads=2, intermediate_size=64, max_position_embeddings=32),
                    add_pooling_layer=False).eval()

    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids).last_hidden_state

    model, ids = Hidden().eval(), torch.randint(0, 100, (1, 8), generator=torch.Generator().manual_seed(1))
    report = onnx_bisect.bisect(model, (ids,), onnx=rewrites.export(model, (ids,), "torchscript"))
    assert report.ok and not [r.pair.activation.name for r in report.layers if r.status is Status.DIVERGED]


class _Residual(nn.Module):
    """Two residual Adds; ONNX Runtime fuses the second with the LayerNormalization after the block."""

    def __init__(self):
        super().__init__()
        self.ln1, self.fc1, self.ln2, self.fc2 = nn.LayerNorm(16), nn.Linear(16, 16), nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x):
        x = x + self.fc1(self.ln1(x))
        return x + self.fc2(self.ln2(x))


class _ResidualNet(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.block, self.norm, self.head = _Residual(), nn.LayerNorm(16), nn.Linear(16, 4)
        with torch.no_grad():  # fc2 adds little: the first Add is within 1e-3 of the block's output, not within noise
            self.block.fc2.weight.mul_(1e-3)
            self.block.fc2.bias.zero_()

    def forward(self, x):
        return self.head(self.norm(self.block(x)))


def test_a_container_is_not_paired_with_an_inner_tensor_its_children_come_after():
    """ONNX Runtime's SkipLayerNormalization absorbs the block's last Add: the only block-scoped tensor left is
    the first residual Add, computed before fc2 — not the block's output."""
    model, x = _ResidualNet().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    proto = rewrites.ort_optimized(rewrites.export(model, (x,), "torchscript"), "extended")
    assert "SkipLayerNormalization" in {n.op_type for n in proto.graph.node}
    report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok
    assert not [r.pair.activation.name for r in report.layers if r.status is Status.DIVERGED]
    block = next(r for r in report.layers if r.pair.activation.module == "block")
    assert block.pair.tensor is None or block.diff.ok


def test_a_node_scope_comes_from_its_output_unless_that_is_an_ancestor_of_its_name():
    """ONNX Runtime's FusedConv keeps the Conv's name and writes the Relu's output: the output says what it
    computes (a sibling's scope, or the parent's for a functional Relu). A quantizer that absorbed a functional
    Relu leaves a plain Conv writing the Relu's output, whose scope is the Conv's parent: the name is then the
    more exact."""
    from onnx_bisect.source.graph import index_graph

    nodes = [helper.make_node("Conv", ["x", "w"], ["/relu1/Relu_output_0"], name="/conv1/Conv"),
             helper.make_node("Conv", ["/relu1/Relu_output_0", "w2"], ["/enc1/Relu_output_0"], name="/enc1/conv1/Conv"),
             helper.make_node("FusedConv", ["/enc1/Relu_output_0", "w2"], ["/enc2/Relu_output_0"],
                              name="/enc2/conv1/Conv", domain="com.microsoft", activation="Relu")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("/enc2/Relu_output_0", TensorProto.FLOAT, None)],
                              [helper.make_tensor("w", TensorProto.FLOAT, [1, 1, 1, 1], [1.0]),
                               helper.make_tensor("w2", TensorProto.FLOAT, [1, 1, 1, 1], [1.0])])
    index = index_graph(helper.make_model(graph))
    assert [n.scope for n in index.nodes] == [("relu1",), ("enc1", "conv1"), ("enc2",)]  # FusedConv: its output


def test_a_weight_holds_a_layer_weight_divided_by_a_folded_factor_judged_by_its_squares():
    """``holds_divided``: a reader's weight is a PyTorch layer's weight over the factor a simplifier moved into it
    (GELU's 2), or noisy such (a faulty reader), but not the weight as it is, nor over another factor."""
    import numpy as np
    from onnx_bisect.align import holds_divided

    w = np.random.default_rng(0).standard_normal((16, 8))
    signatures = {"conv1": (w.size, float(w.sum()), float((w * w).sum()))}
    noisy = w / 2 + 0.3 * (w / 2).std() * np.random.default_rng(1).standard_normal(w.shape)
    assert holds_divided(signatures, w / 2, 2.0) and holds_divided(signatures, noisy, 2.0)
    assert not holds_divided(signatures, w, 2.0)
    assert not holds_divided(signatures, w / 2, 3.0)
    assert not holds_divided(signatures, w / 1.1, 1.1)  # too near 1 to tell
    assert not holds_divided(signatures, np.ones(12), 2.0)  # no layer of its size


def test_readers_through_look_past_the_given_ops_only_as_far_as_asked():
    """A BatchNormalization behind a Q/DQ pair is a reader of the Conv's tensor through the carriers (two hops),
    not through one; a Relu reading the tensor directly is found at once."""
    from onnx import helper as h

    from onnx_bisect.records.graph import CARRIER_OPS

    nodes = [h.make_node("QuantizeLinear", ["c", "s", "z"], ["q"], name="q"),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["d"], name="d"),
             h.make_node("BatchNormalization", ["d", "g", "b", "m", "v"], ["y"], name="bn"),
             h.make_node("Relu", ["c"], ["r"], name="relu")]
    index = graph.index_graph(h.make_model(h.make_graph(nodes, "g", [], [])))
    assert {n.name for n in index.readers_through("c", CARRIER_OPS, hops=2)} == {"bn", "relu"}
    assert {n.name for n in index.readers_through("c", CARRIER_OPS, hops=1)} == {"d", "relu"}
    assert {n.name for n in index.readers_through("c", frozenset(), hops=3)} == {"q", "relu"}
