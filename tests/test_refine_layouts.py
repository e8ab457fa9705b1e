"""Narrowing where names and values mislead: a quantized file (its tensors hold PyTorch's values only to the
quantization step), a Reshape to a wrong shape that keeps the elements in order, a quantized weight that is
not PyTorch's, a Split's outputs."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import onnx_bisect
from onnx_bisect.capture import dispatch
from onnx_bisect.report.text import to_json
from onnx_bisect.records import ModelInputs
from onnx_bisect.report.text import computing_nodes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
import plant  # noqa: E402
from cpu import VNNI  # noqa: E402


def _quantized_transformer():
    """The fixture transformer quantized by onnxruntime (QDQ int8), and a tolerance its clean outputs meet."""
    case = dc.quantization_static("transformer", "torchscript")
    with dc.quiet():
        strict = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto)
    return case, 1.5 * max(o.diff.max_abs for o in strict.outputs)


def _bisect(case, proto, tol):
    with dc.quiet():
        return onnx_bisect.bisect(case.model, case.inputs, onnx=proto, atol=tol, rtol=0.0)


@VNNI
def test_a_softmax_axis_in_a_quantized_file_is_narrowed_to_the_softmax():
    """Every tensor of a QDQ file differs from PyTorch by its quantization step, so no op value pairs with it
    at float noise: the segment is searched in its float twin (Q/DQ pairs undone), and the region found there is
    named by the file's nodes."""
    case, tol = _quantized_transformer()
    softmax = next(n for n in case.proto.graph.node if n.op_type == "Softmax")
    bad = plant.set_attribute(case.proto, softmax.name, "axis", 1)
    report = _bisect(case, bad, tol)
    fd = report.first_divergence
    assert not report.ok and fd is not None
    assert softmax.name in fd.layer.segment and len(fd.layer.segment) <= 12, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    assert fd.within is not None and len(fd.within.segment) > len(fd.layer.segment)


@VNNI
def test_a_quantized_weight_that_is_not_pytorchs_is_a_weight_mismatch():
    """Noise written into an int8 weight puts most elements beyond half a quantization step of PyTorch's weight:
    rounding cannot explain that, so the cause is the weight, not quantization."""
    case, tol = _quantized_transformer()
    model = onnx.ModelProto()
    model.CopyFrom(case.proto)
    dq = next(n for n in model.graph.node if n.op_type == "DequantizeLinear"
              and any(i.name == n.input[0] and i.data_type == onnx.TensorProto.INT8 and len(i.dims) == 2
                      for i in model.graph.initializer))
    init = next(i for i in model.graph.initializer if i.name == dq.input[0])
    q = onnx.numpy_helper.to_array(init).astype(np.int16)
    noise = np.random.default_rng(0).integers(-12, 13, q.shape)
    init.CopyFrom(onnx.numpy_helper.from_array(np.clip(q + noise, -127, 127).astype(np.int8), init.name))
    report = _bisect(case, model, tol)
    fd = report.first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, (fd and fd.cause)
    [row] = fd.evidence["parameters"]
    assert row["initializer"] == dq.input[0]
    consumer = next(n.name for n in model.graph.node if dq.output[0] in n.input)
    assert consumer in fd.layer.segment and len(fd.layer.segment) <= 12


def test_a_reshape_that_keeps_the_elements_in_order_but_not_the_shape():
    """A Reshape to a wrong shape of the same size holds PyTorch's elements in PyTorch's order (it matches a
    value only as a reshape), and the error appears after the Transpose that follows: the Reshape is found by
    feeding the op's value in the op's own shape, and its shape constant is named."""
    model, inputs, proto = dc.clean("transformer", "torchscript")
    reshape, shape = None, None
    for n in proto.graph.node:
        if n.op_type != "Reshape":
            continue
        value = plant._constant(proto, n.input[1])
        consumers = [c for c in proto.graph.node if n.output[0] in c.input]
        if value is not None and value.size >= 4 and value[0] != value[1] and consumers \
                and consumers[0].op_type == "Transpose":
            reshape, shape = n, value
            break
    assert reshape is not None, "the fixture has a multi-head Reshape before a Transpose"
    planted = shape.copy()
    planted[[0, 1]] = shape[[1, 0]]  # the same elements in the same order, in another shape
    bad = _with_shape(proto, reshape, planted)
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs, onnx=bad)
    fd = report.first_divergence
    assert fd is not None and reshape.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd and fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True
    assert [int(x) for x in shape] in [row["expected"] for row in fd.evidence["attributes"]]


