"""A parameter applied at another node than PyTorch applies it (a norm's scale folded before the normalisation), or
applied twice (a fused bias whose separate Add was kept): the finding names the places, inside the segment or past
it, whatever the file's names."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from onnx import helper, numpy_helper

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


class _RMSNorm(torch.nn.Module):
    """An RMSNorm written out as LLaMA's and T5's are: x · rsqrt(mean(x²) + eps) · γ."""

    def __init__(self, d: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d).uniform_(0.5, 1.5))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class _RmsNormed(torch.nn.Module):
    """A projection, a decomposed RMSNorm with a trained (random) scale, a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(171)
        self.inp, self.norm, self.head = torch.nn.Linear(8, 16), _RMSNorm(16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.norm(self.inp(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_scale_folded_before_a_decomposed_rmsnorm_is_named_at_both_places(exporter):
    """γ multiplied into the RMSNorm's input (its own readers) and the Mul by γ after the normalisation given
    ones: the op-level segment ends at x² (the Mul before it is all that is wrong there, and leaving it out
    reproduces PyTorch), while the place γ belongs lies past it. Proven there — the Mul of ones reading γ makes
    the norm's output PyTorch's, leaving the early Mul out alone does not — the finding is the parameter moved,
    naming both Muls."""
    model = _RmsNormed().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(173)),)
    proto = dc.export(model, inputs, exporter)
    gamma = model.norm.weight.detach().numpy()
    inits = {t.name: t for t in proto.graph.initializer}
    slot = next(n for n in proto.graph.node if n.op_type == "Mul" and any(
        t in inits and numpy_helper.to_array(inits[t]).shape == gamma.shape
        and np.array_equal(numpy_helper.to_array(inits[t]), gamma) for t in n.input))
    held = next(t for t in slot.input if t in inits)
    proto.graph.initializer.append(numpy_helper.from_array(np.ones_like(gamma), "unit_scale"))
    slot.input[list(slot.input).index(held)] = "unit_scale"
    pow_node = next(n for n in proto.graph.node if n.op_type == "Pow")
    source = pow_node.input[0]
    readers = [n for n in proto.graph.node if source in n.input and n.op_type in ("Pow", "Mul")]
    for n in readers:
        n.input[list(n.input).index(source)] = "scaled_early"
    proto.graph.initializer.append(numpy_helper.from_array(gamma, "gamma_early"))
    mul = helper.make_node("Mul", [source, "gamma_early"], ["scaled_early"], name="planted_early_mul")
    proto.graph.node.insert(min(list(proto.graph.node).index(n) for n in readers), mul)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, "planted_early_mul", cause="weight-mismatch", at_most=3)
    assert slot.name in fd.layer.segment, fd.layer.segment
    assert "applied early" in fd.explanation and "norm.weight" in fd.explanation, fd.explanation


class _Projected(torch.nn.Module):
    """Two Linears on a 2-D input (each a Gemm with its bias input) with a ReLU between."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(177)
        self.inp, self.out = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.out(torch.relu(self.inp(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_bias_added_again_after_the_gemm_that_adds_it_is_an_op_pytorch_does_not_apply(exporter):
    """An Add of the very initializer the Gemm reads as its bias (a fusion that folded the bias into the Gemm and
    kept the separate Add): the constant is a parameter, yet applied in its own place already — leaving the Add
    out is tried, reproduces PyTorch, and the finding says which node applies it already."""
    model = _Projected().eval()
    inputs = (torch.randn(3, 8, generator=torch.Generator().manual_seed(179)),)
    proto = dc.export(model, inputs, exporter)
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm" and len(n.input) > 2
                and next(t for t in proto.graph.initializer if t.name == n.input[2]).dims == [16])
    out = gemm.output[0]
    gemm.output[0] = "gemm_once"
    add = helper.make_node("Add", ["gemm_once", gemm.input[2]], [out], name="planted_bias_again")
    proto.graph.node.insert(list(proto.graph.node).index(gemm) + 1, add)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    _found(fd, "planted_bias_again", cause="attribute-mismatch", at_most=3)
    assert f"which {gemm.name} (Gemm) applies already" in fd.explanation, fd.explanation


class _Pooled(torch.nn.Module):
    """A small CNN head: conv, an activation, a global average pool, a classifier."""

    def __init__(self, act: str):
        super().__init__()
        torch.manual_seed(255)
        self.conv, self.fc = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Linear(8, 4)
        self.act = torch.nn.ReLU() if act == "relu" else torch.nn.Sigmoid()

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
@pytest.mark.parametrize("act", ["relu", "sigmoid"])
def test_an_activation_applied_after_the_pool_instead_of_before_is_named_at_both_nodes(exporter, act):
    """The pool reads the convolution's output and a copy of the activation follows the pool (act(pool(x)) for
    pool(act(x)): a port reordering a head): the pool rewired to the activation's output and the copy left out
    reproduce PyTorch — both nodes are named (a ReLU after the rewired pool changes nothing, so the rewiring alone
    named the pool only; a Sigmoid's copy did not let the rewiring alone reproduce)."""
    model = _Pooled(act).eval()
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(256))
    proto = dc.export(model, (x,), exporter)
    kind = "Relu" if act == "relu" else "Sigmoid"
    activation = next(n for n in proto.graph.node if n.op_type == kind)
    pool = next(n for n in proto.graph.node if activation.output[0] in n.input)
    pool.input[list(pool.input).index(activation.output[0])] = activation.input[0]
    out = pool.output[0]
    pool.output[0] = out + "_pooled"
    proto.graph.node.insert(list(proto.graph.node).index(pool) + 1,
                            helper.make_node(kind, [out + "_pooled"], [out], name="act_after_pool"))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert {pool.name, "act_after_pool"} <= set(fd.layer.segment) and len(fd.layer.segment) <= 3, fd.layer.segment
    assert "order swapped" in fd.explanation, fd.explanation


