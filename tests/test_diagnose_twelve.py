"""Faults the twelfth sweep planted (scripts/sweep_faults_twelve.py) that no reading named: a float value truncated
through an integer Cast pair, a Sin computed as a Cos, an Einsum equation with two letters of a term exchanged."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
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


class _Features(torch.nn.Module):
    """Random Fourier features: a projection, its sine and cosine, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(121)
        self.proj, self.head = torch.nn.Linear(6, 16), torch.nn.Linear(32, 4)

    def forward(self, x):
        z = self.proj(x)
        return self.head(torch.cat([torch.sin(z), torch.cos(z)], -1))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_float_cast_through_int32_and_back_is_a_dtype_fault_named_at_the_cast(exporter):
    """A Cast to int32 and one back inserted after the projection: the sine reads whole numbers.  Named at the
    cast to int32, with how much of a fraction it cuts; keeping the value in float reproduces PyTorch."""
    model = _Features().eval()
    inputs = (torch.randn(3, 6, generator=torch.Generator().manual_seed(122)),)
    proto = dc.export(model, inputs, exporter)
    sin = next(n for n in proto.graph.node if n.op_type == "Sin")
    source = sin.input[0]
    down = helper.make_node("Cast", [source], [source + "_int"], name="planted_to_int32", to=TensorProto.INT32)
    up = helper.make_node("Cast", [source + "_int"], [source + "_trunc"], name="planted_from_int32",
                          to=TensorProto.FLOAT)
    for n in proto.graph.node:
        n.input[:] = [source + "_trunc" if t == source else t for t in n.input]
    at = list(proto.graph.node).index(sin)
    proto.graph.node.insert(at, up)
    proto.graph.node.insert(at, down)
    fd = _bisect(model, inputs, proto)
    evidence = _found(fd, "planted_to_int32", cause="dtype")
    assert evidence["casts_to_integer"] == ["planted_to_int32"] and 0.5 < evidence["fraction_lost_max"][
        "planted_to_int32"] < 1, evidence
    assert "int32" in fd.explanation and "fractions" in fd.explanation, fd.explanation


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_sine_computed_as_a_cosine_is_named_at_the_node(exporter):
    model = _Features().eval()
    inputs = (torch.randn(3, 6, generator=torch.Generator().manual_seed(123)),)
    proto = dc.export(model, inputs, exporter)
    sin = next(n for n in proto.graph.node if n.op_type == "Sin")
    sin.op_type = "Cos"
    fd = _bisect(model, inputs, proto)
    _found(fd, sin.name)
    assert "= Cos where the PyTorch output implies Sin" in fd.explanation, fd.explanation


class _SetAttention(torch.nn.Module):
    """Attention written with einsum, as set encoders do."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(124)
        self.q, self.k, self.v, self.out = (torch.nn.Linear(8, 8) for _ in range(4))

    def forward(self, x):  # (n, s, 8)
        att = torch.softmax(torch.einsum("nsd,ntd->nst", self.q(x), self.k(x)) / 8 ** 0.5, -1)
        return self.out(torch.einsum("nst,ntd->nsd", att, self.v(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_einsum_reading_its_attention_transposed_is_named_with_the_equation(exporter):
    """The second Einsum's first term ``nst`` written ``nts`` (the attention read with its axes exchanged): the
    equation with those letters back reproduces PyTorch."""
    model = _SetAttention().eval()
    inputs = (torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(125)),)
    proto = dc.export(model, inputs, exporter)
    einsum = [n for n in proto.graph.node if n.op_type == "Einsum"][-1]
    equation = onnx.helper.get_attribute_value(next(a for a in einsum.attribute if a.name == "equation")).decode()
    left, out = equation.split("->")
    first, second = left.split(",")
    planted = f"{first[0]}{first[2]}{first[1]}{first[3:]},{second}->{out}"
    for a in einsum.attribute:
        if a.name == "equation":
            a.s = planted.encode()
    fd = _bisect(model, inputs, proto)
    _found(fd, einsum.name)
    assert f"equation = {planted} where the PyTorch output implies {equation}" in fd.explanation, fd.explanation


class _MaskedAttention(torch.nn.Module):
    """Causal attention through scaled_dot_product_attention with a boolean mask: the dynamo exporter writes
    PyTorch's safe softmax, a Softmax then a Where putting zeros where it gave NaN."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(126)
        self.q, self.k, self.v, self.o = (torch.nn.Linear(16, 16) for _ in range(4))

    def forward(self, x):  # (1, 6, 16)
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, 2, 8).transpose(1, 2) for f in (self.q, self.k, self.v))
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o(y.transpose(1, 2).reshape(b, t, 16))


def test_a_node_that_computed_nothing_on_these_inputs_does_not_unpair_what_follows_it():
    """The safe softmax's Where changed nothing here (no row was all masked), so its output holds the softmax's
    value: that node is no match of its own, but the attention computed from it still pairs with PyTorch's
    ops — a stray offset added to the attention's output (no cause explains it) is narrowed to its own node, not
    the whole attention."""
    model = _MaskedAttention().eval()
    inputs = (torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(127)),)
    proto = dc.export(model, inputs, "dynamo")
    assert any(n.op_type == "IsNaN" for n in proto.graph.node), "the export writes no safe softmax"
    where = next(n for n in proto.graph.node if n.op_type == "Where" and any(
        i.op_type == "IsNaN" and i.output[0] in n.input for i in proto.graph.node))
    product = next(n for n in proto.graph.node if n.op_type == "MatMul" and where.output[0] in n.input)
    offset = np.random.default_rng(128).normal(0, 0.5, (1, 2, 6, 8)).astype(np.float32)
    bad = dc.plant.insert_offset(proto, product.output[0], offset)
    planted = next(n.name for n in bad.graph.node if n.name.endswith("_stray_Add"))
    fd = _bisect(model, inputs, bad)
    assert planted in fd.layer.segment and len(fd.layer.segment) <= 3, fd.layer.segment