def _with_shape(proto: onnx.ModelProto, reshape: onnx.NodeProto, value: np.ndarray) -> onnx.ModelProto:
    """A copy of ``proto`` whose Reshape ``reshape`` reads a new constant ``value``."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    name = f"{reshape.input[1]}_planted"
    out.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    node = next(n for n in out.graph.node if n.name == reshape.name)
    node.input[1] = name
    return out


def test_every_output_of_a_split_is_recorded():
    """``split`` returns a list of tensors, each a value an ONNX Split output holds (the first alone was kept:
    what was computed from the others had no recorded input, and every match after it fell out of order)."""
    class Heads(torch.nn.Module):
        def forward(self, x):
            q, k, v = x.split(4, dim=-1)
            return q * 2 + k.exp() - v

    ops = dispatch.capture_window(Heads().eval(), ModelInputs((torch.randn(2, 12),), {}, ("x",)), None, ("", 0),
                                  first_index=0)
    splits = [a for a in ops if a.module_type.startswith("aten.split")]
    assert len(splits) == 3 and [a.value.shape for a in splits] == [(2, 4)] * 3
    exp = next(a for a in ops if a.module_type.startswith("aten.exp"))
    assert exp.inputs == (splits[1].index,)


class PatchAttention(torch.nn.Module):
    """MobileViT's shape: patches unfolded by a Transpose, attention over one token per patch (its Softmax is
    all ones whatever its inputs), a classifier."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.qkv = torch.nn.Linear(8, 24)
        self.proj = torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(128, 5)

    def forward(self, x):
        tokens = self.conv(x).reshape(1, 8, 16).transpose(1, 2).reshape(16, 1, 8)
        q, k, v = self.qkv(tokens).chunk(3, dim=-1)
        attention = torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1)  # (16, 1, 1): ones
        return self.head(self.proj(attention @ v).reshape(1, 128))


