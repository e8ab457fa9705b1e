"""Faults the tenth sweep planted (scripts/sweep_faults_ten.py), each named at its node: a tensor rounded through
bfloat16 (a file holding bfloat16 tensors is read at all: numpy has no such type), a TopK's ``largest`` or an
ArgMax made an ArgMin, a node reading another tensor than PyTorch's op does (an input rewired), a constant mask
transposed."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402
from test_diagnose_dropped import _prune_dead  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(81)
        self.up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.down(torch.tanh(self.up(x)))


def _round_through_bfloat16(proto: onnx.ModelProto, op_type: str) -> str:
    """A Cast to bfloat16 and back inserted after the first ``op_type`` node (in place); the first Cast's name."""
    nodes = list(proto.graph.node)
    at, node = next((i, n) for i, n in enumerate(nodes) if n.op_type == op_type)
    result = node.output[0]
    node.output[0] = result + "_fp32"
    down = helper.make_node("Cast", [result + "_fp32"], [result + "_bf16"], name="to_bf16", to=TensorProto.BFLOAT16)
    up = helper.make_node("Cast", [result + "_bf16"], [result], name="from_bf16", to=TensorProto.FLOAT)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes[:at + 1] + [down, up] + nodes[at + 1:])
    return down.name


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_tensor_rounded_through_bfloat16_is_named_as_bfloat16_precision(exporter):
    model = _Mlp().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(82)) * 3,)
    proto = dc.export(model, inputs, exporter)
    name = _round_through_bfloat16(proto, "Tanh")
    fd = _bisect(model, inputs, proto)
    _found(fd, name, cause="precision")
    assert "bfloat16 rounding" in fd.explanation, fd.explanation


class _Router(torch.nn.Module):
    """A top-2 router: softmax over experts, the two largest gates kept, the experts' outputs weighted by them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(83)
        self.gate, self.experts = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4 * 8)

    def forward(self, x):  # (5, 8)
        gates, chosen = torch.softmax(self.gate(x), dim=-1).topk(2, dim=-1)
        outs = self.experts(x).view(-1, 4, 8)
        picked = torch.gather(outs, 1, chosen.unsqueeze(-1).expand(-1, -1, 8))
        return (picked * gates.unsqueeze(-1)).sum(1)


class _Codebook(torch.nn.Module):
    """Nearest codebook entry (a VQ-VAE's quantizer): distances, argmin, the entry looked up."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(84)
        self.proj, self.codes = torch.nn.Linear(8, 4), torch.nn.Embedding(6, 4)

    def forward(self, x):  # (5, 8)
        z = self.proj(x)
        distances = (z.unsqueeze(1) - self.codes.weight.unsqueeze(0)).pow(2).sum(-1)
        return z + self.codes(distances.argmin(-1))


def _set(proto: onnx.ModelProto, op_type: str, op_type_to: str | None = None, **attrs) -> str:
    node = next(n for n in proto.graph.node if n.op_type == op_type)
    node.op_type = op_type_to or op_type
    for name, value in attrs.items():
        for a in [a for a in node.attribute if a.name == name]:
            node.attribute.remove(a)
        node.attribute.append(helper.make_attribute(name, value))
    return node.name


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_topk_keeping_the_smallest_is_named(exporter):
    model = _Router().eval()
    inputs = (torch.randn(5, 8, generator=torch.Generator().manual_seed(85)),)
    proto = dc.export(model, inputs, exporter)
    name = _set(proto, "TopK", largest=0)
    evidence = _found(_bisect(model, inputs, proto), name)
    assert evidence["attributes"][0]["attribute"] == "largest", evidence


def test_an_argmin_made_an_argmax_is_named():
    model = _Codebook().eval()
    inputs = (torch.randn(5, 8, generator=torch.Generator().manual_seed(86)),)
    proto = dc.export(model, inputs, "torchscript")
    name = _set(proto, "ArgMin", "ArgMax")
    fd = _bisect(model, inputs, proto)
    _found(fd, name)
    assert "ArgMin" in fd.explanation, fd.explanation


class _Residual(torch.nn.Module):
    """Two pre-norm MLP blocks on a residual stream."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(87)
        self.norm1, self.norm2 = torch.nn.LayerNorm(8), torch.nn.LayerNorm(8)
        self.mlp1, self.mlp2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.scale = torch.nn.Parameter(torch.rand(8) + 0.5)
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x):  # (2, 5, 8)
        h = x + torch.tanh(self.mlp1(self.norm1(x)))
        h = h + torch.tanh(self.mlp2(self.norm2(h))) * self.scale
        return self.head(h)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_node_reading_the_previous_blocks_tensor_is_rewired(exporter):
    """The second block's MatMul reads the first block's LayerNorm output (a PyTorch value in the wrong place);
    the second LayerNorm is still computed (its output read by nothing): reading it reproduces PyTorch."""
    model = _Residual().eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(88)),)
    proto = dc.export(model, inputs, exporter)
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    reader = next(n for n in proto.graph.node if n.op_type == "MatMul" and norms[1].output[0] in n.input)
    right = norms[1].output[0]
    reader.input[list(reader.input).index(right)] = norms[0].output[0]
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, reader.name)
    assert evidence["attributes"][0]["attribute"].startswith("input"), evidence
    assert "wrong tensor wired in" in fd.explanation and right in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_node_whose_right_input_was_dropped_is_fed_pytorchs_value(exporter):
    """The last residual Add reads the stream before the block instead of the block's scaled output, whose
    computation is then dead and gone: no tensor of the file holds the right value, PyTorch's op input does."""
    model = _Residual().eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(89)),)
    proto = dc.export(model, inputs, exporter)
    mul = next(n for n in proto.graph.node if n.op_type == "Mul" and any(
        i.op_type == "Tanh" and i.output[0] in n.input for i in proto.graph.node))
    add = next(n for n in proto.graph.node if n.op_type == "Add" and mul.output[0] in n.input)
    other = next(t for t in add.input if t != mul.output[0])
    first_tanh = next(n for n in proto.graph.node if n.op_type == "Tanh")
    add.input[list(add.input).index(mul.output[0])] = first_tanh.output[0]
    del other
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, add.name)
    assert "none of the earlier tensors tried holds" in fd.explanation, fd.explanation


