"""Weight rule: initializers against the PyTorch parameters, by name or value, transposes and folds allowed."""
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
from test_diagnose_eleven import _weight_initializer  # noqa: E402
import plant  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose.rules.weight_mismatch import WeightMismatch  # noqa: E402


def test_renamed_transposed_weight_of_the_dynamo_exporter():
    report, _ = bisect_case(dc.weight("transformer", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True
    [row] = fd.evidence["parameters"]
    assert row["parameter"] == "blocks.1.fc1.weight" and row["layout"] == "transposed"
    assert 0.03 < row["rel_l2"] < 0.08 and row["correlation"] > 0.99


def test_perturbed_weight_of_a_folded_conv_is_compared_with_the_fold():
    report, _ = bisect_case(dc.weight("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True
    assert fd.evidence["parameters"][0]["parameter"] == "conv3.weight"


def test_silent_on_a_wrong_fold_and_on_equal_weights():
    _, ctx = bisect_case(dc.batchnorm_fold("cnn", "dynamo"))
    assert WeightMismatch().match(ctx) is None  # a per-channel rescale: the fold rule's case
    _, ctx = bisect_case(dc.gelu("mlp", "dynamo"))
    assert WeightMismatch().match(ctx) is None


class _Recurrent(__import__("torch").nn.Module):
    """A bidirectional LSTM and a 2-layer GRU: ONNX stacks the directions and orders the gates otherwise."""

    def __init__(self):
        import torch
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(6, 8, batch_first=True, bidirectional=True)
        self.gru = torch.nn.GRU(16, 8, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.lstm(x)
        z, _ = self.gru(y)
        return self.head(z)


def test_recurrent_weights_in_onnx_gate_order():
    """Every W/R/B of the exported LSTM and GRU nodes equals its parameters in ONNX layout (no false preflight
    report); a perturbed one is named, with the layer and the input it feeds, and the fix confirmed."""
    import torch
    import onnx_bisect
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rewrites

    model, x = _Recurrent().eval(), torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(1))
    proto = rewrites.export(model, (x,), "torchscript")
    clean = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert clean.ok and not [w for w in clean.warnings if "differ from the PyTorch" in w]
    rnn_inputs = [(n.op_type, n.input[2]) for n in proto.graph.node if n.op_type in ("LSTM", "GRU")]
    assert [op for op, _ in rnn_inputs] == ["LSTM", "GRU", "GRU"]
    for (op, recurrence), module, layer in zip(rnn_inputs, ("lstm", "gru", "gru"), (0, 0, 1)):
        report = onnx_bisect.bisect(model, (x,), onnx=rewrites.perturb(proto, recurrence, 0.3))
        fd = report.first_divergence
        assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed, (op, layer)
        [row] = fd.evidence["parameters"]
        assert row["parameter"] == f"rnn({module}, layer {layer}, R)", row
        assert fd.layer.pair.activation.module == module


def _bert_ort_extended():
    import onnx_bisect  # noqa: F401
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rewrites
    from archs import build

    model, x = build("bert")
    return model, x, rewrites.ort_optimized(rewrites.export(model, x, "dynamo"), "extended"), rewrites


def test_a_fault_in_a_folded_constant_is_compared_with_the_activation_it_was_folded_from():
    """The exporter folds the position embeddings of a fixed length into a constant: a stale one is a
    weight mismatch against that module's output, and restoring it is confirmed."""
    import onnx_bisect

    model, x, proto, rewrites = _bert_ort_extended()
    constant = next(w for w, _ in rewrites.weights(proto)
                    if any(i.name == w and list(i.dims)[-1] == 32 and i.dims[0] == 1 for i in proto.graph.initializer)
                    and rewrites.owner(model, proto, w) is None)
    fd = onnx_bisect.bisect(model, x, onnx=rewrites.perturb(proto, constant, 0.3)).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed
    [row] = fd.evidence["parameters"]
    assert row["parameter"].startswith("the output of bert.embeddings.") and "folded into a constant" in row["parameter"]


def test_a_weight_whose_module_output_was_fused_away_is_named_with_its_module():
    """ONNX Runtime fuses intermediate.dense with its GELU: the fault shows at output.dense, and the explanation
    says the weight belongs to intermediate.dense."""
    import onnx_bisect

    model, x, proto, rewrites = _bert_ort_extended()
    weight = next(w for w, _ in rewrites.weights(proto)
                  if rewrites.owner(model, proto, w) == "bert.encoder.layer.0.intermediate.dense")
    fd = onnx_bisect.bisect(model, x, onnx=rewrites.perturb(proto, weight, 0.3)).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed
    assert fd.evidence["parameters"][0]["parameter"] == "bert.encoder.layer.0.intermediate.dense.weight"
    if fd.layer.pair.activation.module != "bert.encoder.layer.0.intermediate.dense":
        assert "The weight belongs to bert.encoder.layer.0.intermediate.dense" in fd.explanation


def test_folds_found_by_the_weights_names_in_a_file_without_scopes(monkeypatch):
    """A file without scopes (onnxslim drops them) still names its folded Conv weights after the Conv: each
    one's BatchNorm fold is a candidate, so folds that differ from the Conv's own weight by the fold's factor
    (1/sqrt(1 + eps) with fresh running statistics: relative 5e-6) are not claimed as stale weights."""
    import torch

    from onnx_bisect.diagnose.context import DiagnosisContext
    from onnx_bisect.diagnose.support import layout

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 4)).eval()
    x = torch.randn(1, 3, 8, 8)
    proto = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    head = next(n for n in proto.graph.node if n.op_type == "Gemm")
    case = dc.Case("no-scopes", "weight-mismatch", "cnn", "dynamo", model, (x,),
                   dc.plant.perturb_initializer(proto, head.input[1], rel=0.05))
    _, ctx = bisect_case(case)
    folded = [n for n in proto.graph.node if n.op_type == "Conv"]
    assert all(n.input[1] in ("0.weight", "3.weight") for n in folded)
    monkeypatch.setattr(DiagnosisContext, "module_of", lambda self, node: (None, None))  # no scopes
    monkeypatch.setattr(DiagnosisContext, "segment_protos", property(lambda self: [
        p for p in self.onnx.skeleton.graph.node if p.op_type in ("Conv", "Gemm")]))
    pairs = {(conv, bn) for conv, _, bn, _ in layout.conv_bn_pairs(ctx)}
    assert pairs == {("0", "1"), ("3", "4")}
    candidates = layout.torch_candidates(ctx)
    for n in folded:
        value = ctx.initializer(n.input[1])
        assert any(layout.relate(value, c) is not None and layout.relate(value, c).equal for c in candidates.values())
    row = WeightMismatch().match(ctx).evidence["parameters"]
    assert [r["initializer"] for r in row] == [head.input[1]]  # the planted one alone


class _Attention(torch.nn.Module):
    """Query, key (no bias) and value projections of one input, as BEiT's."""

    def __init__(self, d: int = 16):
        super().__init__()
        torch.manual_seed(3)
        self.q, self.k, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return self.out(torch.softmax(q @ k.transpose(-1, -2) / 4.0, -1) @ v)


def test_a_merged_projection_weight_is_compared_with_the_concatenated_parameters():
    """A simplifier merges the three projections of one input into one MatMul and a Split (onnx-simplifier did
    so in BEiT): its weight is no single parameter but q, k and v's concatenated — compared with that, the
    noise in it is a weight-mismatch, confirmed by restoring the concatenation."""
    model, x = _Attention().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(4))
    proto = dc.export(model, (x,), "torchscript")
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    mms = [next(n for n in proto.graph.node if n.name == f"/{m}/MatMul") for m in ("q", "k", "v")]
    merged = np.concatenate([inits[n.input[1]] for n in mms], axis=1)
    merged = merged + np.random.default_rng(0).standard_normal(merged.shape).astype(np.float32) * 0.05
    proto.graph.initializer.append(numpy_helper.from_array(merged.astype(np.float32), "qkv_weight"))
    proto.graph.initializer.append(numpy_helper.from_array(np.array([16, 16, 16], np.int64), "qkv_split"))
    at = list(proto.graph.node).index(mms[0])
    for n in mms:
        proto.graph.node.remove(n)
    proto.graph.node.insert(at, helper.make_node("Split", ["qkv", "qkv_split"], [n.output[0] for n in mms],
                                                 name="Split_qkv", axis=-1))
    proto.graph.node.insert(at, helper.make_node("MatMul", [mms[0].input[0], "qkv_weight"], ["qkv"],
                                                 name="MatMul_qkv"))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert not report.ok and "MatMul_qkv" in fd.layer.segment, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["parameters"]
    assert row["initializer"] == "qkv_weight" and row["parameter"] == "concat(q.weight, k.weight, v.weight)"


def test_noise_on_a_folded_weight_found_at_an_op_compares_with_the_modules_fold(tmp_path):
    """PointNet (scripts/sweep_models.py) exported by TorchScript (its BatchNorm1d folded into the Conv1d),
    renamed, noise on the folded weight: the divergence narrows to the batch-norm op inside mlp2.1, and the
    weight is compared with fold(mlp2.0, mlp2.1) — the op's module's pair — not the bare Conv weight (an
    unconfirmed claim over a 19-node segment before)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import fault_sweep
    import sweep_models

    model, inputs = sweep_models.build("pointnet")
    with dc.quiet():
        proto = fault_sweep.export(model, inputs, "torchscript")
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    weight = convs[1].input[1]  # mlp2's folded kernel
    onnx.save(plant.perturb_initializer(proto, weight, rel=0.3), tmp_path / "bad.onnx")
    fault_sweep.rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=onnx.load(tmp_path / "renamed.onnx"))
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert "fold(mlp2.0.weight, mlp2.1)" in fd.explanation, fd.explanation
    assert len(fd.layer.segment) <= 2 and fd.layer.segment_ops[-1] == "Conv", fd.layer.segment


class _PlainConvs(torch.nn.Module):
    """Two plain Conv2d layers (called as modules: they read their weights as they are) with a ReLU between, the
    second followed by a BatchNorm (folded into it at export) or not."""

    def __init__(self, bn: bool):
        super().__init__()
        torch.manual_seed(211)
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4) if bn else torch.nn.Identity()
        if bn:
            with torch.no_grad():
                self.bn.running_mean.normal_(0.0, 0.3)
                self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return self.bn(self.conv2(torch.relu(self.conv1(x))))


def test_a_standardised_kernel_for_a_plain_conv_is_a_weight_mismatch_and_a_warning():
    """The second Conv's kernel standardised per output channel in the file (a StdConv2d's export, or a converter standardising it) where PyTorch's plain Conv2d reads its weight
    as it is: not the model's own numbers (a weight-standardised layer's folded constant would be) — named at the
    Conv and warned about.  (Not yet with a BatchNorm folded in: standardising undoes the fold's per-channel
    scale, so the kernel relates to the Conv's own weight as well as to the fold, and the weight restored may be
    the unfolded one — the reading is then named but not confirmed.)"""
    model, x = _PlainConvs(bn=False).eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(212))
    proto = dc.export(model, (x,), "dynamo")
    shape = tuple(model.conv2.weight.shape)
    init = next(i for i in proto.graph.initializer if tuple(i.dims) == shape)  # the kernel (with the fold)
    flat = numpy_helper.to_array(init).astype(np.float64).reshape(shape[0], -1)
    standardised = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-6))
    weight = standardised.reshape(shape)
    init.CopyFrom(numpy_helper.from_array(standardised.reshape(weight.shape).astype(np.float32), init.name))
    conv = next(n.name for n in proto.graph.node if init.name in n.input)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True and fd.layer.segment == (conv,), fd.explanation
    assert "conv2.weight" in fd.explanation and "standardised per output channel" in fd.explanation, fd.explanation
    assert [w for w in report.warnings if "conv2.weight" in w and "stale" in w], report.warnings


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("kernel", ["as-is", "standardised"])
def test_a_kernel_kept_in_a_constant_node_is_compared_and_fixed_as_a_weight(exporter, kernel):
    """The second Conv's kernel kept as a Constant node's value, not an initializer (onnx-simplifier leaves some
    folded weights so): as it is, the run is clean and nothing is warned about; standardised, it is a
    weight-mismatch named at the Conv, confirmed by putting the parameter back, and the stale-weight warning
    names it (before, the segment's weights held no kernel: cause unknown)."""
    model, x = _PlainConvs(bn=False).eval(), torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(214))
    proto = dc.export(model, (x,), exporter)
    shape = tuple(model.conv2.weight.shape)
    init = next(i for i in proto.graph.initializer if tuple(i.dims) == shape)
    value = numpy_helper.to_array(init).astype(np.float64)
    if kernel == "standardised":
        flat = value.reshape(shape[0], -1)
        value = ((flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-6)).reshape(shape)
    proto.graph.initializer.remove(init)
    proto.graph.node.insert(0, helper.make_node("Constant", [], [init.name], name="kernel_constant",
                                                value=numpy_helper.from_array(value.astype(np.float32))))
    conv = next(n.name for n in proto.graph.node if init.name in n.input and n.op_type == "Conv")
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    if kernel == "as-is":
        assert fd is None and not report.warnings, (fd, report.warnings)
        return
    assert fd.cause == "weight-mismatch" and fd.confirmed is True and fd.layer.segment == (conv,), fd.explanation
    assert "conv2.weight" in fd.explanation and "standardised per output channel" in fd.explanation, fd.explanation
    assert [w for w in report.warnings if "conv2.weight" in w and "stale" in w], report.warnings


