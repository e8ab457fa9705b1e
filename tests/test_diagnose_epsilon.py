"""Epsilon rule: a normalization's epsilon against the module's eps."""
from __future__ import annotations

import sys

import pytest
import torch
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
import plant  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

import onnx_bisect  # noqa: E402
from onnx_bisect.diagnose.rules.epsilon import EpsilonMismatch  # noqa: E402


def test_layernorm_epsilon_attribute():
    report, _ = bisect_case(dc.epsilon("transformer", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "epsilon-mismatch" and fd.confirmed is True
    [row] = fd.evidence["mismatches"]
    assert abs(row["onnx_epsilon"] - 0.05) < 1e-6 and row["pytorch_eps"] == 1e-6
    assert row["module"] == "blocks.0.ln2"


def test_groupnorm_exported_as_instancenorm():
    report, _ = bisect_case(dc.epsilon("cnn", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "epsilon-mismatch" and fd.confirmed is True
    assert fd.evidence["mismatches"][0]["module"] == "gn"


@pytest.mark.parametrize("eps", [0.05, 0.9])
def test_constant_of_a_decomposed_norm(eps):
    """TorchScript at opset 16 decomposes LayerNorm; its eps is the constant added before Sqrt, however far
    off it was rewritten (0.9 is no plausible epsilon, but it is the one the graph uses)."""
    model, inputs = dc.dm.build("mlp")
    proto = dc.export_opset(model, inputs, 16)
    add = next(n for n in plant.find_nodes(proto, "Add", "norm")
               if any(plant._constant(proto, i) is not None and plant._constant(proto, i).size == 1 for i in n.input))
    const = next(i for i in add.input if plant._constant(proto, i) is not None)
    bad = plant.set_constant(proto, const, eps)
    report, _ = bisect_case(dc.Case("decomposed", "epsilon-mismatch", "mlp", "torchscript", model, inputs, bad))
    fd = report.first_divergence
    assert fd.cause == "epsilon-mismatch" and fd.confirmed is True
    assert "constant" in fd.evidence["mismatches"][0]["where"]
    assert fd.evidence["mismatches"][0]["onnx_epsilon"] == pytest.approx(eps)


def test_silent_when_epsilons_agree():
    _, ctx = bisect_case(dc.gelu("transformer", "dynamo"))
    assert EpsilonMismatch().match(ctx) is None


class _ConvNormNet(torch.nn.Module):
    """A LayerNorm over the channels of a Conv1d's (N, C, W) output, computed inline with an epsilon of the
    module's own naming (as SqueezeBERT's and many hand-written blocks do): no module has an ``eps`` to read."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.conv, self.out = torch.nn.Conv1d(8, 16, 3, padding=1), torch.nn.Conv1d(16, 4, 1)
        self.gain, self.shift = torch.nn.Parameter(torch.rand(16) + 0.5), torch.nn.Parameter(torch.randn(16) * 0.1)
        self.stability = 1e-12

    def forward(self, x):
        y = self.conv(x).transpose(1, 2)
        y = torch.nn.functional.layer_norm(y, (16,), self.gain, self.shift, self.stability).transpose(1, 2)
        return self.out(torch.relu(y))


def test_the_eps_of_a_norm_no_module_owns_is_read_from_the_op_pytorch_ran():
    """No module has an ``eps``: the epsilon is the argument of the layer_norm op PyTorch ran (SqueezeBERT's
    LayerNorm in a TorchScript file, its scope lost: unknown before)."""
    model, x = _ConvNormNet().eval(), torch.randn(2, 8, 12, generator=torch.Generator().manual_seed(4))
    proto = dc.export(model, (x,), "torchscript")
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    bad = plant.set_attribute(proto, norm.name, "epsilon", 0.5)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=bad)
    fd = report.first_divergence
    assert fd.cause == "epsilon-mismatch" and fd.confirmed is True, fd.explanation
    [row] = fd.evidence["mismatches"]
    assert (row["onnx_node"], row["onnx_epsilon"], row["pytorch_eps"]) == (norm.name, 0.5, 1e-12), row
    assert norm.name in fd.layer.segment and len(fd.layer.segment) <= 2, fd.layer.segment
