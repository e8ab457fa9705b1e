"""Faults planted in files that went through a pipeline are still pinned to their node.

Each case exports a small model, rewrites the file (onnxslim, the float16
converter, ONNX Runtime's offline optimizer), checks that the clean file shows
no divergence, then perturbs every layer weight in turn (and every
LayerNormalization epsilon): the first divergence must be the module that owns
the weight, located at a segment of a few nodes holding the perturbed node.
"""
from __future__ import annotations


import pytest

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


