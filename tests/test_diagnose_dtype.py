"""Dtype rule: a float64 model and inputs against a float32 graph."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from onnx import TensorProto, helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_float64_inputs_and_offset_cast_to_float32():
    report, _ = bisect_case(dc.dtype("mlp", "dynamo"))
    fd = report.first_divergence
    assert fd.cause == "dtype" and fd.confirmed is True
    ev = fd.evidence
    assert ev["float64_inputs"] == ["x"] and ev["float64_parameters"]
    assert max(ev["float32_rounding_max_abs"].values()) > 1e-3
    assert ev["local_max_abs_in_float64"] < 1e-6
    assert any("float64" in w for w in report.warnings)  # the preflight says so before the run


class _Decoded(torch.nn.Module):
    """A detector's decoding: the grid cell of each peak (floor division of its flat index, an integer valued
    float) plus a fractional offset a head regresses, then boxes around the centres."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(267)
        self.offset, self.size = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)

    def forward(self, feats, flat):  # (1, 10, 4) features of 10 peaks, (1, 10) their flat indices on a 16-wide map
        cells = torch.div(flat, 16, rounding_mode="floor").float()
        centres = cells + torch.sigmoid(self.offset(feats))[..., 0]
        half = torch.exp(self.size(feats))[..., 0] / 2
        return torch.stack((centres - half, centres + half), -1)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_value_truncated_to_an_integer_pytorch_holds_before_it_is_still_the_files_truncation(exporter):
    """Centres (a grid cell plus a fractional offset) cast to int32 and back: the truncated centres equal the
    grid cells PyTorch computed before the Add, which once read as the model truncating there (no cause found);
    PyTorch's own truncation would come after the value it truncates."""
    model = _Decoded().eval()
    feats = torch.randn(1, 10, 4, generator=torch.Generator().manual_seed(268))
    flat = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(269))
    proto = dc.export(model, (feats, flat), exporter)
    readers = {}
    for n in proto.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n.op_type)
    add = next(n for n in proto.graph.node
               if n.op_type == "Add" and sorted(readers.get(n.output[0], [])) == ["Add", "Sub"])
    out = add.output[0]
    add.output[0] = out + "_float"
    at = list(proto.graph.node).index(add) + 1
    proto.graph.node.insert(at, helper.make_node("Cast", [out + "_float"], [out + "_int"], name="centres_to_int",
                                                 to=TensorProto.INT32))
    proto.graph.node.insert(at + 1, helper.make_node("Cast", [out + "_int"], [out], name="centres_from_int",
                                                     to=TensorProto.FLOAT))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (feats, flat), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "dtype" and fd.confirmed is True, fd and fd.explanation
    assert "centres_to_int" in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