def test_a_float16_file_is_not_blamed_on_an_upstream_sum_its_rounding_only_made_up_for(tmp_path):
    """PatchTSMixer's standard scaler in a float16 file (onnxconverter-common), the epsilon added before its
    square root 0.7 where PyTorch's is 1e-05.  A sum upstream, rounded in float16 within the tolerance, must not
    be named where the segment's error enters (feeding PyTorch's value there only made up for the fault
    downstream)."""
    import alignment_corpus
    import sweep_models

    model, inputs = sweep_models.build("patchtsmixer")
    onnx.save(dc.export(model, inputs, "dynamo"), tmp_path / "float32.onnx")
    alignment_corpus.fp16(tmp_path / "float32.onnx", tmp_path / "float16.onnx")
    proto = onnx.load(tmp_path / "float16.onnx")
    nodes = list(proto.graph.node)
    sqrt = next(n for n in nodes if n.op_type == "Sqrt")
    add = next(n for n in nodes if n.op_type == "Add" and sqrt.input[0] in n.output)
    eps = next(n for n in nodes if n.op_type == "Constant" and n.output[0] in add.input) if not any(
        i.name in add.input for i in proto.graph.initializer) else None
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(0.7, np.float16), "eps_planted"))
    add.input[[i for i, t in enumerate(add.input) if eps is not None and t == eps.output[0]
               or any(init.name == t for init in proto.graph.initializer)][0]] = "eps_planted"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto, atol=0.01, rtol=0.01).first_divergence
    evidence = _found(fd, add.name, cause="epsilon-mismatch")
    assert evidence["mismatches"][0]["pytorch_eps"] == pytest.approx(1e-5), evidence


class _MaskedScores(torch.nn.Module):
    """Attention scores plus a causal mask held as a buffer (a constant in the file), softmax, values."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(90)
        self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 4)
        self.register_buffer("mask", torch.triu(torch.full((6, 6), -1e4), diagonal=1))

    def forward(self, x):  # (1, 6, 8)
        q, k, v = self.qkv(x).split(8, dim=-1)
        return self.out(torch.softmax(q @ k.transpose(1, 2) + self.mask, dim=-1) @ v)


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_constant_mask_transposed_is_named(exporter):
    model = _MaskedScores().eval()
    inputs = (torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(91)),)
    proto = dc.export(model, inputs, exporter)
    mask = model.mask.numpy()
    init = next(i for i in proto.graph.initializer if onnx.numpy_helper.to_array(i).shape == mask.shape)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(mask.T), init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, reader)
    assert "transposed" in str(evidence["attributes"][0]["expected"]), evidence


class _RotaryTables(torch.nn.Module):
    """Rotary embedding as LLaMA computes it: cos and sin tables from an inverse-frequency buffer (folded into
    constants at export), applied to a projection."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(92)
        self.proj, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
        self.rotary = _Tables()

    def forward(self, x):  # (1, 6, 8)
        h = self.proj(x)
        cos, sin = self.rotary(x.shape[1])
        rotated = torch.cat((-h[..., 4:], h[..., :4]), dim=-1)
        return self.out(h * cos + rotated * sin)