class _Projections(torch.nn.Module):
    """Self-attention with separate q, k and v projections (``heads`` heads of 8), k without a bias (Whisper's)."""

    def __init__(self, heads: int, registered: str = "qkv"):
        super().__init__()
        torch.manual_seed(221)
        self.heads, d = heads, 8 * heads
        made = {"q": torch.nn.Linear(d, d), "k": torch.nn.Linear(d, d, bias=False), "v": torch.nn.Linear(d, d)}
        for name in registered:  # the order the model registers them (Whisper's: k, v, q), not the order they run
            setattr(self, name, made[name])
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):  # 1, 6, 8 · heads
        h, d = self.heads, 8 * self.heads
        q, k, v = (p(x).view(1, 6, h, 8).transpose(1, 2) for p in (self.q, self.k, self.v))
        w = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(1, 6, d))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript", "dynamo-fp16", "dynamo-renamed"])
@pytest.mark.parametrize("heads", [2, 3])
def test_projections_loaded_from_a_fused_weight_in_another_head_layout_are_named_together(exporter, heads,
                                                                                          tmp_path):
    """q, k and v filled from a fused [q; k; v] (blocks (3, H, d)) read as interleaved (H, 3, d): each file weight
    holds rows of the three (with two heads half its rows are its own layer's; with three a third, so it pairs
    with no parameter by value), and the biases alike (k's zeros among them). The first divergence is the query
    projection; the fix puts every layer's own rows back, so all three products (and the biases added) are
    named.  In a renamed file the products pair with no layer: they are taken in the order they run, the layers
    in the order PyTorch ran them — registered k, v, q (Whisper's order), beside an output projection of the same
    shape whose rows none of them holds."""
    model = _Projections(heads, "kvq" if exporter.endswith("renamed") else "qkv").eval()
    d = 8 * heads
    x = torch.randn(1, 6, d, generator=torch.Generator().manual_seed(222))
    proto = dc.export(model, (x,), exporter.split("-")[0])
    layers = (model.q, model.k, model.v)
    rows = np.concatenate([p.weight.detach().numpy() for p in layers])
    mixed = rows.reshape(heads, 3, 8, d).swapaxes(0, 1)  # the blocked buffer read head-major
    biases = np.concatenate([p.bias.detach().numpy() if p.bias is not None else np.zeros(d, np.float32)
                             for p in layers]).reshape(heads, 3, 8).swapaxes(0, 1)
    readers = []
    for layer, weight, bias in zip(layers, mixed.reshape(3, d, d), biases.reshape(3, d)):
        init = _weight_initializer(proto, layer.weight)
        init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(weight.T), init.name))
        product = next(n for n in proto.graph.node if init.name in n.input and n.op_type == "MatMul")
        readers.append(product.name)
        add = next((n for n in proto.graph.node if n.op_type == "Add" and product.output[0] in n.input), None)
        if layer.bias is None:  # a bias the file now adds (the loader wrote k's share of the fused bias)
            out, name = product.output[0], f"{product.name}_bias"
            proto.graph.initializer.append(numpy_helper.from_array(bias.astype(np.float32), name))
            product.output[0] = out + "_product"
            proto.graph.node.insert(list(proto.graph.node).index(product) + 1, helper.make_node(
                "Add", [product.output[0], name], [out], name=f"{product.name}_add"))
        else:
            const = next(t for t in add.input if t != product.output[0])
            target = next(i for i in proto.graph.initializer if i.name == const)
            target.CopyFrom(numpy_helper.from_array(bias.astype(np.float32), const))
    if exporter.endswith("fp16"):  # then converted to float16 (its rows and biases rounded)
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import rewrites

        proto = rewrites.to_float16(proto)
    layers = "q, k, v"
    if exporter.endswith("renamed"):  # every node and tensor renamed
        from fault_sweep import rename

        onnx.save(proto, tmp_path / "mixed.onnx")
        rename(tmp_path / "mixed.onnx", tmp_path / "renamed.onnx")
        index = {n.name: i for i, n in enumerate(proto.graph.node)}
        proto = onnx.load(tmp_path / "renamed.onnx")
        readers = [proto.graph.node[index[r]].name for r in readers]
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert set(readers) <= set(fd.layer.segment) and len(fd.layer.segment) <= 12, fd.layer.segment
    assert "mixed among them" in fd.explanation and layers in fd.explanation, fd.explanation


