"""A layout op where none belongs: attention scores transposed (K·Qᵀ for Q·Kᵀ) before the causal mask is added.
PyTorch's op after the mask (the masked scores) also clears the output when fed at the Transpose — the segment
adds the mask again — but is not its counterpart: the Transpose should have handed its input on."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import numpy as np
from onnx import helper, numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _MaskedAttention(torch.nn.Module):
    def __init__(self, d=16, heads=2):
        super().__init__()
        torch.manual_seed(261)
        self.heads = heads
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        scores = q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5
        mask = torch.full((s, s), torch.finfo(x.dtype).min).triu(1)
        attn = (scores + mask).softmax(-1)
        return self.o((attn @ v).transpose(1, 2).reshape(b, s, d))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_scores_transposed_before_their_mask_are_named_at_the_transpose(exporter):
    model = _MaskedAttention().eval()
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(262))
    proto = dc.export(model, (x,), exporter)
    softmax = next(n for n in proto.graph.node if n.op_type == "Softmax")
    made = {o: n for n in proto.graph.node for o in n.output}
    frontier, node = [softmax.input[0]], None
    while node is None:  # up from the softmax, through the mask Add (and a scale), to the scores' MatMul
        up = made[frontier.pop(0)]
        node = up if up.op_type == "MatMul" else None
        frontier += [i for i in up.input if i in made]
    raw = node.output[0] + "_raw"
    transpose = helper.make_node("Transpose", [raw], [node.output[0]], name="planted_transpose", perm=[0, 1, 3, 2])
    node.output[0] = raw
    nodes = list(proto.graph.node)
    nodes.insert(nodes.index(node) + 1, transpose)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert fd.layer.segment == ("planted_transpose",), fd.layer.segment
    assert "[0, 1, 2, 3]" in fd.explanation, fd.explanation


class _ShapeMasked(torch.nn.Module):
    """Attention computed in the module's own ops (parameters, not child Linears), its causal mask built from the
    scores' shape (a Shape node in a TorchScript file)."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(263)
        self.wq, self.wk, self.wv = (torch.nn.Parameter(torch.randn(d, d) / 4) for _ in range(3))
        self.o = torch.nn.Linear(d, d)

    def forward(self, x):
        q, k, v = x @ self.wq, x @ self.wk, x @ self.wv
        scores = q @ k.transpose(-1, -2) / 4
        mask = torch.ones_like(scores).triu(1).bool()  # from the scores' shape
        scores = scores.masked_fill(mask, float("-inf"))
        return self.o(scores.softmax(-1) @ v)


def test_a_wrong_tensor_whose_shape_builds_a_right_mask_is_still_wrong():
    """The queries halved by an inserted Mul (TorchScript): the causal mask, built from the scores' Shape, holds
    PyTorch's mask — but a Shape reads no values, so it does not vouch for the queries: the Mul is named."""
    model = _ShapeMasked().eval()
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(264))
    import io

    import onnx

    buffer = io.BytesIO()
    with dc.quiet():  # a dynamic sequence: the mask is built from the scores' Shape at run time
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, input_names=["x"],
                          dynamic_axes={"x": {1: "seq"}})
    proto = onnx.load_from_string(buffer.getvalue())
    assert any(n.op_type == "Shape" for n in proto.graph.node)
    q = next(n for n in proto.graph.node if n.op_type == "MatMul")
    y = q.output[0]
    q.output[0] = y + "_raw"
    proto.graph.initializer.append(numpy_helper.from_array(np.array(0.5, np.float32), "planted_half"))
    mul = helper.make_node("Mul", [y + "_raw", "planted_half"], [y], name="planted_mul")
    nodes = list(proto.graph.node)
    nodes.insert(nodes.index(q) + 1, mul)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and "planted_mul" in fd.layer.segment and len(fd.layer.segment) <= 3, fd and fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
