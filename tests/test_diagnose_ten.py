"""Faults the tenth sweep planted (scripts/sweep_faults_ten.py), each named at its node: a tensor rounded through
bfloat16 (a file holding bfloat16 tensors is read at all: numpy has no such type), a TopK's ``largest`` or an
ArgMax made an ArgMin, a node reading another tensor than PyTorch's op does (an input rewired), a constant mask
transposed."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


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
