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


def test_a_cut_at_a_tensor_whose_value_info_is_stale_declares_the_fed_shape():
    """An edited Transpose computes (2, 3) where the file's value info still says (3, 2): the reference input
    declares the shape fed, else ONNX Runtime refuses the feed. Agreeing and symbolic dimensions are kept."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[0, 1]),
             helper.make_node("Relu", ["t"], ["y"], name="relu")]
    graph = helper.make_graph(nodes, "stale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, "n"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    ref = -np.ones((2, 3), np.float32)
    cut = cut_at_tensors(model, {"t": ref})
    declared = next(i for i in cut.graph.input if i.name == reference_input_name("t"))
    assert [d.dim_value for d in declared.type.tensor_type.shape.dim] == [2, 3]
    out = _run(cut, {"x": np.ones((2, 3), np.float32), reference_input_name("t"): ref})
    assert np.array_equal(out["y"], np.zeros((2, 3), np.float32))

    agreeing = helper.make_tensor_value_info("t", TensorProto.FLOAT, ["n", 3])
    del model.graph.value_info[:]
    model.graph.value_info.append(agreeing)
    kept = next(i for i in cut_at_tensors(model, {"t": ref}).graph.input if i.name == reference_input_name("t"))
    assert kept.type.tensor_type.shape.dim[0].dim_param == "n"


def test_a_segment_fed_at_one_output_of_a_split_runs_the_split_for_the_others():
    """A cut at one output of a node with several (a Split's key, fed PyTorch's value) while the segment needs
    another (its query): the node runs, and the fed output is not defined twice (ONNX Runtime refused the
    segment: "Duplicate definition of name"; GPT-BigCode's multi-query attention in renamed and onnxslim files)."""
    from onnx_bisect.diagnose.support import segment

    graph = helper.make_graph(
        [helper.make_node("Split", ["x"], ["q", "k", "v"], axis=1, num_outputs=3),
         helper.make_node("Mul", ["q", "k"], ["y"])],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    sub, boundary, _ = segment.extract(model, ["y"], {"k"})
    assert set(boundary) == {"k", "x"}
    x, k = np.arange(12, dtype=np.float32).reshape(2, 6), np.full((2, 2), 10.0, np.float32)
    segment.with_inputs(sub, {"x": x, "k": k})
    [y] = ort.InferenceSession(sub.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], {"x": x, "k": k})
    np.testing.assert_array_equal(y, x[:, :2] * 10.0)
    assert [n.output[0] for n in model.graph.node] == ["q", "y"], "the caller's model is not modified"
