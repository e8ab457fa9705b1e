"""The parameters PyTorch's op read, recorded by the op-level capture: a functional attention (``F.linear`` with
its children's weights, as WavLM's ``multi_head_attention_forward`` does) whose query weight the file holds as the
next layer's key weight is named, with the query's weight confirmed in its place."""
from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _Attention(torch.nn.Module):
    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj = torch.nn.Linear(d, d), torch.nn.Linear(d, d)
        self.v_proj, self.out_proj = torch.nn.Linear(d, d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, n, d = x.shape
        split = lambda t: t.reshape(b, n, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q = split(F.linear(x, self.q_proj.weight, self.q_proj.bias))
        k = split(F.linear(x, self.k_proj.weight, self.k_proj.bias))
        v = split(F.linear(x, self.v_proj.weight, self.v_proj.bias))
        a = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1) @ v
        return F.linear(a.transpose(1, 2).reshape(b, n, d), self.out_proj.weight, self.out_proj.bias)


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(41)
        self.attn, self.attn2 = _Attention(), _Attention()
        self.norm, self.norm2, self.head = torch.nn.LayerNorm(16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        x = self.norm(x + self.attn(x))
        return self.head(self.norm2(x + self.attn2(x)))


def _holding(proto: onnx.ModelProto, value: np.ndarray) -> str:
    """The initializer holding ``value`` (as is or transposed)."""
    for init in proto.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.shape == value.shape and np.array_equal(a, value) or a.shape == value.T.shape and np.array_equal(
                a, value.T):
            return init.name
    raise AssertionError("no initializer holds the weight")


def test_a_functional_projection_holding_another_layer_s_weight_is_named_by_the_parameter_its_op_read():
    model, x = _Encoder().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(42))
    buffer = io.BytesIO()
    with dc.quiet():
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buffer.getvalue())
    q = _holding(proto, model.attn.q_proj.weight.detach().numpy())
    k = _holding(proto, model.attn2.k_proj.weight.detach().numpy())
    arrays = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    for init in proto.graph.initializer:  # two layers' weights exchanged (a loader mapping parameters by shape)
        if init.name in (q, k):
            init.CopyFrom(numpy_helper.from_array(arrays[k if init.name == q else q], init.name))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert "attn.q_proj.weight" in fd.explanation and "attn2.k_proj.weight" in fd.explanation, fd.explanation
    assert fd.layer.pair.activation.op, fd.layer.pair.activation  # narrowed to PyTorch's op, which reads no module


def test_a_functional_projection_whose_bias_add_was_dropped_names_the_bias_its_op_read():
    model, x = _Encoder().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(43))
    buffer = io.BytesIO()
    with dc.quiet():
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17)
    proto = onnx.load_from_string(buffer.getvalue())
    bias = model.attn.q_proj.bias.detach().numpy()  # (a key bias changes no attention: softmax ignores it)
    arrays = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    add = next(n for n in proto.graph.node if n.op_type == "Add" and any(
        t in arrays and arrays[t].shape == bias.shape and np.array_equal(arrays[t], bias) for t in n.input))
    product = next(t for t in add.input if t not in arrays)
    for n in proto.graph.node:  # the bias Add taken out: its readers read the product
        n.input[:] = [product if t == add.output[0] else t for t in n.input]
    proto.graph.node.remove(add)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
    assert "attn.q_proj.bias" in fd.explanation, fd.explanation


def test_two_weights_exchanged_in_one_segment_of_a_renamed_file_are_found_at_the_first(tmp_path):
    """Every node and tensor renamed, the query's and the key's weights exchanged: one segment holds both wrong
    products, so no one value fed clears its output; the first product's counterpart is found by the data flow
    (PyTorch's first product of its size that no tensor holds), and the tensors after it agreeing again say the
    error enters there."""
    from fault_sweep import rename

    model, x = _Encoder().eval(), torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(44))
    proto = dc.export(model, (x,), "dynamo")
    onnx.save(proto, tmp_path / "clean.onnx")
    rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
    proto = onnx.load(tmp_path / "renamed.onnx")
    a = _holding(proto, model.attn.q_proj.weight.detach().numpy())
    b = _holding(proto, model.attn.k_proj.weight.detach().numpy())
    arrays = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    for init in proto.graph.initializer:
        if init.name in (a, b):
            init.CopyFrom(numpy_helper.from_array(arrays[b if init.name == a else a], init.name))
    order = [n.name for n in proto.graph.node]
    planted = min((n.name for n in proto.graph.node if a in n.input or b in n.input), key=order.index)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    fd = report.first_divergence
    assert fd is not None and planted in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
