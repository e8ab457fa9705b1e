"""Faults the twelfth sweep planted (scripts/sweep_faults_twelve.py) that no reading named: a float value truncated
through an integer Cast pair, a Sin computed as a Cos, an Einsum equation with two letters of a term exchanged."""
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


class _Features(torch.nn.Module):
    """Random Fourier features: a projection, its sine and cosine, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(121)
        self.proj, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(32, 4)

    def forward(self, x):
        z = self.proj(x)
        return self.head(torch.cat([torch.sin(z), torch.cos(z)], -1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_float_cast_through_int32_and_back_is_a_dtype_fault_named_at_the_cast(exporter):
    """A Cast to int32 and one back inserted after the projection: the sine reads whole numbers.  Named at the
    cast to int32, with how much of a fraction it cuts; keeping the value in float reproduces PyTorch."""
    model = _Features().eval()
    inputs = (torch.randn(3, 6, generator=torch.Generator().manual_seed(122)),)
    proto = dc.export(model, inputs, exporter)
    sin = next(n for n in proto.graph.node if n.op_type == "Sin")
    source = sin.input[0]
    down = helper.make_node("Cast", [source], [source + "_int"], name="planted_to_int32", to=TensorProto.INT32)
    up = helper.make_node("Cast", [source + "_int"], [source + "_trunc"], name="planted_from_int32",
                          to=TensorProto.FLOAT)
    for n in proto.graph.node:
        n.input[:] = [source + "_trunc" if t == source else t for t in n.input]
    at = list(proto.graph.node).index(sin)
    proto.graph.node.insert(at, up)
    proto.graph.node.insert(at, down)
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, "planted_to_int32", cause="dtype")
    assert evidence["casts_to_integer"] == ["planted_to_int32"] and 0.5 < evidence["fraction_lost_max"][
        "planted_to_int32"] < 1, evidence
    assert "int32" in fd.explanation and "fractions" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_sine_computed_as_a_cosine_is_named_at_the_node(exporter):
    model = _Features().eval()
    inputs = (torch.randn(3, 6, generator=torch.Generator().manual_seed(123)),)
    proto = dc.export(model, inputs, exporter)
    sin = next(n for n in proto.graph.node if n.op_type == "Sin")
    sin.op_type = "Cos"
    fd = _bisect(model, inputs, proto)
    _found(fd, sin.name)
    assert "= Cos where the PyTorch output implies Sin" in fd.explanation, fd.explanation


class _SetAttention(torch.nn.Module):
    """Attention written with einsum, as set encoders do."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(124)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):  # (n, s, 8)
        att = torch.softmax(torch.einsum("nsd,ntd->nst", self.q(x), self.k(x)) / 8 ** 0.5, -1)
        return self.out(torch.einsum("nst,ntd->nsd", att, self.v(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_einsum_reading_its_attention_transposed_is_named_with_the_equation(exporter):
    """The second Einsum's first term ``nst`` written ``nts`` (the attention read with its axes exchanged): the
    equation with those letters back reproduces PyTorch."""
    model = _SetAttention().eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(125)),)
    proto = dc.export(model, inputs, exporter)
    einsum = [n for n in proto.graph.node if n.op_type == "Einsum"][-1]
    equation = onnx.helper.get_attribute_value(next(a for a in einsum.attribute if a.name == "equation")).decode()
    left, out = equation.split("->")
    first, second = left.split(",")
    planted = f"{first[0]}{first[2]}{first[1]}{first[3:]},{second}->{out}"
    for a in einsum.attribute:
        if a.name == "equation":
            a.s = planted.encode()
    fd = _bisect(model, inputs, proto)
    _found(fd, einsum.name)
    assert f"equation = {planted} where the PyTorch output implies {equation}" in fd.explanation, fd.explanation


class _MaskedAttention(torch.nn.Module):
    """Causal attention through scaled_dot_product_attention with a boolean mask: the dynamo exporter writes
    PyTorch's safe softmax, a Softmax then a Where putting zeros where it gave NaN."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(126)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):  # (1, 6, 16)
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, 2, 8).transpose(1, 2) for f in (self.q, self.k, self.v))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, 16))


def test_a_node_that_computed_nothing_on_these_inputs_does_not_unpair_what_follows_it():
    """The safe softmax's Where changed nothing here (no row was all masked), so its output holds the softmax's
    value: that node is no match of its own, but the attention computed from it still pairs with PyTorch's
    ops — a stray offset added to the attention's output (no cause explains it) is narrowed to its own node, not
    the whole attention."""
    model = _MaskedAttention().eval()
    inputs = (torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(127)),)
    proto = dc.export(model, inputs, "dynamo")
    assert any(n.op_type == "IsNaN" for n in proto.graph.node), "the export writes no safe softmax"
    where = next(n for n in proto.graph.node if n.op_type == "Where" and any(
        i.op_type == "IsNaN" and i.output[0] in n.input for i in proto.graph.node))
    product = next(n for n in proto.graph.node if n.op_type == "MatMul" and where.output[0] in n.input)
    offset = np.random.default_rng(128).normal(0, 0.5, (1, 2, 6, 8)).astype(np.float32)
    bad = dc.plant.insert_offset(proto, product.output[0], offset)
    planted = next(n.name for n in bad.graph.node if n.name.endswith("_stray_Add"))
    fd = _bisect(model, inputs, bad)
    assert planted in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment


def _linear_output(proto, weight: np.ndarray) -> str:
    """The tensor a Linear whose weight is ``weight`` writes (its MatMul or Gemm, then its bias Add)."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    name = next(n for n, v in inits.items() if v.shape in (weight.shape, weight.T.shape)
                and (np.array_equal(v, weight) or np.array_equal(v, weight.T)))
    t = next(n for n in proto.graph.node if name in n.input).output[0]
    readers = [n for n in proto.graph.node if t in n.input]
    if len(readers) == 1 and readers[0].op_type == "Add" and any(i in inits for i in readers[0].input):
        t = readers[0].output[0]
    return t


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_head_split_reading_the_keys_where_the_value_projection_was_pruned_is_fed_its_value(exporter):
    """The values' head split reads the key projection's output and the value projection is gone from the file:
    no tensor holds the value module's output.  Fed PyTorch's value where the attention's product reads the heads,
    the segment reproduces PyTorch, and the Reshape and Transpose carrying the keys there are named with it: the
    first of them read the wrong tensor."""
    model = _MaskedAttention().eval()
    inputs = (torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(129)),)
    proto = dc.export(model, inputs, exporter)
    k_out = _linear_output(proto, model.k.weight.detach().numpy())
    v_out = _linear_output(proto, model.v.weight.detach().numpy())
    readers = [n for n in proto.graph.node if v_out in n.input]
    for n in readers:
        n.input[:] = [k_out if t == v_out else t for t in n.input]
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert {n.name for n in readers} & set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment
    assert "none of the earlier tensors tried holds" in fd.explanation, fd.explanation


