"""Two residual blocks run in the opposite order (a port listing the sub-layers wrongly): the second block reads
the stream the first should have read, the first runs on its result.  Named as the two blocks exchanged — their
entries and residual Adds — where a rewiring of the first entry alone reproduces only the first tensor after it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _PreNormStack(torch.nn.Module):
    """Three pre-norm residual MLP blocks written in the model's own forward, then a head."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(281)
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(3))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d) for _ in range(3))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d) for _ in range(3))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            x = x + down(torch.relu(up(norm(x))))
        return self.head(x)


def _toposorted(nodes, proto):
    made = {o for n in nodes for o in n.output}
    ready = {i.name for i in proto.graph.input} | {i.name for i in proto.graph.initializer} | {""}
    order, pending = [], list(nodes)
    while pending:
        n = next(n for n in pending if all(i in ready or i not in made for i in n.input))
        order.append(n)
        pending.remove(n)
        ready.update(n.output)
    return order


def _residual_adds(proto):
    made = {o: n for n in proto.graph.node for o in n.output}

    def computed_from(tensor, source, depth=12):
        frontier = [tensor]
        for _ in range(depth):
            nxt = []
            for t in frontier:
                if t == source:
                    return True
                if t in made:
                    nxt += list(made[t].input)
            frontier = nxt
        return False
    return [n for n in proto.graph.node if n.op_type == "Add" and len(n.input) == 2
            and any(computed_from(n.input[1 - k], n.input[k]) for k in (0, 1) if n.input[k] in made or k == 0)
            and n.input[0] != n.input[1]]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_two_residual_blocks_run_in_the_other_order_are_named_as_exchanged(exporter):
    model = _PreNormStack().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(282))
    proto = dc.export(model, (x,), exporter)
    norms = [n for n in proto.graph.node if n.op_type == "LayerNormalization"]
    adds = [a for a in _residual_adds(proto) if any(n.input[0] in a.input for n in norms)]
    assert len(norms) == 3 and len(adds) == 3, ([n.name for n in norms], [a.name for a in adds])
    (n1, n2), (a1, a2) = norms[1:], adds[1:]  # the second and third blocks exchanged
    x1, out1, out2 = n1.input[0], a1.output[0], a2.output[0]
    skip1, skip2 = list(a1.input).index(x1), list(a2.input).index(out1)
    n2.input[0], a2.input[skip2] = x1, x1  # the third block reads the second's input
    n1.input[0], a1.input[skip1] = out2, out2  # the second runs on the third's output
    for n in proto.graph.node:
        if n is not n1 and n is not a1 and out2 in n.input and n is not n2:
            n.input[:] = [out1 if t == out2 else t for t in n.input]  # the head reads the last block's output
    nodes = _toposorted(list(proto.graph.node), proto)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert {n1.name, n2.name, a1.name, a2.name} <= named, named
    assert "other order" in fd.explanation, fd.explanation