class _Tables(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), persistent=False)

    def forward(self, n: int):
        angles = torch.outer(torch.arange(n).float(), self.inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos(), angles.sin()


def test_rotary_tables_one_position_off_are_named_against_pytorchs():
    """The dynamo export folds the tables into initializers; both rolled by one position (a position offset)."""
    model = _RotaryTables().eval()
    inputs = (torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(93)),)
    proto = dc.export(model, inputs, "dynamo")
    cos = model.rotary(6)[0].numpy()
    tables = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer
              if onnx.numpy_helper.to_array(i).size == cos.size and onnx.numpy_helper.to_array(i).dtype.kind == "f"}
    assert len(tables) == 2, list(tables)
    for init in proto.graph.initializer:
        if init.name in tables:
            init.CopyFrom(onnx.numpy_helper.from_array(np.roll(tables[init.name], 1, axis=-2), init.name))
    readers = {n.name for n in proto.graph.node if set(n.input) & set(tables)}
    fd = _bisect(model, inputs, proto)
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert readers & set(fd.layer.segment) and len(fd.layer.segment) <= 12, (readers, fd.layer.segment)
    assert "Constant tables differ" in fd.explanation, fd.explanation


class _RmsNormed(torch.nn.Module):
    """A hand-written RMSNorm (its weight a Mul's constant) between two Linear layers."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(94)
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
        self.norm = _Rms()

    def forward(self, x):
        return self.down(self.norm(self.up(x)))


class _Rms(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_a_per_channel_scale_collapsed_to_one_number_is_paired_by_its_module_in_a_renamed_file(tmp_path):
    """No name says which parameter the constant is, and one number repeated relates to none by value: it is the
    segment's only constant of its size and the module's only tensor of that size."""
    from fault_sweep import rename

    model = _RmsNormed().eval()
    inputs = (torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(95)),)
    onnx.save(dc.export(model, inputs, "dynamo"), tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    weight = model.norm.weight.detach().numpy()
    init = next(i for i in proto.graph.initializer if np.array_equal(onnx.numpy_helper.to_array(i), weight))
    init.CopyFrom(onnx.numpy_helper.from_array(np.full_like(weight, weight.mean()), init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader, cause="weight-mismatch")
    assert "holds one number" in fd.explanation and "norm.weight" in fd.explanation, fd.explanation


class _Sine(torch.nn.Module):
    """``sin(30 · (x W + b))`` with its own parameters (a SIREN layer: no Linear child to pair)."""

    def __init__(self, cin, cout):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(cout, cin).uniform_(-(6 / cin) ** 0.5 / 30, (6 / cin) ** 0.5 / 30))
        self.bias = torch.nn.Parameter(torch.empty(cout).uniform_(-0.3, 0.3))

    def forward(self, x):
        return torch.sin(30.0 * torch.nn.functional.linear(x, self.weight, self.bias))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_bias_dropped_inside_a_module_that_applies_ops_after_its_product_is_named(exporter):
    torch.manual_seed(96)
    model = torch.nn.Sequential(_Sine(2, 16), _Sine(16, 16), torch.nn.Linear(16, 3)).eval()
    inputs = (torch.rand(2, 10, 2, generator=torch.Generator().manual_seed(97)) * 2 - 1,)
    proto = dc.export(model, inputs, exporter)
    matmuls = [n for n in proto.graph.node if n.op_type == "MatMul"]
    product = matmuls[1]
    add = next(n for n in proto.graph.node if n.op_type == "Add" and product.output[0] in n.input)
    for n in proto.graph.node:
        n.input[:] = [product.output[0] if t == add.output[0] else t for t in n.input]
    proto.graph.node.remove(add)
    fd = _bisect(model, inputs, proto)
    _found(fd, product.name, cause="weight-mismatch")
    assert "without a bias" in fd.explanation and "1.bias" in fd.explanation, fd.explanation


class _ScaledResidual(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(98)
        self.lin, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.head(x + 0.37 * torch.tanh(self.lin(x)))


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_a_wrong_scale_before_a_residual_add_is_the_scale_not_a_rewiring(exporter):
    """Feeding PyTorch's value at the Add's input would also clear the output: the scale is the finding."""
    model = _ScaledResidual().eval()
    inputs = (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(99)),)
    proto = dc.export(model, inputs, exporter)
    mul = next(n for n in proto.graph.node if n.op_type == "Mul")
    scale = next(t for t in mul.input if any(i.name == t for i in proto.graph.initializer)
                 or any(c.op_type == "Constant" and c.output[0] == t for c in proto.graph.node))
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1.0, np.float32), "scale_planted"))
    mul.input[list(mul.input).index(scale)] = "scale_planted"
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, mul.name)
    assert evidence["attributes"][0]["attribute"].startswith("constant input"), evidence


def test_a_module_adding_its_epsilon_after_the_root_is_not_blamed_for_another_fault():
    """``(x - mean) / (std + eps)`` exported as written, the output Linear's weights noised: a weight fault, no
    epsilon placement."""
    from test_diagnose_nine import _RootNorm

    model = _RootNorm(after=True).eval()
    inputs = (torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(100)),)
    proto = dc.export(model, inputs, "torchscript")
    weight = model.out.weight.detach().numpy()
    init = next(i for i in proto.graph.initializer if np.array_equal(onnx.numpy_helper.to_array(i), weight.T)
                or np.array_equal(onnx.numpy_helper.to_array(i), weight))
    value = onnx.numpy_helper.to_array(init)
    noisy = value + np.random.default_rng(0).normal(0, 0.3 * value.std(), value.shape).astype(value.dtype)
    init.CopyFrom(onnx.numpy_helper.from_array(noisy, init.name))
    fd = _bisect(model, inputs, proto)
    assert fd is not None and fd.cause == "weight-mismatch", fd and (fd.cause, fd.explanation)


class _GroupedAttention(torch.nn.Module):
    """Four query heads over two key/value heads (the keys normalised per head, as Qwen3's), repeated by expand and
    reshape before the batched products."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(93)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16), torch.nn.Linear(16, 8), torch.nn.Linear(16, 8),
                                          torch.nn.Linear(16, 16))
        self.k_norm = torch.nn.LayerNorm(4)
        torch.nn.init.uniform_(self.k_norm.weight, 0.5, 1.5), torch.nn.init.uniform_(self.k_norm.bias, -0.5, 0.5)

    def forward(self, x):  # (2, 6, 16)
        b, t, _ = x.shape
        q = self.q(x).view(b, t, 4, 4).transpose(1, 2)
        k, v = (h.transpose(1, 2)[:, :, None].expand(b, 2, 2, t, 4).reshape(b, 4, t, 4)
                for h in (self.k_norm(self.k(x).view(b, t, 2, 4)), self.v(x).view(b, t, 2, 4)))
        att = torch.softmax(q @ k.transpose(-1, -2) / 2.0, -1)
        return self.o((att @ v).transpose(1, 2).reshape(b, t, 16))


