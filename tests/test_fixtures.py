"""Walk fixtures/registry.json: every bundled file through the real command line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
REGISTRY = json.loads((FIXTURES / "registry.json").read_text())


@pytest.mark.parametrize("entry", REGISTRY, ids=[e["name"] for e in REGISTRY])
def test_registry_entry(entry, tmp_path):
    args = [FIXTURES / entry["model"], "--onnx", FIXTURES / entry["onnx"], "--json", tmp_path / "r.json"]
    for inp in entry["inputs"]:
        args += ["--input", FIXTURES / inp]
    result = run_cli(*args)
    assert result.exit_status == entry["expect_exit"], result.stdout + result.stderr
    report = result.json
    assert report["ok"] is (entry["expect_exit"] == 0)
    fault = entry["fault"]
    if fault is None:
        assert report["first_divergence"] is None
        assert not [l for l in report["layers"] if l["status"] == "diverged"]
        return
    fd = report["first_divergence"]
    assert fd is not None
    assert fd["module"] in [fault["module"], *fault.get("also_ok_modules", [])]
    assert fault["onnx_node"] in fd["onnx_nodes"]
    assert fd["introduced"] is True
    assert fd["local_max_abs"] > 1e-4
    # the report names the node in the verdict, not just in the JSON
    assert fault["onnx_node"] in result.stdout
