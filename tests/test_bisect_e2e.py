"""End to end through the Python API: real exports, real ONNX Runtime sessions."""
from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import onnx_bisect
from onnx_bisect.records import MatchMethod, Status
from onnx_bisect.report.text import leaf_coverage, render_text
from onnx_bisect.testing import assert_no_divergence

from archs import build
from conftest import plant_module

ARCHS = ["mlp", "cnn", "shared", "bert", "vit"]
EXPORTERS = ["dynamo", "torchscript"]


def _export(name, exporter):
    model, inputs = build(name)
    if exporter == "dynamo":
        return model, inputs, torch.onnx.export(model, inputs, dynamo=True, verbose=False).model_proto
    buf = io.BytesIO()
    target = model
    torch.onnx.export(target, inputs, buf, dynamo=False, opset_version=17)
    return model, inputs, onnx.load_from_string(buf.getvalue())


@pytest.fixture(scope="module", params=[(a, e) for a in ARCHS for e in EXPORTERS], ids=lambda p: f"{p[0]}-{p[1]}")
def exported(request):
    return _export(*request.param)


def test_clean_export_agrees_and_aligns(exported):
    model, inputs, proto = exported
    report = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert report.ok, render_text(report)
    assert report.first_divergence is None
    assert not [r for r in report.layers if r.status is Status.DIVERGED], "a clean export must show no divergence"
    aligned, total, absent = leaf_coverage(report.layers)
    assert aligned / (total - absent) >= 0.95, [(r.pair.activation.name, r.pair.note) for r in report.layers]
    assert absent <= 0.15 * total


def _weights(proto):
    """(initializer, its consumer nodes) for every float weight matrix or kernel."""
    inits = {i.name: i for i in proto.graph.initializer}
    consumers: dict[str, list[str]] = {}
    for node in proto.graph.node:
        if node.op_type in ("MatMul", "Gemm", "Conv") and len(node.input) > 1 and node.input[1] in inits:
            init = inits[node.input[1]]
            if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) >= 2:
                consumers.setdefault(init.name, []).append(node.name)
    return list(consumers.items())


def _perturb(proto, init_name, rel=0.05):
    planted = onnx.ModelProto()
    planted.CopyFrom(proto)
    for init in planted.graph.initializer:
        if init.name == init_name:
            w = numpy_helper.to_array(init).copy()
            w += np.random.default_rng(0).normal(0, rel * (w.std() + 1e-3), w.shape).astype(w.dtype)
            init.CopyFrom(numpy_helper.from_array(w, init_name))
    return planted


def test_fault_in_any_layer_is_pinned_to_its_node(exported):
    """Perturb each weight in turn: the first divergence must contain its consumer node."""
    model, inputs, proto = exported
    planted_any = False
    for init_name, nodes in _weights(proto):
        report = onnx_bisect.bisect(model, inputs, onnx=_perturb(proto, init_name))
        if report.ok:
            continue  # the perturbation did not reach the outputs beyond tolerance
        planted_any = True
        fd = report.first_divergence
        assert fd is not None, f"{init_name}: outputs diverge but no divergence was located"
        # a weight shared by several calls first diverges at its first consumer
        assert nodes[0] in fd.layer.segment, (
            f"weight {init_name} of {nodes} perturbed, but blamed {fd.layer.pair.activation.name} "
            f"segment {fd.layer.segment}")
        assert fd.introduced
        assert fd.layer.local is not None and not fd.layer.local.ok
    assert planted_any


def test_conv_bn_fold_is_reported_as_fused_not_diverged():
    model, inputs = build("cnn")
    for exporter in EXPORTERS:
        report = onnx_bisect.bisect(model, inputs, exporter=exporter)
        by_module = {r.pair.activation.module: r for r in report.layers if not r.pair.activation.op}
        assert report.ok
        for conv, bn in (("conv1", "bn1"), ("conv2", "bn2")):
            assert by_module[conv].status is Status.FUSED and by_module[conv].pair.tensor is None
            assert by_module[bn].status is Status.FUSED and by_module[bn].pair.method is MatchMethod.FUSED
            assert by_module[bn].diff.ok


def test_module_called_twice_is_aligned_per_call():
    model, inputs = build("shared")
    for exporter in EXPORTERS:
        report = onnx_bisect.bisect(model, inputs, exporter=exporter)
        fc = [r for r in report.layers if r.pair.activation.module == "fc" and not r.pair.activation.op]
        assert [r.pair.activation.call for r in fc] == [0, 1]
        assert fc[0].pair.tensor != fc[1].pair.tensor
        assert all(r.diff is not None and r.diff.ok for r in fc)


def test_assert_no_divergence_helper():
    model, inputs = build("mlp")
    assert assert_no_divergence(model, inputs).ok
    _, _, proto = _export("mlp", "dynamo")
    bad = _perturb(proto, _weights(proto)[0][0], rel=0.5)
    with pytest.raises(AssertionError, match="First divergence"):
        assert_no_divergence(model, inputs, onnx=bad)


def test_attribute_fault_in_any_norm_or_gelu_is_pinned(exported):
    """Change each LayerNorm epsilon / switch each GELU to tanh in turn: the segment must hold that node."""
    plant = plant_module()
    model, inputs, proto = exported
    planted = [(n.name, plant.set_attribute(proto, n.name, "epsilon", 0.5)) for n in proto.graph.node
               if n.op_type == "LayerNormalization"]
    planted += [(n.name, plant.set_gelu_tanh(proto, n.name)) for n in proto.graph.node
                if n.op_type == "Gelu" or (n.op_type == "Erf" and plant._is_gelu_erf(proto, n))]
    hits = 0
    for node_name, bad in planted:
        report = onnx_bisect.bisect(model, inputs, onnx=bad)
        if report.ok:
            continue
        hits += 1
        fd = report.first_divergence
        assert fd is not None and fd.introduced
        rewritten = {n.name for n in bad.graph.node} - {n.name for n in proto.graph.node}
        assert node_name in fd.layer.segment or rewritten & set(fd.layer.segment), (
            f"{node_name} planted, blamed {fd.layer.pair.activation.name} {fd.layer.segment}")
    assert hits or not planted, "no planted norm/GELU fault reached the outputs"
