"""A layout op where none belongs: attention scores transposed (K·Qᵀ for Q·Kᵀ) before the causal mask is added.
PyTorch's op after the mask (the masked scores) also clears the output when fed at the Transpose — the segment
adds the mask again — but is not its counterpart: the Transpose should have handed its input on."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from onnx import helper

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
