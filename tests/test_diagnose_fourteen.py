"""Faults the fourteenth held-out set and kinds showed: each test fails on the code before its change."""
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


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], -1)


class _Rotary(torch.nn.Module):
    """Query and key projections rotated by a fixed rotary table (rotate_half, Llama / GPT-NeoX), then scores."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(141)
        self.q, self.k = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        angle = torch.arange(6)[:, None] * 0.3 ** torch.arange(8)[None, :]
        self.register_buffer("cos", torch.cat([angle.cos(), angle.cos()], -1))
        self.register_buffer("sin", torch.cat([angle.sin(), angle.sin()], -1))

    def forward(self, x):  # (2, 6, 16)
        q, k = self.q(x), self.k(x)
        q = q * self.cos + _rotate_half(q) * self.sin
        k = k * self.cos + _rotate_half(k) * self.sin
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ x


def _interleave_first_rotation(proto: onnx.ModelProto) -> str:
    """The first rotate_half (a Concat of a Neg and the other half) computed as rotate_every_two: a Gather of the
    pair-swapped entries and a Mul by (−1, +1, −1, +1 …); returns the Gather's name."""
    nodes = list(proto.graph.node)
    producer = {t: n for n in nodes for t in n.output}
    concat = next(n for n in nodes if n.op_type == "Concat" and len(n.input) == 2
                  and producer.get(n.input[0]) is not None and producer[n.input[0]].op_type == "Neg")
    source = producer[concat.input[1]].input[0]  # the second half's Slice reads the rotated tensor
    d = 16
    pairs = np.arange(d).reshape(-1, 2)[:, ::-1].reshape(-1).astype(np.int64)
    signs = np.tile(np.array([-1.0, 1.0], np.float32), d // 2)
    proto.graph.initializer.extend([numpy_helper.from_array(pairs, "planted_pairs"),
                                    numpy_helper.from_array(signs, "planted_signs")])
    gather = helper.make_node("Gather", [source, "planted_pairs"], ["planted_swapped"], name="planted_gather", axis=-1)
    mul = helper.make_node("Mul", ["planted_swapped", "planted_signs"], [concat.output[0]], name="planted_mul")
    at = nodes.index(concat)
    proto.graph.node.remove(concat)
    proto.graph.node.insert(at, mul)
    proto.graph.node.insert(at, gather)
    return gather.name


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_rotary_pairs_rotated_where_pytorch_rotates_halves_are_named_with_the_signed_indices(exporter):
    """rotate_half replaced by rotate_every_two (GPT-J's interleaved pairs): the Gather's indices and the Mul's
    signs are fitted to PyTorch's rotated value, and writing them makes the segment agree."""
    model = _Rotary().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(142)),)
    proto = dc.export(model, inputs, exporter)
    _interleave_first_rotation(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, "planted_gather", cause="attribute-mismatch")
    assert "planted_mul" in fd.layer.segment, fd.layer.segment
    assert "'-8', '-9'" in fd.explanation and "'-1', '+0'" in fd.explanation, fd.explanation


