"""A mixture of experts dispatching by sort inside one module: tokens sorted by expert, split by the experts' token
counts, each chunk projected by its expert's slice of one stacked weight, scattered back.  ONNX Runtime's TopK
orders the tokens of one expert another way than PyTorch's sort, so inside the segment every tensor after the sort
holds PyTorch's rows in another order: paired as such (and fed in the file's order), the expert whose projection
went wrong is named, alone."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _Experts(torch.nn.Module):
    def __init__(self, d=8, e=4):
        super().__init__()
        torch.manual_seed(251)
        self.e = e
        self.router = torch.nn.Linear(d, e)
        self.weight = torch.nn.Parameter(torch.randn(e, d, d) / d ** 0.5)  # stacked: [experts, out, in]

    def forward(self, x):
        expert = self.router(x).argmax(-1)
        order = torch.sort(expert).indices
        sizes = F.one_hot(expert, self.e).sum(0).tolist()
        rows = x[order].split(sizes)
        out = torch.cat([F.linear(r, self.weight[i]) for i, r in enumerate(rows)])
        return torch.zeros_like(out).scatter(0, order[:, None].expand_as(out), out)


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(252)
        self.inp, self.experts, self.out = torch.nn.Linear(6, 8), _Experts(), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.experts(self.inp(x))))


def _case(exporter):
    model = _Net().eval()
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(253))
    proto = dc.export(model, (x,), exporter)
    split = next(n for n in proto.graph.node if n.op_type == "Split")
    products = [n for n in proto.graph.node if n.op_type in ("Gemm", "MatMul") and n.input[0] in split.output]
    sizes = F.one_hot(model.experts.router(model.inp(x)).argmax(-1), 4).sum(0).tolist()
    assert len(products) == 4 and sizes[2] > 10, sizes  # the third expert takes many tokens: ties in the sort
    return model, x, proto, products[2]


def _bisect(model, x, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence


def test_an_experts_projection_scaled_after_the_sort_is_named_alone():
    """The third expert's Gemm alpha 0.5 (dynamo): named alone, as an attribute, fixed by alpha 1."""
    model, x, proto, gemm = _case("dynamo")
    assert gemm.op_type == "Gemm"
    kept = [a for a in gemm.attribute if a.name != "alpha"]
    del gemm.attribute[:]
    gemm.attribute.extend([*kept, helper.make_attribute("alpha", 0.5)])
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert fd.layer.segment == (gemm.name,), fd.layer.segment
    assert fd.layer.pair.rows is not None  # the expert's rows, as the file's sort ordered them: ties broken otherwise
    assert "alpha" in fd.explanation


def test_an_experts_slice_of_a_stacked_weight_is_its_parameter():
    """The third expert's folded weight halved (TorchScript): its initializer is experts.weight[2] transposed,
    which the weight rule now knows as a slice of the stacked parameter; named at that MatMul alone."""
    model, x, proto, matmul = _case("torchscript")
    init = next(i for i in proto.graph.initializer if i.name == matmul.input[1])
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(0.5), init.name))
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert fd.layer.segment == (matmul.name,), fd.layer.segment
    assert "experts.weight[2]" in fd.explanation, fd.explanation


def test_the_clean_dispatch_agrees_with_no_warning():
    model, x, proto, _ = _case("dynamo")
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and not report.warnings, report.warnings


def test_an_experts_weight_with_its_rows_permuted_is_paired_by_the_view_pytorch_read():
    """The third expert's folded weight (dynamo) with its output rows reversed: its numbers no longer correlate
    with any parameter, but PyTorch's product read exactly one view of a parameter of that size — the select of
    experts.weight at 2 — so that is its parameter."""
    model, x, proto, gemm = _case("dynamo")
    init = next(i for i in proto.graph.initializer if i.name == gemm.input[1])
    value = numpy_helper.to_array(init)
    trans_b = next((a.i for a in gemm.attribute if a.name == "transB"), 0)
    flipped = value[::-1] if trans_b else value[:, ::-1]
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(flipped), init.name))
    fd = _bisect(model, x, proto)
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert fd.layer.segment == (gemm.name,), fd.layer.segment
    assert "experts.weight[2]" in fd.explanation, fd.explanation