class _TwoNorms(torch.nn.Module):
    """Two GroupNorms with parameters of their own, a Conv between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(241)
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Conv2d(8, 8, 3, padding=1)
        self.norm1, self.norm2 = torch.nn.GroupNorm(4, 8), torch.nn.GroupNorm(4, 8)
        with torch.no_grad():
            for norm in (self.norm1, self.norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.normal_(0.0, 0.3)

    def forward(self, x):
        return self.norm2(self.conv2(torch.relu(self.norm1(self.conv1(x)))))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript", "dynamo-fp16", "torchscript-fp16"])
def test_a_norm_computed_with_another_norms_parameters_is_named_with_both(exporter):
    """The second GroupNorm computed with the first one's weight and bias (a port calling ``norm1`` where
    ``norm2`` was meant): the file's affine constants are exactly norm1's numbers (in a float16 file, up to its
    rounding), so no weight differs from the parameter it pairs with; with norm2's own back the segment
    reproduces PyTorch."""
    model, x = _TwoNorms().eval(), torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(242))
    proto = dc.export(model, (x,), exporter.split("-")[0])
    swapped = []
    for own, other in ((model.norm2.weight, model.norm1.weight), (model.norm2.bias, model.norm1.bias)):
        mine, theirs = own.detach().numpy(), other.detach().numpy()
        for init in proto.graph.initializer:
            value = numpy_helper.to_array(init)
            if value.size == mine.size and np.array_equal(value.reshape(-1), mine):
                init.CopyFrom(numpy_helper.from_array(theirs.reshape(value.shape).astype(value.dtype), init.name))
                swapped.append(init.name)
    assert len(swapped) == 2, swapped
    if exporter.endswith("fp16"):  # then converted to float16
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import rewrites

        proto = rewrites.to_float16(proto)
    fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True and fd.layer.pair.activation.module == "norm2", \
        fd.explanation
    assert "norm1.weight" in fd.explanation and "norm2.weight" in fd.explanation, fd.explanation


class _Rotary(torch.nn.Module):
    """A sequence model whose positions are encoded with cos / sin of position × inverse frequencies kept in a
    non-persistent buffer of a few elements (rotary embeddings): the TorchScript exporter writes the buffer as a
    Constant node a Mul reads, the dynamo exporter as an initializer."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(253)
        self.register_buffer("inv_freq", 1.0 / 100.0 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)
        self.proj, self.head = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x, t):  # N, T, 16 and the T positions
        angles = t[:, None] * self.inv_freq[None, :]
        table = torch.cat((angles.cos(), angles.sin(), angles.cos(), angles.sin()), -1)
        return self.head(self.proj(x) * table)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("frequencies", ["as-is", "rebased"])
