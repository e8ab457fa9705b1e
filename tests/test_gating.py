"""Gates read the wrong way: a gated unit's two branches exchanged (LLaMA's gate_proj / up_proj mapped the wrong way,
gMLP's spatial gating applied to the other half: ``F(b)·a`` for ``F(a)·b``) is named at the gate's entry and its
Mul; a gate taken as its complement ``1 − z`` (a GRU's update gate in the other convention) at the ``1 − z``."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from onnx import helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from test_block_order import _resort  # noqa: E402


def _bisect(model, x, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence


class _SwiGLU(torch.nn.Module):
    """Two SwiGLU MLP blocks (gate, up and down projections, SiLU on the gate) with residuals, then a head."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(301)
        self.gates = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d, bias=False) for _ in range(2))
        self.ups = torch.nn.ModuleList(torch.nn.Linear(d, 2 * d, bias=False) for _ in range(2))
        self.downs = torch.nn.ModuleList(torch.nn.Linear(2 * d, d, bias=False) for _ in range(2))
        self.head = torch.nn.Linear(d, 4)

    def forward(self, x):
        for gate, up, down in zip(self.gates, self.ups, self.downs):
            x = x + down(torch.nn.functional.silu(gate(x)) * up(x))
        return self.head(x)


class _SpatialGating(torch.nn.Module):
    """gMLP's spatial gating unit: the channels halved, the second half normed and mixed over the tokens, the first
    half multiplied by it; then a head."""

    def __init__(self, d=16, tokens=6):
        super().__init__()
        torch.manual_seed(302)
        self.up, self.norm = torch.nn.Linear(d, 2 * d), torch.nn.LayerNorm(d)
        self.mix, self.head = torch.nn.Linear(tokens, tokens), torch.nn.Linear(d, 4)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        u, v = torch.nn.functional.gelu(self.up(x)).chunk(2, dim=-1)
        v = self.mix(self.norm(v).transpose(1, 2)).transpose(1, 2)
        return self.head(u * v)


def _ancestors(proto, tensor, stop):
    made = {o: n for n in proto.graph.node for o in n.output}
    found, frontier = set(), [tensor]
    while frontier:
        t = frontier.pop()
        if t in stop or t not in made or made[t].name in found:
            continue
        found.add(made[t].name)
        frontier += list(made[t].input)
    return found


def _gate_mul(proto, node):
    """The first Mul after ``node`` with exactly one input computed from it (and not its input), and that input."""
    after = list(proto.graph.node)[list(proto.graph.node).index(node) + 1:]
    for n in after:
        if n.op_type == "Mul":
            fed = [t for t in n.input if node.name in _ancestors(proto, t, set())]
            if len(fed) == 1 and len(n.input) == 2 and node.input[0] not in n.input:  # SiLU's own x·σ(x) aside
                return n, fed[0]
    raise AssertionError(f"no gate Mul after {node.name}")


def _swap_gate(proto, mul, gated, other, source):
    """The nodes computing ``gated`` from ``source`` read ``other`` instead, the Mul reads ``source``: the entries
    and the Mul returned."""
    nodes = _ancestors(proto, gated, {source})
    entries = {n.name for n in proto.graph.node if n.name in nodes and source in n.input}
    for n in proto.graph.node:
        if n.name in nodes:
            n.input[:] = [other if t == source else t for t in n.input]
    mul.input[:] = [source if t == other else t for t in mul.input]
    _resort(proto)
    return entries | {mul.name}


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_swiglu_with_the_activation_on_the_up_projection_is_named_as_the_branches_exchanged(exporter):
    model = _SwiGLU().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(303))
    proto = dc.export(model, (x,), exporter)
    sigmoid = [n for n in proto.graph.node if n.op_type == "Sigmoid"][1]  # the second block's SiLU
    source = sigmoid.input[0]
    mul, gated = _gate_mul(proto, sigmoid)
    other = next(t for t in mul.input if t != gated)
    planted = _swap_gate(proto, mul, gated, other, source)
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    named = set(fd.layer.segment) | set(fd.fixed_nodes)
    assert planted <= named and len(named) <= 12, (planted, named)
    assert "branches exchanged" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_spatial_gating_applied_to_the_other_half_is_named_as_the_branches_exchanged(exporter):
    model = _SpatialGating().eval()
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(304))
    proto = dc.export(model, (x,), exporter)
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    mul, gated = _gate_mul(proto, norm)
    other = next(t for t in mul.input if t != gated)
    source = norm.input[0]
    planted = _swap_gate(proto, mul, gated, other, source)
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    # the Split's outputs in the other order is the same fix, said another way (one node, where the halves come from)
    if "output order" not in fd.explanation:
        named = set(fd.layer.segment) | set(fd.fixed_nodes)
        assert planted <= named and len(named) <= 12, (planted, named)
        assert "branches exchanged" in fd.explanation, fd.explanation


class _SqueezeGate(torch.nn.Module):
    """A channel gate (squeeze-and-excitation: the mean over the tokens, two Linears, a sigmoid) scaling its input."""

    def __init__(self, d=16):
        super().__init__()
        torch.manual_seed(305)
        self.inner, self.fc1, self.fc2 = torch.nn.Linear(d, d), torch.nn.Linear(d, 4), torch.nn.Linear(4, d)
        self.head = torch.nn.Linear(d, 3)

    def forward(self, x):
        h = torch.tanh(self.inner(x))
        z = torch.sigmoid(self.fc2(torch.relu(self.fc1(h.mean(1, keepdim=True)))))
        return self.head(h * z)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_gate_taken_as_its_complement_is_named_at_the_one_minus(exporter):
    model = _SqueezeGate().eval()
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(306))
    proto = dc.export(model, (x,), exporter)
    sigmoid = next(n for n in proto.graph.node if n.op_type == "Sigmoid")
    one = helper.make_node("Constant", [], ["gate_one"], value=helper.make_tensor("one", 1, [], [1.0]))
    sub = helper.make_node("Sub", ["gate_one", sigmoid.output[0]], ["gate_complement"], name="gate_complement")
    for n in proto.graph.node:
        n.input[:] = ["gate_complement" if t == sigmoid.output[0] else t for t in n.input]
    at = list(proto.graph.node).index(sigmoid) + 1
    proto.graph.node.insert(at, sub)
    proto.graph.node.insert(at, one)
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert "gate_complement" in fd.fixed_nodes and "complement" in fd.explanation, (fd.fixed_nodes, fd.explanation)
    assert len(set(fd.layer.segment) | set(fd.fixed_nodes)) <= 12