class _Positions(torch.nn.Module):
    """Token and learned position embeddings (GPT-2's wte + wpe, positions an arange), a norm and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(143)
        self.wte, self.wpe = torch.nn.Embedding(20, 16), torch.nn.Embedding(12, 16)
        self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, ids):  # (2, 8) token ids
        positions = torch.arange(ids.shape[1])
        return self.head(self.norm(self.wte(ids) + self.wpe(positions)))


def test_a_folded_position_table_read_two_positions_on_is_named_with_the_shift():
    """The dynamo export folds wpe(arange) into a constant; that constant's rows shifted by two (OPT's offset of
    two lost or added): the folded table is paired with PyTorch's position lookup by the rows they share — by
    correlation alone a shifted table of random rows is nearest some other module's output — and named with
    the shift."""
    model = _Positions().eval()
    inputs = (torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(144)),)
    proto = dc.export(model, inputs, "dynamo")
    want = model.wpe.weight.detach().numpy()[:8]
    table = next(t for t in proto.graph.initializer if tuple(t.dims)[-2:] == (8, 16)
                 and np.allclose(numpy_helper.to_array(t).reshape(8, 16), want))
    value = numpy_helper.to_array(table)
    shifted = np.concatenate([value.reshape(8, 16)[2:], value.reshape(8, 16)[-2:]]).reshape(value.shape)
    table.CopyFrom(numpy_helper.from_array(shifted.astype(value.dtype), table.name))
    reader = next(n for n in proto.graph.node if table.name in n.input)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader.name, cause="weight-mismatch")
    assert "shifted by 2 positions" in fd.explanation and "wpe" in fd.explanation, fd.explanation


class _Square(torch.nn.Module):
    """Two square Linears with a GELU between them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(145)
        self.fc1, self.fc2 = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def _quantize_weight(proto: onnx.ModelProto, weight: np.ndarray, misread: str) -> str:
    """fc1's weight initializer replaced by int8 integers quantized per output channel and a DequantizeLinear
    that reads them wrongly: ``axis`` (its scales applied along the other axis) or ``sign`` (the int8 bytes
    stored as uint8, zero point 0).  Returns the name of the node reading the dequantized weight."""
    inits = {t.name: t for t in proto.graph.initializer}
    name, reader = next((t, n) for n in proto.graph.node for t in n.input if t in inits
                        and np.allclose(np.abs(numpy_helper.to_array(inits[t])).sum(), np.abs(weight).sum())
                        and numpy_helper.to_array(inits[t]).shape == weight.shape)
    stored = numpy_helper.to_array(inits[name]).astype(np.float64)
    axis = 0 if np.allclose(stored, weight) else 1  # (out, in) as in PyTorch, or transposed for a MatMul
    scale = np.abs(stored).max(axis=1 - axis) / 127.0
    q = np.clip(np.round(stored / np.expand_dims(scale, 1 - axis)), -127, 127).astype(np.int8)
    if misread == "sign":
        q, zero, read_axis = q.view(np.uint8), np.zeros(16, np.uint8), axis
    else:
        zero, read_axis = np.zeros(16, np.int8), 1 - axis
    proto.graph.initializer.extend([numpy_helper.from_array(q, "planted_q"),
                                    numpy_helper.from_array(scale.astype(np.float32), "planted_scale"),
                                    numpy_helper.from_array(zero, "planted_zero")])
    dq = helper.make_node("DequantizeLinear", ["planted_q", "planted_scale", "planted_zero"], ["planted_w"],
                          name="planted_dq", axis=read_axis)
    reader.input[list(reader.input).index(name)] = "planted_w"
    proto.graph.node.insert(list(proto.graph.node).index(reader), dq)
    return reader.name


@pytest.mark.parametrize("misread", ["axis", "sign"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_quantized_weight_read_along_another_axis_or_with_another_sign_is_named_as_quantization(misread, exporter):
    """The int8 weight's scales applied along the wrong axis, or its bytes read as uint8: a quantization fault
    naming the reading, not a weight from another checkpoint; re-run with PyTorch's weight, the segment agrees."""
    model = _Square().eval()
    inputs = (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(146)),)
    proto = dc.export(model, inputs, exporter)
    reader = _quantize_weight(proto, model.fc1.weight.detach().numpy().astype(np.float64), misread)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader, cause="quantization")
    assert "planted_dq" in fd.layer.segment and fd.confirmed, fd.layer.segment
    said = "scales applied along axis" if misread == "axis" else "integers read as int8"
    assert said in fd.explanation and "fc1.weight" in fd.explanation, fd.explanation


class _BiasedAttention(torch.nn.Module):
    """Attention with a relative bias handed in and divided by √d inside (LayoutLMv3), a Dropout on the
    probabilities; returns the context and the probabilities."""

    def __init__(self):
        super().__init__()
        self.qkv, self.drop = torch.nn.Linear(16, 48), torch.nn.Dropout(0.1)

    def forward(self, x, bias):  # (2, 6, 16), (2, 6, 6)
        q, k, v = self.qkv(x).chunk(3, -1)
        probs = self.drop(torch.softmax(q @ k.transpose(-1, -2) / 4.0 + bias / 4.0, -1))
        return probs @ v, probs