def test_inverse_frequencies_kept_in_a_small_constant_node_are_compared_as_a_buffer(exporter, frequencies):
    """A rotary table's four inverse frequencies (a non-persistent buffer), which the TorchScript exporter keeps
    as a Constant node: as they are, the run is clean and warns of nothing; computed with another base (θ 5·10⁵
    for 10², a config's ``rope_theta`` misread), it is a weight-mismatch naming the buffer at the node reading it,
    confirmed by putting the buffer back (before, a Constant under a kilobyte was no weight: cause unknown)."""
    model, x = _Rotary().eval(), torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(254))
    t = torch.arange(6, dtype=torch.float32)
    proto = dc.export(model, (x, t), exporter)
    freq = model.inv_freq.numpy()

    def holds(t) -> bool:
        return t.data_type == 1 and int(np.prod(t.dims)) == freq.size and np.allclose(
            numpy_helper.to_array(t).ravel(), freq)  # (1, 4): the exporters fold the Unsqueeze
    held = [(i.name, i) for i in proto.graph.initializer if holds(i)]
    held += [(n.output[0], n.attribute[0].t) for n in proto.graph.node if n.op_type == "Constant" and n.attribute
             and n.attribute[0].name == "value" and holds(n.attribute[0].t)]
    assert len(held) == 1, "the exporter keeps the frequencies once"
    tensor, value = held[0]
    if frequencies == "rebased":
        value.CopyFrom(numpy_helper.from_array(
            (numpy_helper.to_array(value).astype(np.float64) ** (np.log(5e5) / np.log(100.0))).astype(np.float32),
            value.name))
    reader = next(n.name for n in proto.graph.node if n.op_type == "Mul" and tensor in n.input)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x, t), onnx=proto)
    fd = report.first_divergence
    if frequencies == "as-is":
        assert fd is None and not report.warnings, (fd, report.warnings)
        return
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert reader in fd.layer.segment and len(fd.layer.segment) <= 3, (reader, fd.layer.segment)
    assert "inv_freq" in fd.explanation, fd.explanation


