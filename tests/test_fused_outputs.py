"""Files ONNX Runtime optimized offline: a node that carries a module's scope computes more than the module (a
FusedConv applying a functional LeakyReLU; a SkipLayerNormalization adding an embedding's position term, the
module's last Add).  The module is ``fused`` into that node — no false divergence on the clean file, and a
fault after it is still found."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import torch

import onnx_bisect
from onnx_bisect.records import Status

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
import plant  # noqa: E402


class _Tokens(torch.nn.Module):
    """A class token and a position embedding added to patch tokens (CLIP's vision embeddings)."""

    def __init__(self, d: int = 8, n: int = 16):
        super().__init__()
        self.cls, self.pos = torch.nn.Parameter(torch.randn(1, 1, d)), torch.nn.Parameter(torch.randn(1, n + 1, d))

    def forward(self, patches):
        return torch.cat([self.cls, patches], dim=1) + self.pos


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(31)
        self.conv, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 1)
        self.tokens, self.norm, self.head = _Tokens(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.conv2(torch.nn.functional.leaky_relu(self.conv(x), 0.1))
        return self.head(self.norm(self.tokens(h.flatten(2).transpose(1, 2))))


def _optimized(tmp_path, proto: onnx.ModelProto) -> onnx.ModelProto:
    onnx.save(proto, tmp_path / "plain.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "plain.onnx"), so, providers=["CPUExecutionProvider"])
    return onnx.load(tmp_path / "optimized.onnx")


def _export(model, x) -> onnx.ModelProto:
    buffer = io.BytesIO()
    with dc.quiet():
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    return onnx.load_from_string(buffer.getvalue())


def test_modules_fused_by_the_runtime_are_fused_not_diverged(tmp_path):
    model, x = _Model().eval(), torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(32))
    optimized = _optimized(tmp_path, _export(model, x))
    ops = {n.op_type for n in optimized.graph.node}
    assert {"FusedConv", "SkipLayerNormalization"} <= ops, ops
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=optimized)
    assert report.ok and not report.warnings, report.warnings
    rows = {r.pair.activation.module: r for r in report.layers}
    assert rows["conv"].status is Status.FUSED and rows["conv"].pair.op_type == "FusedConv"
    assert rows["tokens"].status is Status.FUSED and rows["tokens"].pair.op_type == "SkipLayerNormalization"


def test_a_fault_after_a_module_fused_by_the_runtime_is_found(tmp_path):
    model, x = _Model().eval(), torch.randn(1, 3, 4, 4, generator=torch.Generator().manual_seed(32))
    optimized = _optimized(tmp_path, _export(model, x))
    conv2 = next(n for n in optimized.graph.node if n.op_type == "Conv")
    bad = plant.perturb_initializer(optimized, conv2.input[1], rel=0.3)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert not report.ok and conv2.name in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation


class _Encoder(torch.nn.Module):
    """A post-norm BERT-style feed-forward block twice: Linear → GELU → Linear, residual Add, LayerNorm."""

    def __init__(self, d: int = 16):
        super().__init__()
        torch.manual_seed(33)
        self.fc1, self.fc2 = torch.nn.ModuleList(torch.nn.Linear(d, 4 * d) for _ in range(2)), \
            torch.nn.ModuleList(torch.nn.Linear(4 * d, d) for _ in range(2))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(2))

    def forward(self, x):
        for fc1, fc2, norm in zip(self.fc1, self.fc2, self.norms):
            x = norm(x + fc2(torch.nn.functional.gelu(fc1(x))))
        return x


def _transformer_fused(tmp_path, proto: onnx.ModelProto) -> onnx.ModelProto:
    """ONNX Runtime's transformer optimizer (its Python fusions only): BiasGelu, SkipLayerNormalization."""
    from onnxruntime.transformers.optimizer import optimize_model

    onnx.save(proto, tmp_path / "plain.onnx")
    with dc.quiet():
        fused = optimize_model(str(tmp_path / "plain.onnx"), model_type="bert", num_heads=0, hidden_size=0,
                               opt_level=0)
    fused.save_model_to_file(str(tmp_path / "fused.onnx"))  # as users ship it (the com.microsoft opset declared)
    return onnx.load(tmp_path / "fused.onnx")


