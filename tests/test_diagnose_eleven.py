"""Faults the eleventh sweep planted (scripts/sweep_faults_eleven.py), each named at its node: two Slices of one
tensor taking each other's window (rotate_half's halves, a fused projection's chunks, read in another order)."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from fault_sweep import rename  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Rotary(torch.nn.Module):
    """A projection rotated by fixed angles: rotate_half by two slices of the last axis."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(95)
        self.proj, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 3)
        angles = torch.arange(6.0)[:, None] * torch.tensor([1.0, 0.3, 0.1, 0.03]).repeat(2)[None]
        self.register_buffer("cos", angles.cos()), self.register_buffer("sin", angles.sin())

    def forward(self, x):  # (2, 6, 8)
        h = self.proj(x)
        first, second = h[..., :4], h[..., 4:]
        return self.out(h * self.cos + torch.cat((-second, first), -1) * self.sin)


@pytest.mark.parametrize("exporter,renamed", [("dynamo", False), ("torchscript", False), ("dynamo", True)])
def test_two_slices_taking_each_others_halves_are_named_together(exporter, renamed, tmp_path):
    model = _Rotary().eval()
    inputs = (torch.randn(2, 6, 8, generator=torch.Generator().manual_seed(96)),)
    proto = dc.export(model, inputs, exporter)
    if renamed:
        onnx.save(proto, tmp_path / "clean.onnx")
        rename(tmp_path / "clean.onnx", tmp_path / "renamed.onnx")
        proto = onnx.load(tmp_path / "renamed.onnx")
    first, second = [n for n in proto.graph.node if n.op_type == "Slice"][:2]
    assert first.input[0] == second.input[0]
    rest = list(first.input[1:])
    del first.input[1:]
    first.input.extend(second.input[1:])
    del second.input[1:]
    second.input.extend(rest)
    nodes = sorted(proto.graph.node, key=lambda n: n.op_type != "Constant")  # a TorchScript Constant read earlier
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    fd = _bisect(model, inputs, proto)
    _found(fd, first.name)
    assert second.name in fd.layer.segment and "take each other's window" in fd.explanation, fd.explanation