def test_a_value_projection_pruned_from_a_slimmed_decoder_is_fed_at_the_head_split_reading_the_keys():
    """StarCoder2 (random weights) through onnxslim, the second layer's value head split reading the key
    projection and the value projection gone: the segment runs from the projections to the final norm (the
    value module has no tensor), and the ops walked back from the norm never reach it — the unpaired leaf
    module's value, fed at the head split's input, reproduces PyTorch there."""
    import onnxslim
    import sweep_models

    model, inputs = sweep_models.build("starcoder2")
    proto = onnxslim.slim(dc.export(model, inputs, "dynamo"))
    attn = model.model.layers[1].self_attn
    k_out = _linear_output(proto, attn.k_proj.weight.detach().numpy())
    v_out = _linear_output(proto, attn.v_proj.weight.detach().numpy())
    readers = [n for n in proto.graph.node if v_out in n.input]
    for n in readers:
        n.input[:] = [k_out if t == v_out else t for t in n.input]
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert {n.name for n in readers} <= set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment
    assert "v_proj value" in fd.explanation, fd.explanation


class _Blocks(torch.nn.Module):
    """Blocks of a sequence selected and concatenated in another order (a block-sparse attention's gathered
    keys), then a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(130)
        self.proj, self.head = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)

    def forward(self, x):  # (2, 12, 8)
        b = self.proj(x).view(2, 4, 3, 8)
        return self.head(torch.tanh(torch.cat([b[:, 1], b[:, 3], b[:, 0]], 1)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_block_selected_one_off_is_named_at_the_gather_with_the_concat_reading_it(exporter):
    """The Gather selecting block 3 selects block 1: the Concat reads one of PyTorch's values in the wrong place.
    Fed PyTorch's block there the segment agrees — the Gather that selected it is named with the Concat."""
    model = _Blocks().eval()
    inputs = (torch.randn(2, 12, 8, generator=torch.Generator().manual_seed(131)),)
    proto = dc.export(model, inputs, exporter)
    concat = next(n for n in proto.graph.node if n.op_type == "Concat" and len(n.input) == 3)
    gather = next(n for n in proto.graph.node if n.op_type == "Gather" and n.output[0] == concat.input[1])
    index = gather.input[1]
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(1, np.int64), "planted_index"))
    gather.input[1] = "planted_index"
    del index
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert {gather.name, concat.name} <= set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment


