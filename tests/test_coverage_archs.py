"""Clean architectures (transformers configs, random weights): no node may be called unsupported or falling back."""
from __future__ import annotations

import contextlib
import io
import warnings

import onnx
import pytest
import torch

from archs import build
from onnx_bisect.coverage import Status, triage


def export(name: str, path, dynamo: bool) -> None:
    model, inputs = build(name)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            onnx.save(torch.onnx.export(model, inputs, dynamo=True, report=False, verbose=False).model_proto, path)
        else:
            torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17)


@pytest.mark.parametrize("name, dynamo", [("bert", True), ("vit", True), ("cnn", True), ("bert", False)])
def test_clean_architecture_has_no_unsupported_or_fallback_claims(tmp_path, name, dynamo):
    path = tmp_path / f"{name}.onnx"
    export(name, path, dynamo)
    report = triage(str(path), providers=("CUDAExecutionProvider", "CPUExecutionProvider"))
    bad = [(f.node.display, f.status.value, f.reason) for f in report.findings
           if f.status in (Status.UNSUPPORTED, Status.FALLS_BACK)]
    assert not bad
    assert report.exit_status == 0 and report.validation.ok
    assert not report.placement.failed and report.placement.error is None
    placed = set(report.placement.assigned) | set(report.placement.expanded)
    assert len(placed) >= 0.9 * len(report.findings), "the session confirms (almost) every node"
