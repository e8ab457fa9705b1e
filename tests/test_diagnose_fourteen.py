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


class _Positions(torch.nn.Module):
    """Token and learned position embeddings (GPT-2's wte + wpe, positions an arange), a norm and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(143)
        self.wte, self.wpe = torch.nn.Embedding(20, 16), torch.nn.Embedding(12, 16)
        self.norm, self.head = torch.nn.LayerNorm(16), torch.nn.Linear(16, 4)

    def forward(self, ids):  # (2, 8) token ids
        positions = torch.arange(ids.shape[1])
        return self.head(self.norm(self.wte(ids) + self.wpe(positions)))


def test_a_folded_position_table_read_two_positions_on_is_named_with_the_shift():
    """The dynamo export folds wpe(arange) into a constant; that constant's rows shifted by two (OPT's offset of
    two lost or added): the folded table is paired with PyTorch's position lookup by the rows they share — by
    correlation alone a shifted table of random rows is nearest some other module's output — and named with
    the shift."""
    model = _Positions().eval()
    inputs = (torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(144)),)
    proto = dc.export(model, inputs, "dynamo")
    want = model.wpe.weight.detach().numpy()[:8]
    table = next(t for t in proto.graph.initializer if tuple(t.dims)[-2:] == (8, 16)
                 and np.allclose(numpy_helper.to_array(t).reshape(8, 16), want))
    value = numpy_helper.to_array(table)
    shifted = np.concatenate([value.reshape(8, 16)[2:], value.reshape(8, 16)[-2:]]).reshape(value.shape)
    table.CopyFrom(numpy_helper.from_array(shifted.astype(value.dtype), table.name))
    reader = next(n for n in proto.graph.node if table.name in n.input)
    fd = _bisect(model, inputs, proto)
    _found(fd, reader.name, cause="weight-mismatch")
    assert "shifted by 2 positions" in fd.explanation and "wpe" in fd.explanation, fd.explanation