def test_a_value_head_read_from_the_keys_is_fed_the_value_pytorch_computes_several_ops_earlier():
    """The values' head transpose reads the keys' head split (same shape, before the keys' norm) and the values'
    projection is gone from the file: the value the node should read is PyTorch's a few ops before the divergent
    product (the heads are repeated and reshaped in between), and feeding it there reproduces PyTorch."""
    model = _GroupedAttention().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(94)),)
    proto = dc.export(model, inputs, "dynamo")
    want = {name: p.detach().numpy() for name, p in model.named_parameters()}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}

    def split_of(weight: str) -> onnx.NodeProto:  # the Reshape splitting a projection's output into heads
        w = next(n for n, v in inits.items() if v.shape[::-1] == want[weight].shape and np.array_equal(v.T, want[weight])
                 or v.shape == want[weight].shape and np.array_equal(v, want[weight]))
        t = next(n for n in proto.graph.node if w in n.input).output[0]
        while True:
            node = next(n for n in proto.graph.node if t in n.input)
            if node.op_type == "Reshape":
                return node
            t = node.output[0]

    v_split, k_split = split_of("v.weight"), split_of("k.weight")
    reader = next(n for n in proto.graph.node if v_split.output[0] in n.input)
    reader.input[list(reader.input).index(v_split.output[0])] = k_split.output[0]
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader.name)
    assert "none of the earlier tensors tried holds" in fd.explanation, fd.explanation