def _swap_windows(proto, first, second) -> None:
    """Slices ``first`` and ``second`` take each other's starts and ends (as initializers of their own: a
    TorchScript file's Constant nodes may come after the other Slice)."""
    constants = {n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in proto.graph.node
                 if n.op_type == "Constant"} | {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    windows = [[constants[t] for t in s.input[1:3]] for s in (first, second)]
    for k, (node, (start, end)) in enumerate(zip((first, second), windows[::-1])):
        proto.graph.initializer.extend([onnx.numpy_helper.from_array(start, f"planted_start_{k}"),
                                        onnx.numpy_helper.from_array(end, f"planted_end_{k}")])
        node.input[1:3] = [f"planted_start_{k}", f"planted_end_{k}"]


class _Halves(torch.nn.Module):
    """The two halves of a projection concatenated the other way round (rotate-half without the sign)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(132)
        self.proj, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)

    def forward(self, x):  # (2, 5, 6)
        h = self.proj(x)
        return self.head(torch.tanh(torch.cat([h[..., 8:], h[..., :8]], -1)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_two_slices_that_took_each_others_window_are_named_with_the_concat_joining_them(exporter):
    """The two Slices exchanged windows; the values say only that the Concat's pieces come in the other order —
    whichever reading is chosen, the Slices and the Concat are named."""
    model = _Halves().eval()
    inputs = (torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(133)),)
    proto = dc.export(model, inputs, exporter)
    concat = next(n for n in proto.graph.node if n.op_type == "Concat" and len(n.input) == 2
                  and all(any(s.op_type == "Slice" and s.output[0] == t for s in proto.graph.node) for t in n.input))
    first, second = (next(s for s in proto.graph.node if s.output[0] == t) for t in concat.input)
    _swap_windows(proto, first, second)
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert {first.name, second.name, concat.name} <= set(fd.layer.segment) and len(fd.layer.segment) <= 4, \
        fd.layer.segment


def test_zeros_a_scatter_writes_into_are_no_zeroed_weight():
    """Doge's dynamic mask attention (random weights) with its TopK made to keep the smallest scores.  The zeros
    its ScatterElements writes into (an initializer where the exporter folded zeros_like) have as many elements
    as a key projection's weight: zeros pair with anything of their size, and are no weight of the model but in
    a bias slot — the TopK is named, not a weight from another checkpoint."""
    import sweep_models

    model, inputs = sweep_models.build("doge")
    proto = dc.export(model, inputs, "dynamo")
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    scatter = next(n for n in proto.graph.node if n.op_type == "ScatterElements")
    assert scatter.input[0] in inits and not inits[scatter.input[0]].any(), "the export keeps no zeros initializer"
    topk = next(n for n in proto.graph.node if n.op_type == "TopK")
    kept = [a for a in topk.attribute if a.name != "largest"]
    del topk.attribute[:]
    topk.attribute.extend([*kept, helper.make_attribute("largest", 0)])
    fd = _bisect(model, inputs, proto)
    _found(fd, topk.name)
    assert "largest = 0" in fd.explanation, fd.explanation


class _RotateHalf(torch.nn.Module):
    """rotate_half on a projection: cat(-x2, x1) of its halves, then a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(136)
        self.proj, self.head = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x):  # (2, 5, 6)
        h = self.proj(x)
        return self.head(h * 0.5 + torch.cat([-h[..., 4:], h[..., :4]], -1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_rotate_halfs_slices_exchanged_are_named_though_one_holds_a_value_pytorch_has(exporter):
    """rotate_half's two Slices take each other's window.  The second one's output (x1's window read where x2's
    belongs) holds a value PyTorch has — x1 — so it pairs and is cut; the first computes inside the segment.
    Fed the first one's value at the cut and the first given the other's window, the segment agrees."""
    model = _RotateHalf().eval()
    inputs = (torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(137)),)
    proto = dc.export(model, inputs, exporter)
    concat = next(n for n in proto.graph.node if n.op_type == "Concat")
    producer = {o: n for n in proto.graph.node for o in n.output}
    neg = producer[concat.input[0]]
    first, second = producer[neg.input[0]], producer[concat.input[1]]
    assert first.op_type == second.op_type == "Slice", (first.op_type, second.op_type)
    _swap_windows(proto, first, second)
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert {first.name, second.name} <= set(fd.layer.segment) and len(fd.layer.segment) <= 4, fd.layer.segment


class _Unfold(torch.nn.Module):
    """A 3×3 neighbourhood unfolded (im2col: a Pad, then a Gather per spatial axis), weighted per position."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(138)
        self.conv, self.head = torch.nn.Conv2d(3, 4, 1), torch.nn.Linear(36, 5)

    def forward(self, x):  # (2, 3, 6, 6)
        cols = torch.nn.functional.unfold(torch.relu(self.conv(x)), 3, padding=1)  # (2, 36, 36)
        return self.head(cols.transpose(1, 2))


def test_a_pad_shifted_before_an_unfold_is_named_with_the_gathers_that_could_undo_it():
    """The unfold's Pad puts two columns on the right and none on the left (its total kept): shifted indices
    in the Gather selecting from it undo that as well, so the values cannot tell the two apart — the Pad the
    Gathers select from is named with them (onnxslim's file, where the narrowing lands on the Gathers)."""
    import onnxslim

    model = _Unfold().eval()
    inputs = (torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(139)),)
    proto = onnxslim.slim(dc.export(model, inputs, "dynamo"))
    pad = next(n for n in proto.graph.node if n.op_type == "Pad")
    inits = {i.name: i for i in proto.graph.initializer}
    pads = onnx.numpy_helper.to_array(inits[pad.input[1]]).copy()
    rank = pads.size // 2
    pads[rank - 1], pads[2 * rank - 1] = pads[rank - 1] + 1, pads[2 * rank - 1] - 1
    proto.graph.initializer.append(onnx.numpy_helper.from_array(pads, "planted_pads"))
    pad.input[1] = "planted_pads"
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert pad.name in fd.layer.segment and len(fd.layer.segment) <= 4, fd.layer.segment


class _PooledNorm(torch.nn.Module):
    """A BatchNorm after a pooling (no conv to fold it into), then a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(140)
        self.conv, self.pool, self.bn = torch.nn.Conv2d(3, 6, 3), torch.nn.AvgPool2d(2), torch.nn.BatchNorm2d(6)
        self.head = torch.nn.Linear(6, 2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1), self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5), self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):  # (2, 3, 8, 8)
        return self.head(self.bn(self.pool(torch.relu(self.conv(x)))).mean((2, 3)))


class _LinearNorm(torch.nn.Module):
    """A BatchNorm1d after a Linear (TabNet's GLU blocks): the Linear carries no fold of it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(142)
        self.fc, self.bn, self.head = torch.nn.Linear(12, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1), self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 1.5), self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):  # (4, 12)
        return self.head(torch.relu(self.bn(self.fc(x))))