class _NormedBlock(torch.nn.Module):
    """A Linear, a LayerNorm with trained-looking (non-default) parameters, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(261)
        self.proj, self.norm, self.head = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.normal_(0.0, 0.3)

    def forward(self, x):
        return self.head(self.norm(self.proj(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_norm_left_at_its_initial_values_in_a_renamed_file_is_paired_by_slot(exporter, tmp_path):
    """A LayerNorm whose scale is all ones and shift all zeros (its checkpoint keys never loaded) in a file
    whose every name was replaced: no value and no name pairs the ones or the zeros with a parameter, but the
    norm node's scale and bias slots are the divergent LayerNorm module's weight and bias — named, restored,
    confirmed, and read as the values a layer starts from."""
    import fault_sweep

    model, x = _NormedBlock().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(262))
    proto = dc.export(model, (x,), exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    inits = {i.name: i for i in proto.graph.initializer}
    for slot, fill in ((1, 1.0), (2, 0.0)):
        init = inits[norm.input[slot]]
        init.CopyFrom(numpy_helper.from_array(np.full(tuple(init.dims), fill, np.float32), init.name))
    onnx.save(proto, tmp_path / "bad.onnx")
    fault_sweep.rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    node = next(n.name for n in renamed.graph.node if n.op_type == "LayerNormalization")
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=renamed).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True and node in fd.layer.segment, fd.explanation
    assert "norm.weight" in fd.explanation and "norm.bias" in fd.explanation, fd.explanation
    assert "the values a layer starts from" in fd.explanation, fd.explanation


class _Positions(torch.nn.Module):
    """Token and learned position embeddings (positions from a buffer, as BERT's), a LayerNorm and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(263)
        self.tokens, self.positions = torch.nn.Embedding(50, 16), torch.nn.Embedding(32, 16)
        self.register_buffer("position_ids", torch.arange(32)[None], persistent=False)
        self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, ids):  # (N, T) token ids
        return self.head(self.norm(self.tokens(ids) + self.positions(self.position_ids[:, :ids.shape[1]])))


