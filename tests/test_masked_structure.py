"""A structural pair must hold the activation element by element: a module returning a masked position bias
(−1e10 where masked) beside its output, whose file computes scores plus that bias, has a tensor within 1e-9 relative
L2 of the bias — the shared mask entries dominate the norm — that differs by the scores everywhere else."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import onnx_bisect

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402


class _BiasedAttention(torch.nn.Module):
    """Attention with a learned relative bias and a local mask added as −1e10 (T5-style): returns its output and
    the masked bias, which the next layer reuses."""

    def __init__(self, d=16, s=8):
        super().__init__()
        self.qkv, self.o = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.bias = torch.nn.Parameter(torch.randn(s, s))
        self.register_buffer("far", (torch.arange(s)[:, None] - torch.arange(s)[None, :]).abs() > 2)

    def forward(self, x, position_bias=None):
        if position_bias is None:
            position_bias = self.bias + self.far * -1e10
        q, k, v = self.qkv(x).chunk(3, -1)
        scores = q @ k.transpose(-1, -2) + position_bias
        return self.o(scores.softmax(-1) @ v), position_bias


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(271)
        self.first, self.second = _BiasedAttention(), _BiasedAttention()

    def forward(self, x):
        h, bias = self.first(x)
        h2, _ = self.second(x + h, bias)
        return h2


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_scores_plus_a_masked_bias_are_not_paired_with_the_bias(exporter):
    model = _Encoder().eval()
    x = torch.randn(1, 8, 16, generator=torch.Generator().manual_seed(272))
    with dc.quiet():
        report = onnx_bisect.bisect(model, (x,), onnx=dc.export(model, (x,), exporter))
    assert report.ok and not report.warnings, report.warnings
    assert not any(r.status.value == "diverged" for r in report.layers), [
        (r.pair.activation.name, r.pair.tensor) for r in report.layers if r.status.value == "diverged"]


def test_a_structural_pair_is_judged_element_by_element_not_by_its_norm():
    """LongT5's transient-global attention, exported by dynamo, returns its masked position bias (folded into a
    constant) beside its output; the only computed tensor of that size was scores plus the bias, 1e-9 away in
    relative L2, and was paired: six false 'diverged' rows and a warning on a clean file.  Judged element by
    element it holds another value and stays unpaired."""
    import numpy as np

    from onnx_bisect.align import structure

    rng = np.random.default_rng(273)
    far = np.abs(np.arange(8)[:, None] - np.arange(8)[None, :]) > 2
    bias = (rng.normal(size=(1, 2, 8, 8)) + far * -1e10).astype(np.float32)
    scores = (bias + rng.normal(size=bias.shape) * 3).astype(np.float32)
    values = {"scores": scores, "copy": bias.copy()}
    signatures = {t: structure._signature(v) for t, v in values.items()}
    assert structure._best_layout(bias, ["scores"], values, signatures) is None
    found = structure._best_layout(bias, ["scores", "copy"], values, signatures)
    assert found is not None and found[0] == "copy"