class _SharedBias(torch.nn.Module):
    """Two such layers reading one bias: the dynamo export computes ``bias / 4`` once, in the first layer's
    scope, and the second layer reads it from there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(147)
        self.layers = torch.nn.ModuleList(_BiasedAttention() for _ in range(2))
        self.rel, self.embed = torch.nn.Linear(1, 1), torch.nn.Linear(16, 16)

    def forward(self, x, pos):  # (2, 6, 16), (2, 6, 1): the bias from the positions, as LayoutLMv3's from boxes
        bias = self.rel((pos - pos.transpose(-1, -2))[..., None])[..., 0]
        x = self.embed(x)
        for layer in self.layers:
            x = x + layer(x, bias)[0]
        return x


def test_a_tensor_shared_across_layers_is_not_taken_for_the_probabilities_its_scope_does_not_hand_on():
    """The shared ``bias / 4`` leaves the first layer's scope and has the probabilities' shape; the probabilities
    do not leave it (only the product with v does).  Paired by scope and shape, the clean file showed a
    divergence at the Dropout; the tensor of the scope holding the value is paired instead, and the run is
    clean."""
    model = _SharedBias().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(148)),
              torch.randn(2, 6, 1, generator=torch.Generator().manual_seed(149)))
    proto = dc.export(model, inputs, "dynamo")
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status.value == "diverged"]
    drop = next(r for r in report.layers if r.pair.activation.module == "layers.0.drop")
    producer = next(n for n in proto.graph.node if drop.pair.tensor in n.output)
    assert producer.op_type == "Softmax", (drop.pair.tensor, producer.op_type)


def test_an_unsigned_quantizer_clipping_a_linears_negative_outputs_is_named_with_its_clipping(tmp_path):
    """A uint8 Q/DQ pair with zero point 0 inserted after fc1's product (as if a ReLU followed, which none does):
    the range from 0 is not taken for an absorbed ReLU when only the plain float twin reproduces PyTorch; the
    quantizer, cut off the segment where its integers are read, is shown, and its clipping measured."""
    model = _Square().eval()
    inputs = (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(149)),)
    proto = dc.export(model, inputs, "torchscript")
    matmul = next(n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm"))
    high = float(np.abs(model.fc1(inputs[0]).detach().numpy()).max()) * 1.1
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(high / 255, np.float32), "planted_s"),
                                    numpy_helper.from_array(np.array(0, np.uint8), "planted_z")])
    q = helper.make_node("QuantizeLinear", ["planted_x", "planted_s", "planted_z"], ["planted_q"], name="planted_quant")
    dq = helper.make_node("DequantizeLinear", ["planted_q", "planted_s", "planted_z"], [matmul.output[0]],
                          name="planted_dequant")
    matmul.output[0] = "planted_x"
    at = list(proto.graph.node).index(matmul) + 1
    proto.graph.node.insert(at, dq)
    proto.graph.node.insert(at, q)
    fd = _bisect(model, inputs, proto)
    _found(fd, "planted_quant", cause="quantization", at_most=4)
    [act] = [a for a in fd.evidence["activations"] if a["node"] == "planted_quant"]
    assert act["clip_fraction"] > 0.3 and not act["acts_as_relu"], act


class _Mlp(torch.nn.Module):
    """A Linear, an activation module, a Linear."""

    def __init__(self, act: torch.nn.Module):
        super().__init__()
        torch.manual_seed(150)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(16, 32), act, torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _erf_as_sign(proto: onnx.ModelProto) -> str:
    """GELU's Erf made a Sign: x/2·(1 + sign(x)) is a ReLU (a hidden_act read as 'relu')."""
    erf = next(n for n in proto.graph.node if n.op_type == "Erf")
    erf.op_type = "Sign"
    return erf.name


def _silu_as_gelu(proto: onnx.ModelProto) -> str:
    """x·sigmoid(x) made x·Φ(x): the Sigmoid replaced by 0.5·(1 + erf(x/√2))."""
    sig = next(n for n in proto.graph.node if n.op_type == "Sigmoid")
    proto.graph.initializer.extend([numpy_helper.from_array(np.array(2 ** -0.5, np.float32), "planted_k"),
                                    numpy_helper.from_array(np.array(1.0, np.float32), "planted_one"),
                                    numpy_helper.from_array(np.array(0.5, np.float32), "planted_half")])
    new = [helper.make_node("Mul", [sig.input[0], "planted_k"], ["planted_u"], name="planted_scale"),
           helper.make_node("Erf", ["planted_u"], ["planted_e"], name="planted_erf"),
           helper.make_node("Add", ["planted_e", "planted_one"], ["planted_a"], name="planted_add"),
           helper.make_node("Mul", ["planted_a", "planted_half"], [sig.output[0]], name="planted_phi")]
    at = list(proto.graph.node).index(sig)
    proto.graph.node.remove(sig)
    for n in reversed(new):
        proto.graph.node.insert(at, n)
    return "planted_erf"


