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
