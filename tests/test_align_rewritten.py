"""Faults planted in files that went through a pipeline are still pinned to their node.

Each case exports a small model, rewrites the file (onnxslim, the float16
converter, ONNX Runtime's offline optimizer), checks that the clean file shows
no divergence, then perturbs every layer weight in turn (and every
LayerNormalization epsilon): the first divergence must be the module that owns
the weight, located at a segment of a few nodes holding the perturbed node.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx_bisect
from onnx_bisect.records import Status

import rewrites
from archs import build
from conftest import plant_module

#: (architecture, exporter, rewrite); onnxslim drops the dynamo exporter's scope metadata
CASES = [("mlp", "dynamo", "slim"), ("cnn", "dynamo", "slim"), ("bert", "dynamo", "slim"),
         ("cnn", "torchscript", "slim"), ("bert", "torchscript", "slim"),
         ("mlp", "dynamo", "fp16"), ("cnn", "torchscript", "fp16"), ("bert", "dynamo", "fp16"),
         ("cnn", "dynamo", "ort-extended")]
#: ops that read a layer's weight
LAYER_OPS = ("MatMul", "Gemm", "Conv", "FusedConv", "Gather")
#: a float16 file is checked at a tolerance fit for float16, so its faults must be larger
TOLERANCE = {"fp16": {"atol": 1e-2, "rtol": 1e-2}}
NOISE = {"fp16": 2.0}
MAX_SEGMENT = 3


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(c))
def rewritten(request):
    arch, exporter, kind = request.param
    model, inputs = build(arch)
    return model, inputs, rewrites.rewrite(rewrites.export(model, inputs, exporter), kind), kind


def test_clean_rewritten_file_shows_no_divergence(rewritten):
    model, inputs, proto, kind = rewritten
    report = onnx_bisect.bisect(model, inputs, onnx=proto, **TOLERANCE.get(kind, {}))
    assert report.ok
    assert not [r.pair.activation.name for r in report.layers if r.status is Status.DIVERGED]


def test_weight_fault_in_any_layer_is_pinned_to_its_node(rewritten):
    model, inputs, proto, kind = rewritten
    ops = {n.name: n.op_type for n in proto.graph.node}
    planted = 0
    for weight, node in rewrites.weights(proto):
        if ops[node] not in LAYER_OPS:
            continue  # a constant folded from an activation, not a layer's weight
        report = onnx_bisect.bisect(model, inputs, onnx=rewrites.perturb(proto, weight, NOISE.get(kind, 0.05)),
                                    **TOLERANCE.get(kind, {}))
        if report.ok:
            continue  # the perturbation does not reach the outputs beyond tolerance
        planted += 1
        fd = report.first_divergence
        assert fd is not None and fd.introduced, f"{weight}: the outputs diverge but nothing was located"
        blamed = fd.layer.pair
        where = f"{weight} of {node} perturbed; blamed {blamed.activation.name} segment {fd.layer.segment}"
        assert node in fd.layer.segment and len(fd.layer.segment) <= MAX_SEGMENT, where
        owner = rewrites.owner(model, proto, weight)
        if owner is not None:  # the module owning the weight, or a leaf of it (a container's own parameter)
            assert blamed.activation.module == owner or blamed.activation.module.startswith(owner + "."), where
        else:  # a kernel holding a folded BatchNorm: the module its node computes
            assert blamed.node == node, where
    assert planted >= 3


def test_layer_norm_epsilon_fault_is_pinned_to_its_node(rewritten):
    model, inputs, proto, kind = rewritten
    plant = plant_module()
    norms = [n.name for n in proto.graph.node if n.op_type == "LayerNormalization"]
    if not norms:
        pytest.skip("no LayerNormalization node")
    planted = 0
    for name in norms:
        report = onnx_bisect.bisect(model, inputs, onnx=plant.set_attribute(proto, name, "epsilon", 0.5),
                                    **TOLERANCE.get(kind, {}))
        if report.ok:
            continue  # a later norm rescales it away, within tolerance
        planted += 1
        fd = report.first_divergence
        assert fd is not None and fd.introduced
        assert name in fd.layer.segment and len(fd.layer.segment) <= MAX_SEGMENT, (name, fd.layer.segment)
        assert fd.layer.pair.activation.module_type == "LayerNorm", fd.layer.pair.activation.name
    assert planted




class _ScaledMlp(torch.nn.Module):
    """A 1x1-Conv MLP with a GELU and a layer scale on its residual branch (PoolFormer's): onnx-simplifier folds
    the GELU's final ×0.5 and the layer scale into the second Conv's kernel."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(7)
        self.norm, self.conv1, self.act = torch.nn.GroupNorm(1, 8), torch.nn.Conv2d(8, 16, 1), torch.nn.GELU()
        self.conv2, self.scale = torch.nn.Conv2d(16, 8, 1), torch.nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, x):
        return x + self.scale[:, None, None] * self.conv2(self.act(self.conv1(self.norm(x))))


