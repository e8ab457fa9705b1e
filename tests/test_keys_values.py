"""Attention run with its keys and values exchanged (``attn(q, v, k)``, a packed qkv split as q, v, k): the scores
are computed from the value projection and the context from the key projection.  Named at the two nodes reading
them, the exchange confirmed by re-running."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from test_block_order import _resort  # noqa: E402


class _Attention(torch.nn.Module):
    """Two self-attention blocks (four heads, separate q / k / v projections, a causal mask) with residuals."""

    def __init__(self, d=16, heads=4, einsum=False):
        super().__init__()
        torch.manual_seed(311)
        self.heads, self.einsum = heads, einsum
        self.qkv = torch.nn.ModuleList(torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(3)) for _ in range(2))
        self.outs = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(2))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        b, s, d = x.shape
        mask = torch.triu(torch.full((s, s), float("-inf")), diagonal=1)
        for (q, k, v), out in zip(self.qkv, self.outs):
            def split(t):
                return t.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            if self.einsum:  # ProphetNet's products
                scores = torch.einsum("bhqd,bhkd->bhqk", split(q(x)), split(k(x))) / (d // self.heads) ** 0.5
                ctx = torch.einsum("bhqk,bhkd->bhqd", torch.softmax(scores + mask, dim=-1), split(v(x)))
            else:
                scores = split(q(x)) @ split(k(x)).transpose(-1, -2) / (d // self.heads) ** 0.5
                ctx = torch.softmax(scores + mask, dim=-1) @ split(v(x))
            x = x + out(ctx.transpose(1, 2).reshape(b, s, d))
        return self.head(x)


@pytest.mark.parametrize("einsum", [False, True], ids=["matmul", "einsum"])
@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_keys_and_values_exchanged_are_named_at_the_nodes_reading_them(exporter, einsum):
    model = _Attention(einsum=einsum).eval()
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(312))
    proto = dc.export(model, (x,), exporter)
    softmax = [n for n in proto.graph.node if n.op_type == "Softmax"][1]  # the second block's attention
    made = {o: n for n in proto.graph.node for o in n.output}

    def up(tensor, stop):
        """From ``tensor`` up the first inputs to the first node of a ``stop`` op: its output."""
        while made[tensor].op_type not in stop:
            tensor = made[tensor].input[0]
        return tensor

    scores = made[up(softmax.input[0], ("MatMul", "Einsum"))]
    context = next(n for n in proto.graph.node if n.op_type in ("MatMul", "Einsum") and n.input[0] == softmax.output[0])
    projections = ("Add", "Gemm")
    k_out, v_out = up(scores.input[1], projections), up(context.input[1], projections)
    readers = [n for n in proto.graph.node if k_out in n.input or v_out in n.input]
    assert len(readers) == 2, [n.name for n in readers]
    for n in readers:
        n.input[:] = [v_out if t == k_out else k_out if t == v_out else t for t in n.input]
    _resort(proto)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert {n.name for n in readers} <= named and len(named) <= 12, ([n.name for n in readers], named)
    assert "keys" in fd.explanation and "exchanged" in fd.explanation, fd.explanation
