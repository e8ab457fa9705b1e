"""A layer whose weights are used many times (a neural ODE's field, stepped with Runge-Kutta; ALBERT's shared
layers) in a file with no names or scopes: successive calls compute nearly the same numbers, so after a fault the
nearest tensor by value is often another call's.  Data flow says which call each reader of the weight is (each
is computed from the one before), and a call's loose pair is taken among its own node's tensors."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import alignment_corpus  # noqa: E402
import diagnosis_cases as dc  # noqa: E402
from fault_sweep import rename  # noqa: E402


class _Field(torch.nn.Module):
    def __init__(self, c=6):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.GroupNorm(2, c), torch.nn.GroupNorm(2, c)
        self.conv1, self.conv2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, h):
        return self.conv2(torch.tanh(self.norm2(self.conv1(torch.tanh(self.norm1(h))))))


class _Stepped(torch.nn.Module):
    """h ← h + dt·f(h) and a midpoint step, several times: one field, many calls with near values."""

    def __init__(self, steps=3):
        super().__init__()
        torch.manual_seed(83)
        self.stem, self.field, self.head = torch.nn.Conv2d(3, 6, 3, 2, 1), _Field(), torch.nn.Conv2d(6, 2, 1)
        self.steps = steps
        for norm in (self.field.norm1, self.field.norm2):  # trained norms: not the identity affine of a fresh one
            torch.nn.init.uniform_(norm.weight, 0.5, 1.5), torch.nn.init.uniform_(norm.bias, -0.3, 0.3)

    def forward(self, x):
        h = self.stem(x)
        for _ in range(self.steps):
            k1 = self.field(h)
            h = h + 0.25 * self.field(h + 0.125 * k1)
        return self.head(h)


@pytest.mark.parametrize("rewrite", ["renamed", "onnxslim"])
def test_a_dropped_tanh_in_a_late_call_of_a_shared_field_is_found_without_scopes(rewrite, tmp_path):
    model = _Stepped().eval()
    inputs = (torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(84)),)
    onnx.save(dc.export(model, inputs, "dynamo"), tmp_path / "clean.onnx")
    {"renamed": rename, "onnxslim": alignment_corpus.slim}[rewrite](tmp_path / "clean.onnx", tmp_path / "file.onnx")
    proto = onnx.load(tmp_path / "file.onnx")
    tanhs = [n for n in proto.graph.node if n.op_type == "Tanh"]
    assert len(tanhs) == 12
    planted = tanhs[9]  # the fifth call's second tanh: the call before it computes nearly the same numbers
    planted.op_type = "Identity"
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd is not None and planted.name in fd.layer.segment and len(fd.layer.segment) <= 4, fd and fd.layer.segment
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