def test_a_linear_whose_bias_the_transformer_optimizer_moved_into_the_next_op_is_fused(tmp_path):
    """The optimizer fuses a Linear's bias Add into the BiasGelu / SkipLayerNormalization after it: the MatMul
    tensor carrying the Linear's scope holds its value less the bias. A clean file: no divergence, no warning;
    noise on a fused Linear's weight: found there."""
    model, x = _Encoder().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(34))
    fused = _transformer_fused(tmp_path, _export(model, x))
    ops = {n.op_type for n in fused.graph.node}
    assert {"BiasGelu", "SkipLayerNormalization"} <= ops, ops
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=fused)
    assert report.ok and not report.warnings, report.warnings
    rows = {r.pair.activation.module: r for r in report.layers}
    assert rows["fc1.0"].status is Status.FUSED and rows["fc1.0"].pair.op_type == "BiasGelu"
    assert rows["fc2.1"].status is Status.FUSED and rows["fc2.1"].pair.op_type == "SkipLayerNormalization"
    matmul = next(n for n in fused.graph.node if n.op_type == "MatMul" and n.output[0] in
                  {i for m in fused.graph.node if m.op_type == "SkipLayerNormalization" for i in m.input}
                  and "fc2.1" in n.name)
    bad = plant.perturb_initializer(fused, matmul.input[1], rel=0.3)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert not report.ok and matmul.name in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation


class _Mixer(torch.nn.Module):
    """A Linear, a softmax over the features, a Linear into a residual LayerNorm (its bias fused into the
    SkipLayerNormalization by the transformer optimizer)."""

    def __init__(self, d: int = 16):
        super().__init__()
        torch.manual_seed(35)
        self.fc1, self.fc2, self.norm = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.fc2(torch.softmax(self.fc1(x) * 3.0, dim=-1)))


def test_a_fault_before_a_linear_whose_bias_was_fused_is_found_against_the_linears_value(tmp_path):
    """Downstream of a fault no value tells the fused bias, but the fused node's bias input is the Linear's own
    bias parameter: the Linear is fused there, and the Softmax's wrong axis is found (unknown before: the
    segment was compared at the bias-less MatMul)."""
    model, x = _Mixer().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(36))
    fused = _transformer_fused(tmp_path, _export(model, x))
    assert "SkipLayerNormalization" in {n.op_type for n in fused.graph.node}
    softmax = next(n for n in fused.graph.node if n.op_type == "Softmax")
    bad = plant.set_attribute(fused, softmax.name, "axis", 1)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.layer.segment == (softmax.name,), fd.layer.segment
    rows = {r.pair.activation.module: r for r in report.layers}
    assert rows["fc2"].status is Status.FUSED, rows["fc2"]


class _Attention(torch.nn.Module):
    """Bias-free projections around many functional ops of the output's size (an attention block's reshapes)."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.q_proj, self.o_proj = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        h = self.q_proj(x)
        for k in range(10):
            h = torch.tanh(h) * (1.0 + 0.1 * k)
        return self.o_proj(h)


class _Scaled(torch.nn.Module):
    """A residual multiplier after the attention block (Granite): ONNX Runtime folds it into o_proj's MatMul as a
    FusedMatMul's alpha, so no tensor holds o_proj's (or the attention's) own value."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(33)
        self.attn, self.head = _Attention(), torch.nn.Linear(16, 4, bias=False)

    def forward(self, x):
        return self.head(x + self.attn(x) * 0.22)


def test_a_product_whose_scale_after_it_the_runtime_folded_is_fused(tmp_path):
    model, x = _Scaled().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(34))
    optimized = _optimized(tmp_path, _export(model, x))
    fused = [n for n in optimized.graph.node if n.op_type == "FusedMatMul"]
    # the Mul after o_proj (and the last ×1.9 before it) folded into its alpha
    assert fused and any(abs(a.f - 1.0) > 0.1 for n in fused for a in n.attribute if a.name == "alpha"), fused
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=optimized)
    assert report.ok and not report.warnings, report.warnings
    rows = {r.pair.activation.name: r for r in report.layers}
    for name in ("attn.o_proj", "attn"):
        assert rows[name].status is Status.FUSED and rows[name].pair.op_type == "FusedMatMul", rows[name]
    assert not [r for r in report.layers if r.status is Status.DIVERGED]


