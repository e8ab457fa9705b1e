"""The ONNX side on awkward graphs: subgraphs, local functions, version limits, opset rewrites, risk rules."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from onnx_bisect.coverage import Slug, Status, triage

V = helper.make_tensor_value_info


def save(tmp_path, nodes, inputs, outputs, opset=17, inits=(), functions=(), extra=(), name="m.onnx", ir=10):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), *extra], functions=list(functions))
    model.ir_version = ir
    onnx.save(model, tmp_path / name)
    return str(tmp_path / name)


def by_name(report):
    return {f.node.display: f for f in report.findings}


def test_subgraph_and_local_function_nodes_are_triaged_and_placed(tmp_path):
    then_g = helper.make_graph([helper.make_node("Relu", ["d"], ["t"], name="then_relu")], "then", [],
                               [V("t", T.INT8, [2, 2])])
    else_g = helper.make_graph([helper.make_node("Trilu", ["d"], ["e"], name="else_trilu")], "else", [],
                               [V("e", T.INT8, [2, 2])])
    twice = helper.make_function("local.fns", "Twice", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
                                 [helper.make_opsetid("", 17)])
    path = save(tmp_path, [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch"),
                           helper.make_node("Twice", ["x"], ["z"], domain="local.fns", name="twice")],
                [V("c", T.BOOL, []), V("x", T.FLOAT, [2]), V("d", T.INT8, [2, 2])],
                [V("y", T.INT8, [2, 2]), V("z", T.FLOAT, [2])], functions=[twice],
                extra=[helper.make_opsetid("local.fns", 1)])
    found = by_name(triage(path))
    assert found["else_trilu"].status is Status.UNSUPPORTED and found["else_trilu"].confirmed
    assert found["else_trilu"].node.graph.startswith("branch/")
    assert found["then_relu"].status is Status.OK and found["branch"].status is Status.OK
    inlined = [f for name, f in found.items() if f.node.signature.op_type == "Add"]
    assert inlined and inlined[0].status is Status.OK


def test_versions_beyond_onnxruntime_block_the_model(tmp_path):
    relu = helper.make_node("Relu", ["x"], ["y"], name="relu")
    report = triage(save(tmp_path, [relu], [V("x", T.FLOAT, [2])], [V("y", T.FLOAT, [2])], ir=onnx.IR_VERSION))
    ir = next(v for v in report.validation.versions if v.what == "IR")
    if ir.ort_max is not None and ir.version > ir.ort_max:
        assert not ir.ok and report.runtime_refused and report.exit_status == 1


def test_duplicate_node_names_are_a_validation_issue(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="same"), helper.make_node("Neg", ["h"], ["y"], name="same")]
    report = triage(save(tmp_path, nodes, [V("x", T.FLOAT, [2])], [V("y", T.FLOAT, [2])]))
    assert any("duplicate node names" in issue for issue in report.validation.issues)
    assert report.exit_status == 1
    assert {f.node.key for f in report.findings} == {"Relu_0", "Neg_1"}  # placed under unique keys


def test_opset_rewrite_reasons(tmp_path):
    inits = [numpy_helper.from_array(np.array([2, 2], np.int64), "shape"),
             numpy_helper.from_array(np.array([0], np.int64), "axes")]
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape", allowzero=0),
             helper.make_node("Add", ["r", "r"], ["a"], name="add"),
             helper.make_node("ReduceSum", ["a", "axes"], ["y"], name="reducesum", keepdims=1)]
    report = triage(save(tmp_path, nodes, [V("x", T.FLOAT, [4])], [V("y", T.FLOAT, [1, 2])], opset=18, inits=inits),
                    opset=11)
    found = by_name(report)
    assert all(f.status is Status.NEEDS_NEWER_OPSET for f in found.values())
    assert "no attribute allowzero" in found["reshape"].reason
    assert "same inputs, attributes and types" in found["add"].reason
    assert "takes 1 input(s) there" in found["reducesum"].reason


def test_risk_rules_point_at_diagnosis_slugs(tmp_path):
    inits = [numpy_helper.from_array(np.array(1.4142135, np.float32), "sqrt2"),
             numpy_helper.from_array(np.ones(4, np.float16), "scale")]
    nodes = [helper.make_node("Div", ["x", "sqrt2"], ["d"], name="div"),
             helper.make_node("Erf", ["d"], ["e"], name="erf"),
             helper.make_node("LayerNormalization", ["h", "scale"], ["y"], name="ln16", epsilon=1e-12)]
    report = triage(save(tmp_path, nodes, [V("x", T.FLOAT, [2, 4]), V("h", T.FLOAT16, [2, 4])],
                         [V("e", T.FLOAT, [2, 4]), V("y", T.FLOAT16, [2, 4])], inits=inits))
    found = by_name(report)
    assert found["erf"].status is Status.RISKY
    assert Slug.GELU_APPROXIMATION in found["erf"].risks[0].slugs
    slugs = {s for r in found["ln16"].risks for s in r.slugs}
    assert {Slug.EPSILON_MISMATCH, Slug.PRECISION} <= slugs
    assert found["div"].status is Status.OK