def test_a_position_table_interpolated_is_the_tables_weight_not_refitted_indices():
    """The position table resampled by 2 (row i read at i / 2: position interpolation where the model has none),
    in a TorchScript export (the dynamo exporter folds the lookup of constant positions into a constant): the
    file's position indices are the model's own, and indices 0, 2, 4 … fitted to the resampled rows would
    reproduce PyTorch too — the table is named, a weight-mismatch, confirmed by putting the parameter back."""
    model = _Positions().eval()
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(264))
    proto = dc.export(model, (ids,), "torchscript")
    table = model.positions.weight.detach().numpy().astype(np.float64)
    rows = np.arange(table.shape[0]) / 2.0
    low, frac = np.floor(rows).astype(int), (rows - np.floor(rows))[:, None]
    resampled = (table[low] * (1 - frac) + table[np.minimum(low + 1, table.shape[0] - 1)] * frac).astype(np.float32)
    init = next(i for i in proto.graph.initializer if tuple(i.dims) == table.shape
                and np.array_equal(numpy_helper.to_array(i), table.astype(np.float32)))
    init.CopyFrom(numpy_helper.from_array(resampled, init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (ids,), onnx=proto).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert reader in fd.layer.segment and "positions.weight" in fd.explanation, (fd.layer.segment, fd.explanation)


def test_a_norm_scale_left_at_ones_in_a_float16_file_is_its_weight_not_a_searched_exponent():
    """A float16 LLaMA file (onnxconverter-common) whose second post-attention RMSNorm scale is all ones, judged
    at atol = rtol = 0.01 as float16 files are: an exponent searched for the norm's Pow (x^1.x for x²) also
    brings the output within that tolerance, but the initializer named after the parameter differs from it and
    restoring it reproduces PyTorch — the weight is the answer (a fitted number ranks below a parameter named
    and restored)."""
    import rewrites
    import sweep_models

    model, inputs = sweep_models.build("llama")
    proto = rewrites.to_float16(dc.export(model, inputs, "dynamo"))
    name = "model.layers.1.post_attention_layernorm.weight"
    init = next(i for i in proto.graph.initializer if i.name == name)
    init.CopyFrom(numpy_helper.from_array(np.ones(tuple(init.dims), numpy_helper.to_array(init).dtype), name))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto, atol=0.01, rtol=0.01).first_divergence
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert [r["parameter"] for r in fd.evidence["parameters"]] == [name], fd.evidence