class _GPTJ(torch.nn.Module):
    """GPT-J (transformers, random weights): attention and MLP read one LayerNorm and both add to the residual;
    ONNX Runtime sums the last block's residual inside the final norm's SkipLayerNormalization."""

    def __init__(self):
        super().__init__()
        from transformers import GPTJConfig, GPTJModel

        torch.manual_seed(35)
        self.model = GPTJModel(GPTJConfig(vocab_size=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=4,
                                          n_positions=64, n_inner=64))

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def _in_float16(proto: onnx.ModelProto, name: str) -> onnx.ModelProto:
    """``name`` (a LayerNormalization) computing in float16 between Casts, as a converter that keeps one node in
    half precision writes it."""
    from onnx import TensorProto, helper

    out = onnx.ModelProto()
    out.CopyFrom(proto)
    nodes = list(out.graph.node)
    i, node = next((i, n) for i, n in enumerate(nodes) if n.name == name)
    casts = [helper.make_node("Cast", [t], [f"{t}_h"], to=TensorProto.FLOAT16, name=f"{name}_in{k}")
             for k, t in enumerate(node.input)]
    back = helper.make_node("Cast", [f"{node.output[0]}_h"], [node.output[0]], to=TensorProto.FLOAT,
                            name=f"{name}_out")
    node.input[:] = [c.output[0] for c in casts]
    node.output[0] = back.input[0]
    nodes[i:i + 1] = casts + [node, back]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_a_block_whose_residual_add_the_runtime_fused_is_not_blamed_downstream_of_a_fault(tmp_path):
    """The block's last Add is summed inside a SkipLayerNormalization; downstream of a LayerNorm computing in
    float16 the sum no longer holds the block's value within float noise, but far nearer than the tensor before
    it (which lacks the residual): the block stays fused, and the LayerNorm is named."""
    model, x = _GPTJ().eval(), torch.randint(0, 128, (1, 16), generator=torch.Generator().manual_seed(36))
    optimized = _optimized(tmp_path, _export(model, x))
    assert "SkipLayerNormalization" in {n.op_type for n in optimized.graph.node}
    ln = next(n.name for n in optimized.graph.node if n.op_type == "LayerNormalization" and "h.1/" in n.name)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=_in_float16(optimized, ln))
    fd = report.first_divergence
    assert fd is not None and fd.layer.pair.activation.module == "model.h.1.ln_1", fd.layer.pair
    assert ln in fd.layer.segment and len(fd.layer.segment) <= 5, fd.layer.segment
    assert fd.cause == "precision" and fd.confirmed is True, fd.explanation


def test_two_layers_weights_exchanged_before_a_skip_layer_norm_are_named(tmp_path):
    """ESM (transformers, random weights) through ONNX Runtime's transformer optimizer: each layer's output dense
    has its bias and the residual summed inside a SkipLayerNormalization. The two layers' output weights exchanged
    (a loader matching parameters by shape): downstream of the first, the fused sum still holds the block's value
    computed from its child's PyTorch value, so the block stays fused, and the weight is named by the module whose
    node reads it."""
    import sweep_models

    model, inputs = sweep_models.build("esm")
    fused = _transformer_fused(tmp_path, dc.export(model, inputs, "torchscript"))
    products = [n for n in fused.graph.node if n.op_type == "MatMul" and n.name.endswith("/output/dense/MatMul")
                and "attention" not in n.name]
    assert len(products) == 2, [n.name for n in products]
    arrays = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
    a, b = products[0].input[1], products[1].input[1]
    for init in fused.graph.initializer:
        if init.name in (a, b):
            init.CopyFrom(onnx.numpy_helper.from_array(arrays[b if init.name == a else a], init.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=fused)
    fd = report.first_divergence
    assert fd is not None and products[0].name in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert "layer.1.output.dense.weight" in fd.explanation, fd.explanation


class _Gate(torch.nn.Module):
    """A squeeze-excitation gate: a Conv and a Hardsigmoid, which ONNX Runtime fuses into one FusedConv."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(37)
        self.conv, self.gate = torch.nn.Conv2d(4, 4, 1), torch.nn.Hardsigmoid()
        self.out = torch.nn.Conv2d(4, 2, 3, padding=1)

    def forward(self, x):
        return self.out(x * self.gate(self.conv(x)))


def test_a_fused_hardsigmoid_with_other_parameters_is_named(tmp_path):
    model, x = _Gate().eval(), torch.randn(1, 4, 5, 5, generator=torch.Generator().manual_seed(38)) * 3
    optimized = _optimized(tmp_path, _export(model, x))
    node = next(n for n in optimized.graph.node if n.op_type == "FusedConv" and any(
        a.name == "activation" and a.s == b"HardSigmoid" for a in n.attribute))
    for a in node.attribute:
        if a.name == "activation_params":
            a.floats[:] = [0.2, 0.5]
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=optimized).first_divergence
    assert fd is not None and node.name in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True and "hardsigmoid" in fd.explanation