@pytest.mark.parametrize("mistake,after", [("variance", "pool"), ("mean", "pool"), ("variance", "linear")])
def test_a_batchnorm_written_as_a_scale_and_shift_with_a_folding_mistake_is_a_batchnorm_fold(mistake, after):
    """The BatchNormalization node replaced by a per-channel Mul and Add whose constants fold it with one mistake
    (the variance for the standard deviation, or the running mean not subtracted): a fold, named with the
    mistake that fits and confirmed by writing the true scale and shift.  After a Linear too: the Linear's
    weights hold no fold, and the BatchNorm's own Mul and Add are judged."""
    model = (_PooledNorm() if after == "pool" else _LinearNorm()).eval()
    shape = (2, 3, 8, 8) if after == "pool" else (4, 12)
    inputs = (torch.randn(*shape, generator=torch.Generator().manual_seed(141)),)
    proto = dc.export(model, inputs, "torchscript")
    bn = next(n for n in proto.graph.node if n.op_type == "BatchNormalization")
    g, b, m, v = (model.bn.weight, model.bn.bias, model.bn.running_mean, model.bn.running_var)
    g, b, m, v = (t.detach().numpy().astype(np.float64) for t in (g, b, m, v))
    scale = g / (v + model.bn.eps) if mistake == "variance" else g / np.sqrt(v + model.bn.eps)
    shift = b - m * scale if mistake == "variance" else b
    per_channel = (1, -1, 1, 1) if after == "pool" else (1, -1)
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(scale.reshape(per_channel).astype(np.float32), "planted_scale"),
        onnx.numpy_helper.from_array(shift.reshape(per_channel).astype(np.float32), "planted_shift")])
    mul = helper.make_node("Mul", [bn.input[0], "planted_scale"], ["planted_scaled"], name="planted_mul")
    add = helper.make_node("Add", ["planted_scaled", "planted_shift"], [bn.output[0]], name="planted_add")
    at = list(proto.graph.node).index(bn)
    proto.graph.node.remove(bn)
    proto.graph.node.insert(at, add)
    proto.graph.node.insert(at, mul)
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "batchnorm-fold" and fd.confirmed, fd.explanation
    assert {"planted_mul", "planted_add"} & set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment
    want = {"variance": "variance-for-std", "mean": "mean-not-subtracted"}[mistake]
    assert fd.evidence["mistake"] == want, fd.evidence


