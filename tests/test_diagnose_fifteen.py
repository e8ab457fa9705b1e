"""Faults the fifteenth held-out set and kinds showed: each test fails on the code before its change."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


class _Recurrent(torch.nn.Module):
    """A projection, a GRUCell (PyTorch runs it as one op; the file as two Gemms and the gates) and a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(151)
        self.inp, self.gru, self.out = torch.nn.Linear(8, 16), torch.nn.GRUCell(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x, h):
        return self.out(self.gru(torch.relu(self.inp(x)), h))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_bias_the_file_never_reads_dropped_from_a_product_inside_a_fused_op_is_named(exporter):
    """The hidden-to-hidden Gemm of a GRUCell lost its bias input (``bias_hh``): PyTorch's cell is one op, so no
    activation holds that Gemm's product.  The module has two biases; the one no initializer of the file holds
    is added back after each bias-less product of the segment, and the one that reproduces PyTorch is named."""
    model = _Recurrent().eval()
    g = torch.Generator().manual_seed(152)
    inputs = (torch.randn(3, 8, generator=g), torch.randn(3, 16, generator=g))
    proto = dc.export(model, inputs, exporter)
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) > 2 and "bias_hh" in n.input[2])
    del gemm.input[2]
    fd = _bisect(model, inputs, proto)
    _found(fd, gemm.name, cause="weight-mismatch", at_most=12)
    assert "gru.bias_hh" in fd.explanation, fd.explanation
