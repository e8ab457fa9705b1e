"""ONNX sequences (lists, as ONNX Runtime hands over a Loop's or a SplitToSequence's values) inside a graph: exposed
with every tensor, they are not tensors to pair, compare or narrow."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


def test_a_sequence_computed_inside_the_graph_is_no_tensor_to_pair():
    """The fault sweep's DLRM: EmbeddingBags exported as Loops whose intermediate values ONNX Runtime hands over
    as ONNX sequences (lists). Exposed with every tensor, they reached the alignment, which read their shape and
    failed; now only tensors are paired, and a weight fault after them is named."""
    import fault_sweep
    import sweep_models
    from onnx import numpy_helper

    model, inputs = sweep_models.build("dlrm")
    proto = fault_sweep.export(model, inputs, "dynamo")
    weight = dict(model.named_parameters())["top.0.weight"].detach().numpy()
    init = next(i for i in proto.graph.initializer if numpy_helper.to_array(i).shape in (weight.shape, weight.T.shape)
                and np.allclose(np.sort(numpy_helper.to_array(i).reshape(-1)), np.sort(weight.reshape(-1))))
    value = numpy_helper.to_array(init)
    init.CopyFrom(numpy_helper.from_array(value * np.float32(1.3), init.name))
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