class _GatedMlp(torch.nn.Module):
    """A pre-norm SwiGLU block: down(silu(gate(x)) * up(x)), the product an op of the block, not a module."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(95)
        self.norm = torch.nn.LayerNorm(12)
        self.gate, self.up, self.down = torch.nn.Linear(12, 24), torch.nn.Linear(12, 24), torch.nn.Linear(24, 12)
        self.act, self.head = torch.nn.SiLU(), torch.nn.Linear(12, 3)

    def forward(self, x):  # (2, 5, 12)
        h = self.norm(x)
        return self.head(x + self.down(self.act(self.gate(h)) * self.up(h)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_down_projection_reading_the_up_projection_is_fed_the_gated_product(exporter):
    """The down projection reads the up projection's output, the gate branch gone from the file: PyTorch's
    module read ``act(gate) * up`` — an op's value, not another module's, so the module records no input; the
    value is what its own ops read from outside it.  Not one op missing (the product combines the value read with
    the gate's): a wiring, and feeding PyTorch's product there reproduces PyTorch."""
    model = _GatedMlp().eval()
    inputs = (torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(96)),)
    proto = dc.export(model, inputs, exporter)
    producer = {t: n for n in proto.graph.node for t in n.output}
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    down = model.down.weight.detach().numpy()
    reader = next(n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm") and any(
        t in inits and inits[t].size == down.size and (np.array_equal(inits[t], down) or np.array_equal(inits[t].T, down))
        for t in n.input))
    gated = producer[reader.input[0]]
    assert gated.op_type == "Mul", gated
    up_out = next(t for t in gated.input if producer[t].op_type in ("Add", "MatMul", "Gemm"))
    reader.input[0] = up_out
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader.name)
    assert "none of the earlier tensors tried holds" in fd.explanation and "aten.mul" in fd.explanation, \
        fd.explanation


class _WrittenNorm(torch.nn.Module):
    """Position embeddings of ids expanded over the batch (as BERT-style models do: TorchScript writes the expand's
    shape through a Where, which shape inference cannot follow — with a batch of one, every later shape has a
    symbolic batch), a
    LayerNorm written out (mean, centred input, variance, division), then a Linear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(87)
        self.up, self.scale = torch.nn.Linear(8, 16), torch.nn.Parameter(1 + 0.1 * torch.randn(16))
        self.pos, self.down = torch.nn.Embedding(5, 16), torch.nn.Linear(16, 4)
        self.register_buffer("ids", torch.arange(5).unsqueeze(0), persistent=False)

    def forward(self, x):
        ids = self.ids[:, :x.shape[1]].expand(x.shape[0], -1)
        h = torch.relu(self.up(x)) + self.pos(ids)
        centred = h - h.mean(-1, keepdim=True)
        normed = centred / torch.sqrt((centred * centred).mean(-1, keepdim=True) + 1e-5)
        return self.down(normed * self.scale)


def test_a_division_reading_the_uncentred_input_is_rewired_where_shapes_have_a_symbolic_batch():
    """Shape inference leaves the batch dimension symbolic after the position ids' expand, and the centred tensor
    the Div should read — inside the segment — still counts as one of the Div input's shape."""
    model, x = _WrittenNorm().eval(), torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(88))
    proto = dc.export(model, (x,), "torchscript")
    inferred = onnx.shape_inference.infer_shapes(proto, data_prop=True)
    sub = next(n for n in proto.graph.node if n.op_type == "Sub")
    shape = next(v for v in inferred.graph.value_info if v.name == sub.output[0]).type.tensor_type.shape
    assert not shape.dim[0].HasField("dim_value"), shape  # the case this test is about
    div = next(n for n in proto.graph.node if n.op_type == "Div")
    assert div.input[0] == sub.output[0]
    div.input[0] = sub.input[0]  # the numerator forgets the mean
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert div.name in fd.fixed_nodes and len(fd.layer.segment) <= 12, (fd.fixed_nodes, fd.layer.segment)
    assert sub.output[0] in fd.explanation, fd.explanation