@pytest.mark.parametrize("act,plant,exporter,said,scale", [
    (torch.nn.GELU(), _erf_as_sign, "torchscript", "applies ReLU", 1.0),
    (torch.nn.SiLU(), _silu_as_gelu, "dynamo", "applies GELU (erf)", 1.0),
    (torch.nn.SiLU(), _silu_as_gelu, "dynamo", "applies GELU (erf)", 60.0),
    (torch.nn.SiLU(), _silu_as_gelu, "torchscript", "applies GELU (erf)", 0.3)])
def test_an_activation_computed_as_another_function_is_named_with_both_functions(act, plant, exporter, said, scale):
    """Whatever ops the file writes it with, the function the segment applies to the activation's input is told
    from PyTorch's on the real values, and writing PyTorch's in its place makes the segment agree — also where the
    activations reach tens (GELU and SiLU then differ by 0.2 at most, a thousandth of the largest value), and where
    they stay small enough that a searched scale of the Erf's input bends Φ into a sigmoid's likeness (a fit that
    names no function ranks below the reading that does)."""
    model = _Mlp(act).eval()
    inputs = (scale * torch.randn(3, 16, generator=torch.Generator().manual_seed(151)),)
    proto = dc.export(model, inputs, exporter)
    planted = plant(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, planted, cause="attribute-mismatch", at_most=6)
    assert said in fd.explanation, fd.explanation


class _Residual(torch.nn.Module):
    """A post-norm residual block: LayerNorm(fc(h) + h) after a LayerNorm."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(152)
        self.ln1, self.fc, self.ln2 = torch.nn.LayerNorm(16), torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x):  # (2, 5, 16)
        h = self.ln1(x)
        return self.ln2(self.fc(h) + h)


def test_a_residual_add_reading_a_linears_product_before_its_bias_is_rewired_to_the_stream():
    """The residual Add reads the fc's MatMul output (its product before the bias Add) where the stream belongs
    (FNet, rewired): that product is no value PyTorch's addmm keeps, but it is the Linear's output less its bias
    — a right value in the wrong place — so the Add's input is tried at the earlier tensors and the stream
    reproduces PyTorch."""
    model = _Residual().eval()
    inputs = (torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(153)),)
    proto = dc.export(model, inputs, "dynamo")
    nodes = list(proto.graph.node)
    matmul = next(n for n in nodes if n.op_type == "MatMul")
    stream = next(n for n in nodes if n.op_type == "LayerNormalization").output[0]
    residual = next(n for n in nodes if n.op_type == "Add" and stream in n.input)
    residual.input[list(residual.input).index(stream)] = matmul.output[0]
    fd = _bisect(model, inputs, proto)
    _found(fd, residual.name, cause="attribute-mismatch")
    assert f"'{stream}'" in fd.explanation, fd.explanation


def test_with_a_fault_in_the_first_layers_softmax_the_shared_tensor_is_not_blamed():
    """The same file with the first layer's Softmax over the wrong axis: no tensor of its scope holds the
    probabilities now, and the shared ``bias / 4`` is not computed from the layer's input, so it is no output of
    the layer — left unpaired rather than measured against the probabilities (which blamed the nodes computing
    the bias) — and the Softmax is named."""
    model = _SharedBias().eval()
    inputs = (torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(148)),
              torch.randn(2, 6, 1, generator=torch.Generator().manual_seed(149)))
    proto = dc.export(model, inputs, "dynamo")
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    del softmax.attribute[:]
    softmax.attribute.append(onnx.helper.make_attribute("axis", -2))
    fd = _bisect(model, inputs, proto)
    _found(fd, softmax.name, cause="attribute-mismatch")
