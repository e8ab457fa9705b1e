"""Walk fixtures/configurations/registry.json: each configuration-dependent fault shows where it must, and
nowhere else."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "configurations"
REGISTRY = json.loads((FIXTURES / "registry.json").read_text())


@pytest.mark.parametrize("entry", REGISTRY, ids=lambda e: e["name"])
def test_fault_named_in_its_configurations_only(entry, tmp_path):
    result = run_cli(FIXTURES / entry["model"], "--onnx", FIXTURES / entry["onnx"], *entry["args"],
                     "--json", tmp_path / "matrix.json")
    assert result.exit_status == entry["exit_status"], result.stderr
    got = {f"{c['runtime']['label']} | {c['inputs']}": c for c in result.json["configurations"]}
    assert set(got) == set(entry["expect"]), "the matrix has exactly the configurations asked for"
    for key, want in entry["expect"].items():
        cell = got[key]
        assert cell["status"] == want["status"], (key, cell["status"], cell["first_divergence"])
        fd = cell["first_divergence"]
        if want["status"] == "ok":
            assert fd is None and all(o["ok"] for o in cell["outputs"]), key
            continue
        assert fd is not None and fd["module"] == want["module"], (key, fd and fd["module"])
        if "cause" in want:
            assert fd["cause"] == want["cause"], (key, fd["cause"], fd["explanation"])
    assert "DIVERGED" in result.stdout
