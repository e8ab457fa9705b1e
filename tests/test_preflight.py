"""Preflight: the checks that need no ONNX forward pass, each with its fix."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
import plant  # noqa: E402
import rewrites  # noqa: E402

import onnx_bisect  # noqa: E402
from onnx_bisect.diagnose import preflight  # noqa: E402
from onnx_bisect.run.backend import make_backend  # noqa: E402
from onnx_bisect.errors import OnnxLoadError  # noqa: E402
from onnx_bisect.records import LoadedModel, ModelInputs  # noqa: E402
from onnx_bisect.source.weights import split_weights  # noqa: E402

from conftest import tiny_onnx  # noqa: E402


def _loaded(model):
    return LoadedModel(model, type(model).__name__, "<test>", False, ("x",))


def test_training_mode_graph():
    _, _, proto = dc.clean("mlp", "torchscript", training=True)
    [warning] = preflight.training_mode_nodes(proto)
    assert "BatchNormalization" in warning and "Dropout" in warning and "model.eval()" in warning


def test_float64_model_against_float32_graph():
    exported, reference, inputs = dc.dm.build_centered("mlp")
    proto = dc.export(exported, (inputs[0].float(),), "dynamo")
    [warning] = preflight.float64_model(_loaded(reference), ModelInputs(inputs, {}, ("x",)), proto)
    assert "float64" in warning and "inputs x" in warning and "model.double()" in warning
    model, inputs32, proto = dc.clean("mlp", "dynamo")
    assert preflight.float64_model(_loaded(model), ModelInputs(inputs32, {}, ("x",)), proto) == []


def test_checker_full_check_finds_what_the_basic_check_lets_through():
    node = helper.make_node("Relu", ["x"], ["y"], name="relu")
    graph = helper.make_graph([node], "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 4])])  # wrong output type
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(bad)  # the basic check passes
    [warning] = preflight.checker_errors(bad)
    assert "onnx.checker" in warning and "Fix" in warning
    assert preflight.checker_errors(tiny_onnx()) == []


def test_opset_newer_than_onnxruntime_supports():
    backend = make_backend()
    too_new = tiny_onnx()
    too_new.ir_version, too_new.opset_import[0].version = 8, 40
    message = preflight.runtime_support(too_new, backend)
    assert "opset 40 (it supports up to" in message and "opset_version=" in message
    too_new.ir_version, too_new.opset_import[0].version = 99, 17
    assert "IR version 99 (it reads up to" in preflight.runtime_support(too_new, backend)
    too_new.ir_version = 8
    assert preflight.runtime_support(too_new, backend) is None
    model, inputs, proto = dc.clean("mlp", "dynamo")
    too_new_model = onnx.ModelProto()
    too_new_model.CopyFrom(proto)
    too_new_model.opset_import[0].version = 40
    with pytest.raises(OnnxLoadError, match="opset 40"):
        onnx_bisect.bisect(model, inputs, onnx=too_new_model)


def test_fixed_batch_axis_of_a_given_file():
    [warning] = preflight.static_batch(tiny_onnx(shape=(2, 4)))
    assert "'x' (batch 2)" in warning and "dynamic_shapes" in warning and "dynamic_axes" in warning
    dynamic = tiny_onnx(shape=(2, 4))
    dynamic.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    assert preflight.static_batch(dynamic) == []


def test_stale_weight_under_a_generated_name():
    """The dynamo exporter stores Linear weights transposed under names like val_12: paired by value."""
    model, inputs, proto = dc.clean("transformer", "dynamo")
    skeleton, weights = split_weights(proto)
    assert preflight.compare_weights(_loaded(model), skeleton, weights) == []
    init = plant.weight_of(proto, plant.find_nodes(proto, "MatMul", "blocks.1.fc1")[0].name)
    skeleton, weights = split_weights(plant.perturb_initializer(proto, init, rel=0.05))
    [diff] = preflight.compare_weights(_loaded(model), skeleton, weights)
    assert diff.initializer == init and diff.parameter == "blocks.1.fc1.weight" and 0.03 < diff.rel_l2 < 0.08


def test_folded_batchnorm_is_not_stale_but_a_wrong_fold_is_reported():
    case = dc.batchnorm_fold("cnn", "dynamo")
    report = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto)
    assert any("BatchNorm folded in, but not with the BatchNorm's parameters" in w for w in report.warnings)
    model, inputs, proto = dc.clean("cnn", "dynamo")
    report = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert not [w for w in report.warnings if "initializer" in w or "folded" in w]


def test_clean_model_gets_no_preflight_warning_but_the_batch_axis():
    model, inputs, proto = dc.clean("transformer", "torchscript")
    report = onnx_bisect.bisect(model, inputs, onnx=proto)
    assert [w for w in report.warnings if "batch size" not in w] == []
    assert "preflight" in report.timings


class _RMSNormNet(torch.nn.Module):
    """A Linear and a hand-written RMSNorm, which ONNX Runtime's optimizer rewrites into its own
    SimplifiedLayerNormalization in the ONNX domain."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.fc, self.weight = torch.nn.Linear(16, 16), torch.nn.Parameter(torch.rand(16) + 0.5)

    def forward(self, x):
        h = self.fc(x)
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def test_an_offline_optimized_files_runtime_ops_are_a_note_not_a_checker_warning():
    """ONNX Runtime's offline optimizer writes SimplifiedLayerNormalization in the ONNX domain, which the onnx
    package has no schema for: a clean optimized file gets a note that it runs on ONNX Runtime only, and no
    checker warning; a broken node next to it is still reported."""
    model, x = _RMSNormNet().eval(), torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(1))
    proto = rewrites.rewrite(dc.export(model, (x,), "torchscript"), "ort-extended")
    assert any(n.op_type == "SimplifiedLayerNormalization" and n.domain == "" for n in proto.graph.node)
    assert preflight.checker_errors(proto)  # the onnx package alone does not know the op
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and report.warnings == (), report.warnings
    assert any("SimplifiedLayerNormalization in the ONNX domain" in n for n in report.notes), report.notes
    own = make_backend().own_ops()
    assert preflight.checker_errors(proto, own) == []
    bad = onnx.ModelProto()
    bad.CopyFrom(proto)
    bad.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64  # a wrong input type stays a warning
    [warning] = preflight.checker_errors(bad, own)
    assert "onnx.checker" in warning


