"""Walk fixtures/registry.json through the Python API: each planted fault gets its cause, confirmed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

import onnx_bisect

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
PLANTED = [e for e in json.loads((FIXTURES / "registry.json").read_text()) if e["fault"]]


def _model(path: Path):
    spec = importlib.util.spec_from_file_location(f"fixture_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_model()


@pytest.mark.parametrize("entry", PLANTED, ids=[e["name"] for e in PLANTED])
def test_planted_fixture_gets_its_cause(entry):
    import torch

    inputs = tuple(torch.from_numpy(np.load(FIXTURES / p)) for p in entry["inputs"])
    report = onnx_bisect.bisect(_model(FIXTURES / entry["model"]), inputs, onnx=str(FIXTURES / entry["onnx"]))
    fd = report.first_divergence
    assert fd.cause == entry["fault"]["kind"], fd.explanation
    assert fd.confirmed is True and fd.confidence >= 0.9
    assert fd.evidence["local_max_abs_after_fix"] < fd.evidence["local_max_abs_before_fix"] / 100
