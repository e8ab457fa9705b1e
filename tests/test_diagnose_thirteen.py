"""Faults the thirteenth stop's sweeps left misplaced or unexplained: an input rewired to one of many tensors of
its shape (a block-sparse attention's gathered key blocks)."""
from __future__ import annotations

import sys
from pathlib import Path

import onnx
import pytest
import torch

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


class _Shared(torch.nn.Module):
    """One Linear + BatchNorm block registered under two names (TabNet's shared GLU blocks), called twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(133)
        block = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.BatchNorm1d(6))
        self.first, self.second = block, block
        with torch.no_grad():
            block[1].running_mean.uniform_(-1, 1)
            block[1].running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


class _Half(torch.nn.Module):
    """A bfloat16 buffer (RecurrentGemma's embedding normaliser) cast to the activations' type in forward."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(134)
        self.proj = torch.nn.Linear(6, 6)
        self.register_buffer("normalizer", torch.tensor(2.5, dtype=torch.bfloat16), persistent=False)

    def forward(self, x):
        return self.proj(x * self.normalizer.type(x.dtype))


@pytest.mark.parametrize("model", [_Shared, _Half], ids=["module-under-two-names", "bfloat16-buffer"])
def test_a_clean_model_with_a_shared_module_or_a_bfloat16_buffer_runs_clean(model):
    """Both crashed the weight comparison (a KeyError for the second name of the shared block; numpy has no
    bfloat16); clean, they agree with no warning."""
    inputs = (torch.randn(4, 6, generator=torch.Generator().manual_seed(135)),)
    with dc.quiet():
        report = onnx_bisect.bisect(model().eval(), inputs)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status.value == "diverged"]


def test_a_module_output_the_file_prunes_is_not_paired_with_a_tensor_no_output_reads():
    """ViTMAE's embedding returns the kept patches and the mask of those dropped; nothing downstream reads the
    mask, so the file prunes it, keeping the unused values of the TopK sorting the noise it came from.  The mask
    was paired by scope with those values and measured as a hidden fault of the embedding ('the outputs agree,
    but 2 layers introduce error'): a tensor no graph output is computed from is no layer's output to measure."""
    import sweep_models
    model, inputs = sweep_models.build("vitmae")
    with dc.quiet():
        report = onnx_bisect.bisect(model, inputs)
    assert report.ok and not report.warnings, report.warnings
    assert not [r for r in report.layers if r.status.value == "diverged"]