def test_a_float16_files_weight_holding_its_parameters_numbers_reshaped_is_laid_out_back(tmp_path):
    """A float16 file (onnxconverter-common, keep_io_types) whose up projection's weight holds PyTorch's numbers
    reshaped where a transpose belongs: the numbers are the parameter's rounded to float16, which is still the
    same multiset once the parameter is rounded too."""
    import alignment_corpus
    from test_diagnose_eleven import _TwoLinears

    model = _TwoLinears().eval()
    inputs = (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(142)),)
    onnx.save(dc.export(model, inputs, "dynamo"), tmp_path / "float32.onnx")
    alignment_corpus.fp16(tmp_path / "float32.onnx", tmp_path / "float16.onnx")
    proto = onnx.load(tmp_path / "float16.onnx")
    want = model.up.weight.detach().numpy().T.astype(np.float16)
    init = next(i for i in proto.graph.initializer
                if tuple(i.dims) == want.shape and np.array_equal(onnx.numpy_helper.to_array(i), want))
    planted = model.up.weight.detach().numpy().reshape(8, 12).astype(np.float16)
    init.CopyFrom(onnx.numpy_helper.from_array(planted, init.name))
    reader = next(n.name for n in proto.graph.node if init.name in n.input)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto, atol=0.01, rtol=0.01).first_divergence
    _found(fd, reader, cause="weight-mismatch")
    assert "reshape where a transpose belongs" in fd.explanation, fd.explanation


class _RmsNorm(torch.nn.Module):
    """x · rsqrt(mean(x²) + eps) · w, then a head (LLaMA's RMSNorm, written out)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(143)
        self.proj, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(16, 3)
        self.weight = torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):  # (2, 5, 6)
        h = self.proj(x)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight
        return self.head(h)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_square_root_computed_as_its_inverse_is_named_with_the_reciprocal_and_product_after_it(exporter):
    """The Sqrt before the Reciprocal computes Pow(x, −0.5): its output is PyTorch's rsqrt, so the error shows
    after the Reciprocal — where the product made a Division, or the Reciprocal removed, equally undoes it.  The
    values cannot tell which inverse is wrong: the powers feeding the product are named with it."""
    model = _RmsNorm().eval()
    inputs = (torch.randn(2, 5, 6, generator=torch.Generator().manual_seed(144)),)
    proto = dc.export(model, inputs, exporter)
    sqrt = next(n for n in proto.graph.node if n.op_type == "Sqrt")
    sqrt.op_type = "Pow"
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.array(-0.5, np.float32), "planted_exponent"))
    sqrt.input.append("planted_exponent")
    fd = _bisect(model, inputs, proto)
    assert fd.cause == "attribute-mismatch" and fd.confirmed, fd.explanation
    assert sqrt.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment


class _Scan(torch.nn.Module):
    """A recurrence writing each step into a buffer allocated with zeros (``out[:, t] = s``), then the buffer
    scaled and a head: the file computes the buffer with one ScatterND per step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(145)
        self.proj, self.head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 3)

    def forward(self, x):  # (2, 6, 4)
        h = self.proj(x)
        out, s = torch.zeros(2, 6, 8), torch.zeros(2, 8)
        for t in range(6):
            s = torch.tanh(s + h[:, t])
            out[:, t] = s
        return self.head(out * 0.25 + out.cumsum(1))