class _Head(torch.nn.Module):
    """An encoder layer and a prediction head ``tanh(linear(h))``; with ``before`` the tanh is applied to the
    head's input instead (``linear(tanh(h))``: a port moving the activation in front of the layer)."""

    def __init__(self, before: bool = False):
        super().__init__()
        torch.manual_seed(265)
        self.encode, self.predict = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)
        self.before = before

    def forward(self, x):
        h = torch.relu(self.encode(x))
        return self.predict(torch.tanh(h)) if self.before else torch.tanh(self.predict(h))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_activation_moved_in_front_of_the_layer_is_named_with_the_layer(exporter):
    """The file applies the head's tanh to the layer's input (exported from the same weights with the tanh
    moved): leaving the Tanh out reproduces the layer's output, and PyTorch applies tanh to that output right
    after while the file does not — the Tanh is named with the layer's nodes, as moved."""
    model, x = _Head().eval(), torch.randn(4, 8, generator=torch.Generator().manual_seed(266))
    moved = _Head(before=True).eval()
    moved.load_state_dict(model.state_dict())
    proto = dc.export(moved, (x,), exporter)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    ops = [n.op_type for n in proto.graph.node if n.name in fd.layer.segment]
    assert "Tanh" in ops and ("MatMul" in ops or "Gemm" in ops) and len(ops) <= 4, ops
    assert "PyTorch applies it to that layer's output" in fd.explanation, fd.explanation


class _Gated(torch.nn.Module):
    """Two Linears, a sigmoid on the second's output."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(272)
        self.first, self.second = torch.nn.Linear(8, 16), torch.nn.Linear(16, 3)

    def forward(self, x):
        return torch.sigmoid(self.second(self.first(x)))


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_an_activation_added_in_front_of_a_layer_that_keeps_its_own_is_not_called_moved(exporter):
    """A Sigmoid inserted on the first Linear's output while the file still applies the model's own Sigmoid after
    the second: removing it reproduces PyTorch and PyTorch applies a sigmoid right after the layer — but so does
    the file, so the op was added, not moved: it is named removed (before, the placement reading said it belonged
    after the layer)."""
    model, x = _Gated().eval(), torch.randn(4, 8, generator=torch.Generator().manual_seed(273))
    proto = dc.export(model, (x,), exporter)
    second = [n for n in proto.graph.node if n.op_type in ("MatMul", "Gemm")][1]
    source = next(t for t in second.input if not any(i.name == t for i in proto.graph.initializer))
    second.input[list(second.input).index(source)] = "extra_out"
    proto.graph.node.insert(list(proto.graph.node).index(second),
                            helper.make_node("Sigmoid", [source], ["extra_out"], name="extra_sigmoid"))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "attribute-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert "extra_sigmoid" in fd.layer.segment and "the node removed" in fd.explanation, fd.explanation
    assert "layer's output" not in fd.explanation, fd.explanation
