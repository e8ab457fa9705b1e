"""Rows a sort orders another way: ONNX Runtime's TopK and PyTorch's sort break ties among equal keys differently
(tokens sorted by their expert in a mixture of experts), so a layer between the sort and the scatter back holds
PyTorch's rows in another order. That is not a divergence (status ``reordered``), and a clean model whose outputs
agree gets no warning for it."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import onnx_bisect
from onnx_bisect.records.rows import rows_reordered

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _Routed(torch.nn.Module):
    """Tokens sorted by the expert a router picks (32 tokens, 3 experts: many ties), projected in that order and
    scattered back to their places."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(229)
        self.router, self.proj = torch.nn.Linear(8, 3), torch.nn.Linear(8, 8)

    def forward(self, x):
        order = torch.sort(self.router(x).argmax(-1)).indices
        rows = self.proj(x[order])
        return torch.zeros_like(rows).scatter(0, order[:, None].expand_as(rows), rows)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_rows_a_sort_orders_another_way_are_reordered_not_diverged(exporter):
    model, x = _Routed().eval(), torch.randn(32, 8, generator=torch.Generator().manual_seed(231))
    proto = dc.export(model, (x,), exporter)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and not report.warnings, report.warnings
    proj = [r for r in report.layers if r.pair.activation.module == "proj"]
    assert proj and all(r.status.value == "reordered" for r in proj), [(r.status, r.diff) for r in proj]
    assert proj[0].diff.max_abs > 0.01  # beyond the tolerance as compared row by row
    assert not any(r.status.value == "diverged" for r in report.layers)


def test_only_a_permutation_of_the_same_rows_is_reordered():
    rng = np.random.default_rng(233)
    rows = rng.normal(size=(6, 4)).astype(np.float32)
    moved = rows[[1, 0, 2, 3, 5, 4]]
    back = rows_reordered(moved, rows)
    assert back is not None and np.array_equal(back, rows)
    assert rows_reordered(rows[::-1].copy(), rows) is None  # reversed: a flipped sort, a fault
    assert rows_reordered(rows, rows) is None  # the rows' own order: nothing reordered
    other = moved.copy()
    other[0] += 0.5
    back = rows_reordered(other, rows)  # one row changed: back in order, still unlike (the caller's compare says)
    assert back is None or not np.allclose(back, rows, atol=1e-4, rtol=1e-3)
    twice = np.vstack([rows[:1], rows[:1], rows[2:]])  # equal rows go one each
    assert rows_reordered(twice[[1, 0, 3, 2, 4, 5]], twice) is not None


class _Routed2(torch.nn.Module):
    """As _Routed, with a second stage that reads the sorted rows and the sort's indices (each row weighted by its
    token's position): fed PyTorch's rows in PyTorch's order while the file's sort orders them another way, that
    stage would mix the two orders."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(243)
        self.router, self.proj, self.stage = torch.nn.Linear(8, 3), torch.nn.Linear(8, 8), _Stage()

    def forward(self, x):
        order = torch.sort(self.router(x).argmax(-1)).indices
        rows = self.stage(self.proj(x[order]), order)
        return torch.zeros_like(rows).scatter(0, order[:, None].expand_as(rows), rows)


class _Stage(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("position", torch.linspace(0.5, 2.0, 32))

    def forward(self, rows, order):
        return self.lin(rows) * self.position[order][:, None]


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_a_stage_after_reordered_rows_is_fed_them_in_the_files_order(exporter):
    """A weight fault in the stage after the reordered rows: its segment is re-run fed the rows as the file orders
    them, so its own error is the weight's alone, and restoring PyTorch's weight confirms it."""
    model, x = _Routed2().eval(), torch.randn(32, 8, generator=torch.Generator().manual_seed(247))
    proto = dc.export(model, (x,), exporter)
    weight = model.stage.lin.weight.detach().numpy()
    from onnx import numpy_helper
    for init in proto.graph.initializer:
        value = numpy_helper.to_array(init)
        if value.shape in (weight.shape, weight.T.shape) and np.allclose(value.reshape(-1), (
                weight if value.shape == weight.shape else weight.T).reshape(-1)):
            noisy = value + np.random.default_rng(251).normal(0, 0.05, value.shape).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(noisy, init.name))
            break
    else:
        raise AssertionError("the stage's weight is not an initializer")
    with dc.quiet():
        fd = onnx_bisect.bisect(model, (x,), onnx=proto).first_divergence
    assert fd is not None and fd.cause == "weight-mismatch" and fd.confirmed is True, fd and fd.explanation
    assert "stage" in (fd.layer.pair.activation.module or ""), fd.layer.pair.activation.name


class _RoutedMlp(torch.nn.Module):
    """Sorted tokens through a projection, a ReLU and a second projection (row-wise modules with no sort of their
    own), scattered back."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(253)
        self.router, self.proj, self.act, self.lin2 = (torch.nn.Linear(8, 3), torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                                       torch.nn.Linear(8, 8))

    def forward(self, x):
        order = torch.sort(self.router(x).argmax(-1)).indices
        rows = self.lin2(self.act(self.proj(x[order])))
        return torch.zeros_like(rows).scatter(0, order[:, None].expand_as(rows), rows)


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_row_wise_modules_after_reordered_rows_are_reordered_too_and_a_rolled_output_is_not(exporter):
    """Fed the reordered rows as the file orders them, the row-wise modules after them hold their rows in that
    order as well: reordered, no warning. A Gather rolling the rows before the scatter back (a real fault) is not
    excused: the output's rows in another order are wrong, whatever sorted them."""
    import onnx
    from onnx import helper, numpy_helper

    model, x = _RoutedMlp().eval(), torch.randn(32, 8, generator=torch.Generator().manual_seed(257))
    proto = dc.export(model, (x,), exporter)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert report.ok and not report.warnings, report.warnings
    assert {r.pair.activation.module for r in report.layers if r.status.value == "reordered"} >= {"proj", "act"}
    assert not any(r.status.value == "diverged" for r in report.layers)
    scatter = next(n for n in proto.graph.node if n.op_type == "ScatterElements")
    rows = scatter.input[2]
    proto.graph.initializer.append(numpy_helper.from_array(np.roll(np.arange(32), 1).astype(np.int64), "rolled"))
    roll = helper.make_node("Gather", [rows, "rolled"], ["rows_rolled"], name="planted_roll", axis=0)
    scatter.input[2] = "rows_rolled"
    nodes = list(proto.graph.node)
    nodes.insert(nodes.index(scatter), roll)
    proto.graph.ClearField("node")
    proto.graph.node.extend(nodes)
    onnx.checker.check_model(proto)
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=proto)
    assert not report.ok and report.first_divergence is not None
    assert "planted_roll" in report.first_divergence.layer.segment, report.first_divergence.layer.segment