def test_a_match_that_is_one_number_repeated_vouches_for_nothing_and_a_transpose_takes_its_ops_perm(tmp_path):
    """A wrong perm on the patch Transpose of a file whose names say nothing (dynamo, every node and tensor
    renamed): after it only the all-ones Softmax still matches PyTorch, and it must not make the tensors it was
    computed from look right. The Transpose is found, and its perm is the one aten.transpose's axes imply."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fault_sweep import rename

    model, x = PatchAttention().eval(), torch.randn(1, 3, 4, 4)
    proto = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    transpose = next(n for n in proto.graph.node if n.op_type == "Transpose"
                     and list(next(a.ints for a in n.attribute if a.name == "perm")) == [0, 2, 1])
    onnx.save(plant.set_attribute(proto, transpose.name, "perm", [0, 1, 2]), tmp_path / "bad.onnx")
    rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    renamed = onnx.load(tmp_path / "renamed.onnx")
    planted = next(n.name for n in renamed.graph.node if n.op_type == "Transpose"
                   and list(next(a.ints for a in n.attribute if a.name == "perm")) == [0, 1, 2])
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=str(tmp_path / "renamed.onnx"))
    fd = report.first_divergence
    assert not report.ok and planted in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    row = fd.evidence["attributes"][0]
    assert row["onnx_node"] == planted and row["expected"] == [0, 2, 1] and "aten.transpose.int" in row["source"]


class Tagger(torch.nn.Module):
    """An embedding projection, a 2-layer LSTM (its initial states zeros the file expands to the batch's shape),
    a classifier per step."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.proj = torch.nn.Linear(6, 16)
        self.lstm = torch.nn.LSTM(16, 16, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.lstm(torch.relu(self.proj(x)))[0])


@VNNI
def test_zeros_matching_every_initial_state_do_not_undo_the_matches_of_a_quantized_lstm():
    """In a quantized 2-layer LSTM whose second layer's recurrence weights are not PyTorch's, the initial states
    (zeros: they equal every zero state PyTorch selects) must not make the first layer's good values look out of
    order: the region is the second layer, not both."""
    model, x = Tagger().eval(), torch.randn(2, 5, 6)
    proto = dc.export(model, (x,), "torchscript")
    quantized = plant.quantize_static_qdq(proto, {proto.graph.input[0].name: x.numpy()})
    lstms = [n for n in quantized.graph.node if n.op_type == "LSTM"]
    second = lstms[1]
    bad = plant.perturb_initializer(quantized, second.input[1], rel=1.0)  # W: the input weights
    tol = 0.01
    with dc.quiet():
        while any(r.diff is not None and not r.diff.ok for r in
                  onnx_bisect.bisect(model, (x,), onnx=quantized, atol=tol, rtol=0.0).layers):
            tol *= 2  # the smallest tolerance (by doubling) at which no layer of the clean file diverges
        report = onnx_bisect.bisect(model, (x,), onnx=bad, atol=tol, rtol=0.0)
    fd = report.first_divergence
    assert not report.ok and fd is not None and fd.layer.pair.activation.module_type.startswith("aten.mkldnn_rnn")
    assert second.name in fd.layer.segment and lstms[0].name not in fd.layer.segment, fd.layer.segment
    assert len(computing_nodes(fd.layer)) <= 12 and fd.cause == "weight-mismatch"


class WindowAttention(torch.nn.Module):
    """Swin's attention: a relative position bias gathered from a table (the TorchScript exporter folds it into
    one initializer, which the quantizer then quantizes: no PyTorch parameter holds that constant), heads
    transposed back before the output projection."""

    def __init__(self, tokens: int = 9, dim: int = 16, heads: int = 2):
        super().__init__()
        torch.manual_seed(2)
        self.heads, self.qkv, self.proj = heads, torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.table = torch.nn.Parameter(torch.randn(2 * tokens - 1, heads))
        pos = torch.arange(tokens)
        self.register_buffer("index", (pos[:, None] - pos[None, :] + tokens - 1).reshape(-1))

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        bias = self.table[self.index].reshape(n, n, self.heads).permute(2, 0, 1)
        attention = torch.softmax(q @ k.transpose(-2, -1) * 0.35 + bias.unsqueeze(0), dim=-1)
        return self.proj((attention @ v).transpose(1, 2).reshape(b, n, c))


def test_a_quantized_constant_no_parameter_holds_takes_pytorchs_op_value_in_the_float_twin():
    """A wrong perm on the Transpose after attention @ V in a QDQ file whose folded position bias is quantized:
    the float twin computes the bias from the value of PyTorch's op it rounds (else every tensor after the bias
    differs by its quantization step and the Transpose hides among them), and the Transpose is found."""
    model, x = WindowAttention().eval(), torch.randn(2, 9, 16)
    proto = dc.export(model, (x,), "torchscript")
    quantized = plant.quantize_static_qdq(proto, {proto.graph.input[0].name: x.numpy()})
    transpose = [n for n in quantized.graph.node if n.op_type == "Transpose"][-1]
    perm = list(next(a.ints for a in transpose.attribute if a.name == "perm"))
    assert perm == [0, 2, 1, 3]
    bad = plant.set_attribute(quantized, transpose.name, "perm", [0, 2, 3, 1])
    tol = 0.01
    with dc.quiet():
        while any(r.diff is not None and not r.diff.ok for r in
                  onnx_bisect.bisect(model, (x,), onnx=quantized, atol=tol, rtol=tol).layers):
            tol *= 2
        report = onnx_bisect.bisect(model, (x,), onnx=bad, atol=tol, rtol=tol)
    fd = report.first_divergence
    assert not report.ok and transpose.name in fd.layer.segment and len(computing_nodes(fd.layer)) <= 3, \
        fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation


class ChannelsLastBlock(torch.nn.Module):
    """ConvNeXt's block: a depthwise conv, channels moved last by a permute, LayerNorm and Linears there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.dwconv = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.norm = torch.nn.LayerNorm(8)
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        self.head = torch.nn.Linear(8 * 36, 4)

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # N, H, W, C with H == W
        y = self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(y))))
        return self.head(y.reshape(1, -1))


def test_a_permutation_of_equal_axes_is_no_pair_and_the_transpose_is_found(tmp_path):
    """A Transpose that swaps H and W as well (perm [0, 3, 2, 1] where [0, 2, 3, 1] was due) keeps every shape
    of a square input: the tensors after it hold PyTorch's values with H and W swapped, which must not pair
    (else the LayerNorm and the Linear after it look right and the blame lands further on)."""
    report, planted = _channels_last_swapped(ChannelsLastBlock().eval(), torch.randn(1, 8, 6, 6), tmp_path)
    fd = report.first_divergence
    assert not report.ok and planted in fd.layer.segment and len(computing_nodes(fd.layer)) <= 2, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    swapped = [r for r in report.layers if r.pair.note and "transposed" in r.pair.note and r.diff is not None
               and r.diff.shape == tuple(r.pair.activation.value.shape)]
    assert not swapped, [r.pair.note for r in swapped]



class ChannelsLastMixer(torch.nn.Module):
    """A Linear over channels-last tokens of a square map, permuted back to channels-first and added to it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm, self.mix = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)
        self.head = torch.nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        t = self.mix(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.head(torch.relu(t) + x)


@pytest.mark.parametrize("batch", [2, 1])
def test_a_value_permuted_back_with_equal_axes_swapped_is_no_pair(tmp_path, batch):
    """The channels-last Transpose swaps H and W too ([0, 3, 2, 1] for [0, 2, 3, 1]): the Linear's value then
    reaches the graph permuted back to channels-first as (C, W, H), a shape of its own that it fits only with H
    and W swapped; paired there, the Linear looked right and the ReLU after it was blamed.  With a batch of one
    the size-1 axis can go anywhere in a permutation (ConvNeXt in an onnxslim file: (3, 0, 2, 1) laid the value
    out as 6 x 1 x 6 x 8, no shape of the graph's, and slipped past the rule)."""
    x = torch.randn(batch, 3, 6, 6, generator=torch.Generator().manual_seed(7))
    report, planted = _channels_last_swapped(ChannelsLastMixer().eval(), x, tmp_path)
    fd = report.first_divergence
    assert not report.ok and planted in fd.layer.segment and len(computing_nodes(fd.layer)) <= 2, fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    mix = next(r for r in report.layers if r.pair.activation.module == "mix")
    assert mix.status.value != "matched", (mix.pair.tensor, mix.pair.perm)


def _channels_last_swapped(model, x, tmp_path):
    """``(report, planted node)``: the dynamo export of ``model`` with its channels-last Transpose ([0, 2, 3, 1])
    swapping H and W too ([0, 3, 2, 1]), every node and tensor renamed, bisected."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from fault_sweep import rename

    proto = torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto
    transpose = next(n for n in proto.graph.node if n.op_type == "Transpose"
                     and list(next(a.ints for a in n.attribute if a.name == "perm")) == [0, 2, 3, 1])
    onnx.save(plant.set_attribute(proto, transpose.name, "perm", [0, 3, 2, 1]), tmp_path / "bad.onnx")
    rename(tmp_path / "bad.onnx", tmp_path / "renamed.onnx")
    planted = next(n.name for n in onnx.load(tmp_path / "renamed.onnx").graph.node if n.op_type == "Transpose"
                   and list(next(a.ints for a in n.attribute if a.name == "perm")) == [0, 3, 2, 1])
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=str(tmp_path / "renamed.onnx")), planted


class _SelfAttention(torch.nn.Module):
    """Attention whose projections have biases: PyTorch runs each as one addmm, TorchScript writes MatMul + Add."""

    def __init__(self, d: int = 16):
        super().__init__()
        torch.manual_seed(21)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(d, d) for _ in range(4))

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4.0
        return torch.relu(self.out(torch.softmax(scores, dim=-1) @ self.v(x)))


def test_a_weight_fault_in_a_projection_pytorch_runs_as_one_addmm_is_narrowed_to_its_nodes():
    """The out projection's MatMul holds no op's value (PyTorch's addmm adds the bias in the same op), so no
    counterpart can be fed before the output: the nodes computing the wrong tensors from right ones (the MatMul
    and its Add), re-run from those right values, are the region — not the whole attention segment."""
    model, x = _SelfAttention().eval(), torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(22))
    proto = dc.export(model, (x,), "torchscript")
    matmul = next(n for n in proto.graph.node if n.name == "/out/MatMul")
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=plant.perturb_initializer(proto, matmul.input[1], rel=0.3))
    fd = report.first_divergence
    assert not report.ok and matmul.name in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation


class CausalAttention(torch.nn.Module):
    """Two heads with a causal mask sized by the query (``q.size(-2)``): a TorchScript export computes the mask
    from the query's Shape, and the sequence equals the head size, so a wrong perm keeps every shape."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        torch.manual_seed(23)
        self.heads, self.head = heads, d // heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = (t.view(b, n, self.heads, self.head).transpose(1, 2) for t in self.qkv(x).split(d, dim=-1))
        size = q.size(-2)
        bias = torch.where(torch.tril(torch.ones(size, size, dtype=torch.bool)), 0.0, float("-inf"))
        scores = q @ k.transpose(-1, -2) / self.head ** 0.5 + bias
        context = torch.softmax(scores, dim=-1) @ v
        return self.out(context.transpose(1, 2).reshape(b, n, d))


def test_a_mask_sized_by_the_query_is_not_computed_from_its_values(tmp_path):
    """The mask's value depends on the query only through its Shape: were that a data dependency, the query
    (PyTorch computes the mask from no tensor) would look out of order, every op pair after it would be
    dropped, and a wrong perm on the Transpose after attention @ V be blamed with the whole attention (GPT-2
    and Phi in TorchScript files: 29- and 38-node segments)."""
    model, x = CausalAttention().eval(), torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(5))
    buffer = io.BytesIO()
    with dc.quiet():  # a dynamic sequence: the mask's size is read off the query at run time
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {1: "sequence"}})
    proto = onnx.load_from_string(buffer.getvalue())
    assert any(n.op_type == "Shape" for n in proto.graph.node)
    transpose = [n for n in proto.graph.node if n.op_type == "Transpose"][-1]
    assert list(next(a.ints for a in transpose.attribute if a.name == "perm")) == [0, 2, 1, 3]
    bad = plant.set_attribute(proto, transpose.name, "perm", [0, 3, 1, 2])
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert not report.ok and transpose.name in fd.layer.segment and len(computing_nodes(fd.layer)) <= 2, \
        fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation


