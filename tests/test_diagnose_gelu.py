"""GELU approximation rule: real exports, a planted formula swap, real ONNX Runtime sessions."""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from onnx import TensorProto, helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402

from onnx_bisect.diagnose.rules.gelu import GeluApproximation, gelu_erf, gelu_tanh  # noqa: E402


def test_tanh_gelu_in_the_graph_is_named_and_switched_back():
    report, ctx = bisect_case(dc.gelu("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "gelu-approximation" and fd.confirmed is True and fd.confidence >= 0.9
    ev = fd.evidence
    assert (ev["onnx_formula"], ev["pytorch_formula"]) == ("tanh", "erf")
    assert ev["max_abs_onnx_vs_tanh"] < 1e-5 < 1e-4 < ev["max_abs_onnx_vs_erf"]
    assert ev["max_abs_pytorch_vs_erf"] < 1e-5
    assert ev["local_max_abs_after_fix"] < 1e-5
    assert "erf" in fd.fix


def test_decomposed_tanh_subgraph_and_fast_gelu_are_found():
    for provenance in ("torchscript", "onnxslim"):  # a Tanh subgraph; a com.microsoft FastGelu
        report, _ = bisect_case(dc.gelu("transformer", provenance))
        fd = report.first_divergence
        assert fd.cause == "gelu-approximation" and fd.confirmed is True, (provenance, fd.explanation)


def test_reverse_pytorch_tanh_onnx_erf():
    report, _ = bisect_case(dc.gelu_reverse("cnn", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "gelu-approximation" and fd.confirmed is True
    assert (fd.evidence["onnx_formula"], fd.evidence["pytorch_formula"]) == ("erf", "tanh")


def test_rule_stays_silent_on_another_fault():
    _, ctx = bisect_case(dc.weight("mlp", "dynamo"))
    assert GeluApproximation().match(ctx) is None


def test_formulas():
    import numpy as np

    x = np.array([-3.0, 0.0, 1.0])
    assert np.allclose(gelu_erf(x), [-0.0040497, 0.0, 0.8413447], atol=1e-6)
    assert np.allclose(gelu_tanh(x), [-0.0036374, 0.0, 0.8411920], atol=1e-6)


class _NewGelu(torch.nn.Module):
    """The tanh GELU written out in Python (as transformers' NewGELUActivation does): its ops are recorded."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class _Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(12, 32), _NewGelu(), torch.nn.Linear(32, 6)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def test_an_erf_where_pytorchs_tanh_ran_is_the_gelu_form_when_the_segment_narrows_to_it():
    """The file's Tanh(u) replaced by Erf(x/√2): the segment narrows to the Div and Erf that compute what
    PyTorch's aten.tanh did, which hold no whole GELU; its tail (+1, ×x·0.5) does, and the fix re-run at the
    Erf's tensor (the whole GELU in tanh form) removes the divergence."""
    model, x = _Mlp().eval(), torch.randn(4, 12, generator=torch.Generator().manual_seed(8)) * 2.0
    proto = dc.export(model, (x,), "torchscript")
    tanh = next(n for n in proto.graph.node if n.op_type == "Tanh")
    gelu_in = next(n for n in proto.graph.node if n.op_type == "Pow").input[0]
    root2 = helper.make_tensor("root2", TensorProto.FLOAT, [], [math.sqrt(2.0)])
    proto.graph.initializer.append(root2)
    div = helper.make_node("Div", [gelu_in, "root2"], ["erf_in"], name="planted_div")
    tanh.op_type, tanh.input[0] = "Erf", "erf_in"
    at = list(proto.graph.node).index(tanh)
    proto.graph.node.insert(at, div)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto, atol=1e-5, rtol=1e-5)  # the forms differ by ~1e-4
    fd = report.first_divergence
    assert not report.ok and tanh.name in fd.layer.segment, fd.layer.segment
    assert fd.cause == "gelu-approximation" and fd.confirmed is True, fd.explanation
    assert fd.evidence["onnx_formula"] == "erf" and fd.evidence["pytorch_formula"] == "tanh"