def test_a_buffer_written_in_place_is_recorded_whole_after_each_write():
    """``out[:, t] = s`` copies into a view of a buffer allocated with zeros: no op computes the buffer, but the
    file does (one ScatterND per step).  Each write records the whole buffer as it then is, computed from the
    value written and the buffer before it — so a segment through the writes pairs them and can narrow past
    them (xLSTM's chunked backend, a 587-node segment, narrowed to its planted Where only so)."""
    from onnx_bisect.capture import dispatch
    from onnx_bisect.records import ModelInputs

    model = _Scan().eval()
    x = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(146))
    ops = dispatch.capture_window(model, ModelInputs((x,), {}, ("x",)), None, ("", 0), first_index=0)
    writes = [a for a in ops if a.module_type.startswith("aten.copy_.base")]
    assert len(writes) == 6, [a.module_type for a in ops]
    with torch.no_grad():
        h = model.proj(x)
        out, s = torch.zeros(2, 6, 8), torch.zeros(2, 8)
        for t in range(6):
            s = torch.tanh(s + h[:, t])
            out[:, t] = s
            np.testing.assert_allclose(writes[t].value, out.numpy(), rtol=1e-6)
    assert all(writes[t - 1].index in writes[t].inputs for t in range(1, 6))


def test_a_state_whose_computation_a_simplifier_pruned_is_not_paired_with_the_zeros_left_in_its_place():
    """xLSTM (random weights) exported by TorchScript and simplified by onnxsim: the backend also returns its
    final memory state, which nothing reads, so its updates are pruned and the scope's boundary names the zeros
    it starts from.  Those zeros are computed from no input and hold none of the state's numbers: no layer's
    output, so the clean file reports no layer introducing error (it warned of six before)."""
    import onnxsim
    import sweep_models

    model, inputs = sweep_models.build("xlstm")
    proto, ok = onnxsim.simplify(dc.export(model, inputs, "torchscript"))
    assert ok
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.diff is not None and not r.diff.ok]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_kernel_with_its_spatial_axes_exchanged_is_laid_out_back(exporter):
    """A 3×3 kernel (folded with its BatchNorm: no parameter holds its numbers) stored [kw, kh] and read [kh, kw]:
    transposed back, the segment reproduces PyTorch."""
    model = _PooledNorm().eval()
    inputs = (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(147)),)
    proto = dc.export(model, inputs, exporter)
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    init = next(i for i in proto.graph.initializer if i.name == conv.input[1])
    kernel = onnx.numpy_helper.to_array(init)
    init.CopyFrom(onnx.numpy_helper.from_array(np.ascontiguousarray(np.swapaxes(kernel, 2, 3)), init.name))
    fd = _bisect(model, inputs, proto)
    _found(fd, conv.name, cause="weight-mismatch")
    assert "spatial axes exchanged" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_linears_bias_add_reading_another_tensor_where_its_product_was_pruned_is_fed_the_product(exporter):
    """The down projection's bias Add reads the up projection's output and its MatMul is gone from the file: no
    op of PyTorch's holds the product (the Linear adds its bias in one op), but its output less its bias is it —
    fed there, the segment reproduces PyTorch."""
    from test_diagnose_eleven import _TwoLinears

    class Square(_TwoLinears):
        def __init__(self):
            super().__init__()
            torch.manual_seed(148)
            self.up, self.down = torch.nn.Linear(8, 12), torch.nn.Linear(12, 12)

        def forward(self, x):
            return self.down(torch.tanh(self.up(x))).sum(-1, keepdim=True) * self.up(x)

    model = Square().eval()
    inputs = (torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(149)),)
    proto = dc.export(model, inputs, exporter)
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    bias = model.down.bias.detach().numpy()
    add = next(n for n in proto.graph.node if n.op_type == "Add" and any(
        t in inits and inits[t].shape == bias.shape and np.array_equal(inits[t], bias) for t in n.input))
    producer = {o: n for n in proto.graph.node for o in n.output}
    k = next(j for j, t in enumerate(add.input) if t in producer and producer[t].op_type == "MatMul")
    tanh = next(n for n in proto.graph.node if n.op_type == "Tanh")
    add.input[k] = tanh.output[0]
    _prune_dead(proto)
    fd = _bisect(model, inputs, proto)
    _found(fd, add.name)
    assert "product before its bias" in fd.explanation, fd.explanation
