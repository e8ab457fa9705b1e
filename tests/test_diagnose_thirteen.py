"""Faults the thirteenth stop's sweeps left misplaced or unexplained: an input rewired to one of many tensors of
its shape (a block-sparse attention's gathered key blocks)."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


def _bisect(model, inputs, proto):
    with dc.quiet():
        return onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence


def test_an_input_rewired_to_one_of_many_tensors_of_its_shape_is_found_where_it_lies_far_back():
    """BigBird's block-sparse attention gathers a dozen key blocks of one shape; an Einsum reading one of them is
    wired to a product of that shape computed after it.  The right tensor lies eight tensors of its shape back
    (a Gather's output no module holds): the rewiring is read only when that many of the graph's own tensors are
    tried in its place."""
    import sweep_models
    model, inputs = sweep_models.build("bigbird")
    proto = onnx.shape_inference.infer_shapes(dc.export(model, inputs, "dynamo"))
    shapes = {v.name: tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in proto.graph.value_info}
    nodes, producer = list(proto.graph.node), {t: i for i, n in enumerate(proto.graph.node) for t in n.output}
    einsum, slot, wrong, best = None, None, None, 0
    for i, n in enumerate(nodes):
        for j, t in enumerate(n.input):
            if n.op_type != "Einsum" or t not in producer or nodes[producer[t]].op_type != "Gather":
                continue
            later = [m.output[0] for m in nodes[producer[t] + 1:i] if m.op_type == "MatMul"
                     and shapes.get(m.output[0]) == shapes.get(t)]
            same = [m.output[0] for m in nodes[producer[t] + 1:i] if shapes.get(m.output[0]) == shapes.get(t)]
            if later and len(same) > best:
                einsum, slot, wrong, best = n, j, later[-1], len(same)
    assert best >= 6, "no Einsum reads a Gather with six tensors of its shape between them"
    einsum.input[slot] = wrong
    fd = _bisect(model, inputs, proto)
    _found(fd, einsum.name, cause="attribute-mismatch")
    assert f"reads '{wrong}' as its input {slot}" in fd.explanation, fd.explanation
