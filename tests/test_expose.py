import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_bisect.run.expose import cut_at_tensors, expose_tensors, reference_input_name


def _chain() -> onnx.ModelProto:
    """x -> Relu -> a -> Mul(2) -> b -> Add(1) -> y"""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Mul", ["a", "two"], ["b"], name="mul"),
        helper.make_node("Add", ["b", "one"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return onnx.shape_inference.infer_shapes(model)


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def test_expose_adds_typed_outputs_without_touching_the_original():
    model = _chain()
    before = model.SerializeToString()
    exposed = expose_tensors(model, ["a", "b"])
    assert model.SerializeToString() == before
    onnx.checker.check_model(exposed)
    out = _run(exposed, {"x": np.array([-1.0, 0.5, 2.0], np.float32)})
    np.testing.assert_allclose(out["a"], [0.0, 0.5, 2.0])
    np.testing.assert_allclose(out["b"], [0.0, 1.0, 4.0])
    np.testing.assert_allclose(out["y"], [1.0, 2.0, 5.0])


def test_cut_feeds_consumers_the_reference_value():
    model = _chain()
    before = model.SerializeToString()
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    ref_a = np.array([10.0, 20.0, 30.0], np.float32)
    ref_b = np.array([100.0, 200.0, 300.0], np.float32)
    cut = cut_at_tensors(model, {"a": ref_a, "b": ref_b})
    assert model.SerializeToString() == before
    out = _run(cut, {"x": x, reference_input_name("a"): ref_a, reference_input_name("b"): ref_b})
    # each segment computes from the reference at its input, not from upstream nodes
    np.testing.assert_allclose(out["a"], [0.0, 0.5, 2.0])  # Relu(x)
    np.testing.assert_allclose(out["b"], ref_a * 2)  # Mul reads a's reference
    np.testing.assert_allclose(out["y"], ref_b + 1)  # Add reads b's reference