class _StandardizedConv(torch.nn.Module):
    """A convolution whose weight is standardised in forward with batch_norm in training mode (BiT's
    ``WeightStandardizedConv2d``): the exported BatchNormalization has training_mode=1 on a weight."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        w = self.conv.weight
        w = torch.nn.functional.batch_norm(w.reshape(1, 8, -1), None, None, training=True, momentum=0.0,
                                           eps=1e-6).reshape_as(w)
        return torch.relu(self.bn(torch.nn.functional.conv2d(x, w, self.conv.bias, padding=1)))


def test_batch_statistics_of_a_standardised_weight_are_no_training_mode_export(tmp_path):
    model, x = _StandardizedConv().eval(), torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(4))
    proto = rewrites.export(model, (x,), "torchscript")
    norms = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    assert any(a.name == "training_mode" and a.i for n in norms for a in n.attribute)  # the weight's
    assert not preflight.training_mode_nodes(proto)
    report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and not [w for w in report.warnings if "training mode" in w], report.warnings
    path = tmp_path / "standardized.onnx"
    onnx.save(proto, path)
    triaged = onnx_bisect.triage(str(path), confirm=False)  # the coverage triage flags no training-mode risk
    assert not [r for f in triaged.findings for r in f.risks if "training_mode" in r.reason]
    # the same model exported in training mode: its own BatchNorm is reported, the weight's is not
    buffer = __import__("io").BytesIO()
    with dc.quiet():
        torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False)
    [warning] = preflight.training_mode_nodes(onnx.load_from_string(buffer.getvalue()))
    assert "1 BatchNormalization node(s)" in warning