def test_factors_a_simplifier_folded_into_the_next_weights_are_fused_not_diverged():
    """The GELU's tensor holds twice its value and the second Conv's its value times the layer scale: both
    ``fused`` into the weights that undo them (a warning that two layers introduce error, before), and a wrong
    constant inside that GELU is still found — reproducing PyTorch's value times the folded factor."""
    import onnxsim

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import plant

    model, x = _ScaledMlp().eval(), torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(3))
    simplified, _ = onnxsim.simplify(rewrites.export(model, (x,), "torchscript"))
    assert not any(n.op_type == "Mul" and n.name.startswith("/Mul") for n in simplified.graph.node)
    report = onnx_bisect.bisect(model, (x,), onnx=simplified)
    assert report.ok and report.warnings == (), report.warnings
    status = {r.pair.activation.name: r.status for r in report.layers}
    assert status["act"] is Status.FUSED and status["conv2"] is Status.FUSED, status
    div = next(n for n in simplified.graph.node if n.op_type == "Div")
    bad = plant.set_constant(simplified, div.input[1], float(plant._constant(simplified, div.input[1])) * 1.5)
    fd = onnx_bisect.bisect(model, (x,), onnx=bad).first_divergence
    assert fd.cause == "attribute-mismatch" and fd.confirmed is True, fd.explanation
    assert fd.evidence["attributes"][0]["onnx_node"] == div.name and "times 2" in fd.explanation


class _AmplifiedScaledMlp(_ScaledMlp):
    """``_ScaledMlp`` behind a 1x1 Conv with tiny weights whose error the GroupNorm after it amplifies."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Conv2d(8, 8, 1)
        with torch.no_grad():
            self.pre.weight.mul_(0.01)
            self.pre.bias.mul_(0.01)

    def forward(self, x):
        return super().forward(self.pre(x))


def test_folded_factors_are_told_from_a_fault_downstream_of_an_amplified_error():
    """Noise below the tolerance on the first Conv, amplified by the GroupNorm: every tensor after it is noisy,
    the scaled GELU and Conv too, so none agrees exactly — but the factors (2, the layer scale) are plainly not
    1 and the tensors after them carry only the noise on: fused, and the amplified error is traced to the first
    Conv (blamed on the GELU or the second Conv, before)."""
    import onnxsim

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import plant

    model, x = _AmplifiedScaledMlp().eval(), torch.randn(1, 8, 6, 6, generator=torch.Generator().manual_seed(3))
    simplified, _ = onnxsim.simplify(rewrites.export(model, (x,), "torchscript"))
    first = next(n for n in simplified.graph.node if n.op_type == "Conv")
    report = onnx_bisect.bisect(model, (x,), onnx=plant.perturb_initializer(simplified, first.input[1], rel=1e-3))
    fd = report.first_divergence
    assert not report.ok and fd.layer.segment == (first.name,) and fd.amplification is not None, fd.layer.segment
    assert fd.cause == "weight-mismatch" and fd.confirmed is True, fd.explanation
