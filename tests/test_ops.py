"""Op-level granularity: with a dynamo export, each exported-program op is aligned with its ONNX value."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch

import onnx_bisect
from conftest import write_source
from onnx_bisect.records import MatchMethod, Status
from onnx_bisect.report.text import leaf_coverage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

SCORER = """
    import torch
    import torch.nn.functional as F


    class ScoreHead(torch.nn.Module):
        \"\"\"Sharpened binary log-probabilities, centred per row: several functional ops in one module.\"\"\"

        def __init__(self, temperature=0.01):
            super().__init__()
            self.proj = torch.nn.Linear(16, 4)
            self.temperature = temperature

        def forward(self, h):
            logits = self.proj(h) / self.temperature
            logp = F.logsigmoid(logits)
            return logp - logp.mean(-1, keepdim=True)


    class Scorer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh())
            self.head = ScoreHead()

        def forward(self, x):
            return self.head(self.body(x))


    def get_model():
        torch.manual_seed(0)
        return Scorer().eval()


    def get_inputs():
        torch.manual_seed(1)
        return (torch.randn(3, 8),)
"""


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_fault_inside_a_multi_op_module_is_blamed_on_the_single_op(tmp_path: Path):
    """The dynamo exporter writes logsigmoid as Log(Sigmoid(x)), which underflows where PyTorch's stable op
    does not; the divergence lies inside ScoreHead, which has five ops of its own."""
    m = _module(write_source(tmp_path / "scorer.py", SCORER))
    dynamo = onnx_bisect.bisect(m.get_model(), m.get_inputs(), exporter="dynamo")
    fd = dynamo.first_divergence
    assert not dynamo.ok and fd.layer.pair.activation.module == "head"
    assert fd.layer.pair.activation.op == "log_sigmoid" and fd.layer.pair.method is MatchMethod.OP
    assert fd.layer.segment_ops == ("Sigmoid", "Log"), fd.layer.segment_ops
    assert fd.introduced and fd.cause == "numerical-stability" and fd.confirmed
    # TorchScript keeps no op names: the module's 6-node segment is narrowed by value to the same two nodes
    narrowed = onnx_bisect.bisect(m.get_model(), m.get_inputs(), exporter="torchscript").first_divergence
    assert narrowed.layer.pair.activation.module == "head"
    assert narrowed.layer.pair.activation.module_type == "aten.log_sigmoid_forward.default"
    assert narrowed.layer.segment_ops == ("Sigmoid", "Log") and narrowed.cause == "numerical-stability"
    assert narrowed.within is not None and narrowed.within.pair.activation.module == "head"
    assert {"Sigmoid", "Log", "ReduceMean", "Sub"} <= set(narrowed.within.segment_ops), "narrowed from the module"


def test_ops_of_a_clean_transformer_align_and_agree():
    m = _module(FIXTURES / "models" / "bert.py")
    ids = torch.from_numpy(np.load(FIXTURES / "inputs" / "bert.npy"))
    report = onnx_bisect.bisect(m.get_model(), (ids,), exporter="dynamo")
    ops = [r for r in report.layers if r.pair.activation.op]
    assert report.ok and len(ops) >= 30
    assert all(r.pair.tensor == r.pair.activation.op and r.status is Status.MATCHED for r in ops)
    aligned, total, absent = leaf_coverage(report.layers)
    assert total == len([r for r in report.layers if r.pair.activation.is_leaf and r.pair.activation.module
                         and not r.pair.activation.op]), "ops do not count as leaf modules"
    assert aligned == total - absent, "every leaf module present in the graph is aligned"