class RelativeBias(torch.nn.Module):
    """Scores plus a bias gathered from a table by relative coordinates computed at run time from the scores'
    size (BEiT's relative position bias): the coordinates are integers, permuted by a Transpose."""

    def __init__(self, window: int = 4, heads: int = 2):
        super().__init__()
        torch.manual_seed(29)
        self.window = window
        self.table = torch.nn.Parameter(torch.randn((2 * window - 1) ** 2, heads))

    def forward(self, scores):
        n, w = scores.size(-1), self.window
        position = torch.arange(n)
        coords = torch.stack((position // w, position % w))  # 2, n
        relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (w - 1)  # n, n, 2
        index = relative[..., 0] * (2 * w - 1) + relative[..., 1]
        bias = self.table[index.reshape(-1)].reshape(n, n, -1).permute(2, 0, 1)
        return torch.softmax(scores + bias, dim=-1)


class BiasedScores(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(30)
        self.proj, self.bias = torch.nn.Linear(16, 16), RelativeBias()

    def forward(self, x):
        return self.bias(self.proj(x))


def test_a_fix_that_changes_one_node_of_an_integer_computation_pins_the_segment_to_it():
    """A wrong permutation of integer coordinates: no float tensor holds PyTorch's value until the Gather that
    reads them, so the values narrow the divergence only to the whole index computation; the confirmed fix
    changes one node of it, and the segment is that node (BEiT in a TorchScript file: 264 nodes -> 1)."""
    model, x = BiasedScores().eval(), torch.randn(1, 2, 16, 16, generator=torch.Generator().manual_seed(8))
    buffer = io.BytesIO()
    with dc.quiet():  # a dynamic size: the coordinates are computed at run time, not folded into a constant
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {2: "n", 3: "m"}})
    proto = onnx.load_from_string(buffer.getvalue())
    transpose = next(n for n in proto.graph.node if n.op_type == "Transpose"
                     and list(next(a.ints for a in n.attribute if a.name == "perm")) == [1, 2, 0])
    bad = plant.set_attribute(proto, transpose.name, "perm", [2, 1, 0])
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert not report.ok and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.layer.segment == (transpose.name,), fd.layer.segment
    assert fd.within is not None and len(fd.within.segment) > 1
    assert fd.fixed_nodes == (transpose.name,)
    assert to_json(report)["first_divergence"]["fixed_nodes"] == [transpose.name]


class _SquareTokens(torch.nn.Module):
    """A Conv's map flattened to tokens and transposed to (tokens, channels): 16 x 16, square."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(21)
        self.conv, self.norm, self.fc = torch.nn.Conv2d(16, 16, 1), torch.nn.LayerNorm(16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc(self.norm(self.conv(x).flatten(2).transpose(1, 2)))


def test_an_unexplained_narrowed_op_is_diagnosed_again_as_the_segment_it_was_narrowed_from():
    """A Transpose whose permutation became the identity holds the value of PyTorch's flatten, the op before the
    transpose: the values narrow the divergence to the LayerNorm after it, which no cause explains. Diagnosed
    as the module-level segment it was narrowed from, the permutation is found (SegFormer's sequence reduction
    in a TorchScript file: cause unknown)."""
    model, x = _SquareTokens().eval(), torch.randn(1, 16, 4, 4, generator=torch.Generator().manual_seed(2))
    proto = dc.export(model, (x,), "torchscript")
    transpose = next(n for n in proto.graph.node if n.op_type == "Transpose")
    bad = plant.set_attribute(proto, transpose.name, "perm", [0, 1, 2])
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.evidence["attributes"][0]["onnx_node"] == transpose.name
    assert transpose.name in fd.layer.segment and len(computing_nodes(fd.layer)) <= 6, fd.layer.segment
