"""Training-mode rules: a graph exported in training mode; a PyTorch model that is not deterministic."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import diagnosis_cases as dc  # noqa: E402
from diagnosis_suite import bisect_case  # noqa: E402


def test_batchnorm_on_batch_statistics_in_the_graph():
    report, _ = bisect_case(dc.training_mode("cnn", "torchscript"))
    fd = report.first_divergence
    assert fd.cause == "training-mode" and fd.confirmed is True
    assert fd.evidence["batch_statistics_nodes"] and fd.evidence["batch_vs_running_mean_max_abs"] > 0.01
    assert "model.eval()" in fd.fix
    assert any("exported in training mode" in w for w in report.warnings)  # the preflight saw it too


class _MonteCarlo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.head = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.head(torch.nn.functional.dropout(self.fc(x), 0.5, training=True))


def test_pytorch_runs_that_differ():
    torch.manual_seed(0)
    model = _MonteCarlo().eval()
    inputs = (torch.randn(4, 8),)
    clean_model = _MonteCarlo().eval()
    clean_model.load_state_dict(model.state_dict())
    clean_model.forward = lambda x: clean_model.head(clean_model.fc(x))  # export the deterministic graph
    proto = dc.export(clean_model, inputs, "torchscript")
    report, _ = bisect_case(dc.Case("mc", "training-mode", "mlp", "torchscript", model, inputs, proto))
    fd = report.first_divergence
    assert fd.cause == "training-mode" and fd.confidence >= 0.5
    assert fd.confirmed is None  # nothing to re-run: a hypothesis
    assert fd.evidence["pytorch_run_to_run_max_abs"] > 0.01