class _ChunkedBlock(torch.nn.Module):
    """A pre-norm residual block whose feed-forward runs over the sequence in chunks (Reformer's chunked FFN): many
    tensors of the stream's shape lie between the norm and the residual Add."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(89)
        self.norm = torch.nn.LayerNorm(16)
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(4))
        self.head = torch.nn.Linear(16, 4)

    def forward(self, x):
        h = self.norm(x)
        chunks = []
        for chunk in h.chunk(6, dim=1):
            for layer in self.layers:
                chunk = chunk + torch.tanh(layer(chunk))
            chunks.append(chunk)
        return self.head(x + torch.cat(chunks, dim=1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_residual_taken_from_the_norms_output_is_rewired_to_its_input_a_block_back(exporter):
    model, x = _ChunkedBlock().eval(), torch.randn(2, 12, 16, generator=torch.Generator().manual_seed(90))
    proto = dc.export(model, (x,), exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    residual = next(n for n in proto.graph.node if n.op_type == "Add" and norm.input[0] in n.input)
    residual.input[list(residual.input).index(norm.input[0])] = norm.output[0]
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert residual.name in set(fd.fixed_nodes) and len(fd.layer.segment) <= 12, (fd.fixed_nodes, fd.layer.segment)
    assert norm.input[0] in fd.explanation, fd.explanation


class _PreNormGelu(torch.nn.Module):
    """Two pre-norm residual GELU MLP blocks and a final norm (ONNX Runtime fuses the residual Add with the next
    norm, and the GELU, into its own ops)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(91)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(16) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(16, 32) for _ in range(2))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(32, 16) for _ in range(2))

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(torch.nn.functional.gelu(up(norm(x))))
        return self.norms[2](x)


def test_a_residual_from_the_norms_output_is_rewired_in_a_file_shape_inference_cannot_type():
    """An ONNX Runtime-optimized file (its fused ops are unknown to ONNX's shape inference, so later tensors have no
    type or shape): the residual Add reading the norm's output is still rewired to the norm's input."""
    from rewrites import ort_optimized

    model, x = _PreNormGelu().eval(), torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(92))
    proto = ort_optimized(dc.export(model, (x,), "torchscript"))
    assert any(n.domain == "com.microsoft" for n in proto.graph.node), [n.op_type for n in proto.graph.node]
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization" and any(
        r.op_type == "Add" and n.input[0] in r.input for r in proto.graph.node))
    residual = next(r for r in proto.graph.node if r.op_type == "Add" and norm.input[0] in r.input)
    residual.input[list(residual.input).index(norm.input[0])] = norm.output[0]
    fd = _bisect(model, (x,), proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert residual.name in set(fd.fixed_nodes) and len(fd.layer.segment) <= 12, (fd.fixed_nodes, fd.layer.segment)
    assert norm.input[0] in fd.explanation, fd.explanation


class _Reassemble(torch.nn.Module):
    """DPT's reassembly: one tensor split into four equal chunks along its first axis, each through its own
    projection, the results concatenated."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(197)
        self.mix = torch.nn.Linear(8, 8)
        self.projects = torch.nn.ModuleList(torch.nn.Linear(8, 6) for _ in range(4))

    def forward(self, x):  # 4, 5, 8
        pieces = torch.split(self.mix(x), 1, 0)
        return torch.cat([torch.tanh(p(c)) for p, c in zip(self.projects, pieces)], -1)


def _split_planted(exporter, exchange: bool):
    """The Split's outputs 0 and 2 exchanged (``exchange``: every reader of each reads the other piece), else only
    the first piece's reader rewired to the third piece; ``(model, x, proto, split name, first reader name)``."""
    model, x = _Reassemble().eval(), torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(199))
    proto = dc.export(model, (x,), exporter)
    split = next(n for n in proto.graph.node if n.op_type == "Split")
    first = next(n for n in proto.graph.node if split.output[0] in n.input)
    if exchange:
        split.output[0], split.output[2] = split.output[2], split.output[0]
    else:
        first.input[list(first.input).index(split.output[0])] = split.output[2]
    return model, x, proto, split.name, first.name


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_splits_outputs_exchanged_are_named_at_the_split_not_at_a_reader(exporter):
    """The first and third chunks exchanged: the first chunk's reader reads the third, and the third's reader the
    first — both go wrong, so the Split's output order is named (with the first reader, where it shows)."""
    model, x, proto, split, reader = _split_planted(exporter, exchange=True)
    fd = _bisect(model, (x,), proto)
    _found(fd, split)
    assert reader in fd.layer.segment and "output order" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_one_reader_of_a_split_rewired_is_named_at_the_reader(exporter):
    """Only the first chunk's reader reads the third chunk (the third's reader is right): a rewiring of that
    reader, not the Split's order."""
    model, x, proto, split, reader = _split_planted(exporter, exchange=False)
    fd = _bisect(model, (x,), proto)
    _found(fd, reader)
    assert split not in fd.fixed_nodes and "output order" not in fd.explanation, fd.explanation
