"""Walk fixtures/coverage/registry.json: every planted problem is reported with the right status."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from onnx_bisect.coverage import Status, triage

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "coverage"
REGISTRY = json.loads((FIXTURES / "registry.json").read_text())


def _options(args: list[str]) -> dict:
    return {"opset": int(args[args.index("--opset") + 1])} if "--opset" in args else {}


@pytest.mark.parametrize("entry", [e for e in REGISTRY if "nodes" in e], ids=lambda e: e["name"])
def test_onnx_fixture_statuses(entry):
    report = triage(str(FIXTURES / entry["file"]), **_options(entry["args"]))
    got = {f.node.display: f.status.value for f in report.findings}
    assert {name: got.get(name) for name in entry["nodes"]} == entry["nodes"]
    assert report.exit_status == entry["exit_status"]
    refused = {f.node.display for f in report.findings if f.status is Status.UNSUPPORTED}
    assert refused <= set(report.placement.failed), "every unsupported node is confirmed by a session"


@pytest.mark.parametrize("entry", [e for e in REGISTRY if "problems" in e], ids=lambda e: e["name"])
def test_python_fixture_export_problems(entry):
    report = triage(str(FIXTURES / entry["file"]))
    assert sorted(a.exporter for a in report.exports if a.ok) == sorted(entry["exported_by"])
    problems = [p for a in report.exports for p in a.problems]
    for want in entry["problems"]:
        match = [p for p in problems if p.exporter == want["exporter"] and p.kind.value == want["kind"]]
        assert match, (want, problems)
        p = match[0]
        assert p.source is not None and Path(p.source.file).name == entry["file"] and p.source.line == want["line"]
        assert p.fatal == want["fatal"] and p.message
        if "operator" in want:
            assert want["operator"] in (p.operator or "")
    assert report.exit_status == entry["exit_status"]
    assert not [f for f in report.findings if f.status in (Status.UNSUPPORTED, Status.FALLS_BACK)]
