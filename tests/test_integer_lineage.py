"""Values computed through integers: an ArgMax's index, a one-hot made float, a mask built from them.  PyTorch's
capture records no integer value, but what is computed from one is computed from the ops before it, and a segment's
integer tensors hold no value to pair: the node computing one from right tensors is where an error can enter."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper

import onnx_bisect
from onnx_bisect.capture import dispatch
from onnx_bisect.records import ModelInputs

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from planting import found as _found  # noqa: E402


class _GreedyPicker(torch.nn.Module):
    """A greedy pointer-style decoder written in the model's own forward: each step scores the points against a
    query projection, lowers the visited ones, takes the ArgMax's one-hot into the visited mask and its point as
    the next query."""

    def __init__(self, d=16, n=8, steps=5):
        super().__init__()
        torch.manual_seed(231)
        self.n, self.steps = n, steps
        self.embed, self.q, self.v = torch.nn.Linear(2, d), torch.nn.Linear(d, d), torch.nn.Linear(d, 1)
        with torch.no_grad():
            self.q.weight.mul_(6)  # queries of a few units: a truncation keeps their whole part

    def forward(self, points):
        e = self.embed(points)
        visited = torch.zeros_like(points[..., 0])
        inp, out = e.mean(1), []
        for _ in range(self.steps):
            s = self.v(torch.tanh(e + self.q(inp)[:, None])).squeeze(-1)
            logits = 10 * torch.tanh(s) - 1e4 * visited
            out.append(logits.softmax(-1))
            pick = F.one_hot(logits.argmax(-1), self.n).to(points.dtype)
            visited = visited + pick
            inp = (pick[:, None] @ e).squeeze(1)
        return torch.stack(out, 1)


def _points():
    return (torch.rand(2, 8, 2, generator=torch.Generator().manual_seed(232)),)


def test_a_one_hot_made_float_is_recorded_as_computed_from_the_scores_it_picked_from():
    """The cast one-hot is a value of PyTorch's own (a file's Cast holds it), computed from the scores the ArgMax
    read — not a value out of nowhere that the visited mask after it holds first."""
    model = _GreedyPicker().eval()
    ops = dispatch.capture_window(model, ModelInputs(_points(), {}), None, ("", 0), first_index=0)
    by_index = {a.index: a for a in ops}
    casts = [a for a in ops if a.module_type.startswith("aten._to_copy")]
    assert len(casts) == 5, [a.op for a in ops]
    first = casts[0]
    assert first.value.shape == (2, 8) and set(first.value.reshape(-1).tolist()) == {0.0, 1.0}
    read = [by_index[i].module_type for i in first.inputs]
    assert any(t.startswith("aten.sub") for t in read), read  # the lowered scores the ArgMax picked from
    mask = next(a for a in ops if a.module_type.startswith("aten.add") and first.index in a.inputs)
    assert mask.value.shape == (2, 8)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_truncation_in_a_later_step_of_a_greedy_loop_is_named_at_its_casts(exporter):
    """The last step's query projection cast to int32 and back, the truncated value under the projection's name:
    the segment reaching that module output spans every step's mask (nothing there is a module's output).  With the one-hot's lineage kept, every mask pairs with PyTorch's,
    the only wrong tensor is the projection's output, and the two Casts computing it are named, as a dtype fault."""
    model = _GreedyPicker().eval()
    inputs = _points()
    proto = dc.export(model, inputs, exporter)
    gemms = [n for n in proto.graph.node if n.op_type in ("Gemm", "MatMul", "Add") and any(
        i.name in n.input for i in proto.graph.initializer if tuple(i.dims) in ((16, 16), (16,)))]
    last = gemms[-1]
    source = last.output[0]  # the module's output: the cut reads the truncated value under the projection's name
    last.output[0] = source + "_float"
    down = helper.make_node("Cast", [source + "_float"], [source + "_int"], name="planted_to_int32",
                            to=TensorProto.INT32)
    up = helper.make_node("Cast", [source + "_int"], [source], name="planted_from_int32", to=TensorProto.FLOAT)
    at = list(proto.graph.node).index(last) + 1
    proto.graph.node.insert(at, up)
    proto.graph.node.insert(at, down)
    with dc.quiet():
        fd = onnx_bisect.bisect(model, inputs, onnx=proto).first_divergence
    evidence = _found(fd, "planted_to_int32", cause="dtype", at_most=2)
    assert "planted_from_int32" in fd.layer.segment, fd.layer.segment
    assert evidence["casts_to_integer"] == ["planted_to_int32"], evidence
