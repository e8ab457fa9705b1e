"""Handing the finding on (issue 13): ``--extract``, ``--html`` and ``--node-data`` on real files through the
command line, with node and tensor names that try to inject HTML, script and Python code."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import onnx
import pytest

from browser import count_near, render, screenshot
from conftest import run_cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
#: the bundled example's planted fault (BatchNorm folded with eps 0.1) sits in this node, renamed here
NODE = "<script>alert(1)</script>"
TENSOR = '"><img src=x onerror=alert(2)>\'"""\n__import__("os").system("echo pwned")'
FIGURE = re.compile(r"max abs error (\S+), (\S+)x the tolerance")


def hostile_copy(folder: Path) -> Path:
    """The bundled example's ONNX file with the faulty Conv and its output renamed to hostile strings."""
    model = onnx.load(FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx")
    planted = next(e for e in json.loads((FIXTURES / "registry.json").read_text()) if e["name"] == "cnn.bn_eps.dynamo")
    (conv,) = [n for n in model.graph.node if n.name == planted["fault"]["onnx_node"]]
    old = conv.output[0]
    conv.name = NODE
    for node in model.graph.node:
        node.output[:] = [TENSOR if t == old else t for t in node.output]
        node.input[:] = [TENSOR if t == old else t for t in node.input]
    for info in list(model.graph.value_info) + list(model.graph.output):
        if info.name == old:
            info.name = TENSOR
    path = folder / "hostile.onnx"
    onnx.save(model, path)
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One command line run writing every hand-off: JSON, HTML, node data and the repro folder."""
    tmp = tmp_path_factory.mktemp("handoff")
    result = run_cli(FIXTURES / "models" / "cnn.py", "--onnx", hostile_copy(tmp), "--input", FIXTURES / "inputs" / "cnn.npy",
                     "--json", tmp / "report.json", "--html", tmp / "report.html", "--node-data", tmp / "errors.json",
                     "--extract", tmp / "repro")
    assert result.exit_status == 1, result.stderr
    return tmp, result


def test_the_report_blames_the_renamed_node(run):
    _, result = run
    fd = result.json["first_divergence"]
    assert fd["onnx_node"] == NODE and fd["onnx_tensor"] == TENSOR and fd["cause"] == "batchnorm-fold"
    assert fd["local_max_abs"] > 0.2  # eps 0.1 instead of 1e-5: about 0.247


def test_extract_writes_a_standalone_segment_that_reproduces(run):
    tmp, result = run
    folder, fd = tmp / "repro", result.json["first_divergence"]
    assert sorted(p.name for p in folder.iterdir()) == ["expected.npz", "fixed.onnx", "inputs.npz", "repro.py",
                                                        "segment.onnx"]
    assert not [p for p in tmp.iterdir() if p.name.startswith(".repro")]  # the staging folder is gone
    model = onnx.load(folder / "segment.onnx")
    onnx.checker.check_model(model, full_check=True)
    assert [n.name for n in model.graph.node] == [NODE]
    assert [i.name for i in model.graph.input] == ["x"] and [o.name for o in model.graph.output] == [TENSOR]
    assert {o.domain: o.version for o in model.opset_import}[""] == 20
    inputs = np.load(folder / "inputs.npz")
    assert inputs.files == ["x"] and np.array_equal(inputs["x"], np.load(FIXTURES / "inputs" / "cnn.npy"))
    assert np.load(folder / "expected.npz").files == [TENSOR]
    said = re.search(r"reproduces the report's error: max abs (\S+) against (\S+) in the report", result.stdout)
    assert said and said.group(1) == said.group(2) == f"{fd['local_max_abs']:.3g}"
    assert "fixed.onnx (the diagnosis' fix) passes" in result.stdout


def test_repro_script_runs_isolated_and_prints_the_reports_figure(run):
    tmp, result = run
    folder, local = tmp / "repro", result.json["first_divergence"]["local_max_abs"]
    code = [t.string for t in tokenize.generate_tokens(io.StringIO((folder / "repro.py").read_text()).readline)
            if t.type not in (tokenize.COMMENT, tokenize.STRING)]
    assert not [t for t in code if "pwned" in t or "system" in t]  # names reach it only as literals and comments
    ran = _script(folder)
    assert ran.returncode == 1 and "DIVERGES" in ran.stdout and "pwned" not in ran.stdout, ran.stdout + ran.stderr
    figure, ratio = map(float, FIGURE.search(ran.stdout).groups())
    assert figure == pytest.approx(local, rel=1e-5) and ratio > 100
    assert not {"torch", "onnx", "onnx_bisect"} & _imported(ran.stderr)
    fixed = _script(folder, "fixed.onnx")
    assert fixed.returncode == 0 and "within tolerance" in fixed.stdout, fixed.stdout + fixed.stderr
    assert float(FIGURE.search(fixed.stdout).group(1)) < 1e-5


def test_html_renders_in_chromium_with_the_plot_and_no_console_message(run, tmp_path):
    tmp, result = run
    page = tmp / "report.html"
    html = page.read_text()
    assert "<script>alert" not in html and "<img src=x" not in html and "&lt;script&gt;alert(1)" in html
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    seen = render(page, tmp_path)
    assert seen.console == []  # no error, no CSP violation, no log
    svg = re.search(r'<svg id="plot".*?</svg>', seen.dom, re.S).group(0)
    assert svg.count("<polyline") >= 1 and svg.count("<circle") >= 9 and svg.count("<rect") >= 8 and "first divergence" in svg
    assert "<img" not in seen.dom and NODE not in seen.dom  # only as escaped text
    assert seen.dom.count('<tr id="layer-') == len(result.json["layers"])
    pixels = screenshot(page, tmp_path / "shot.png", tmp_path, size=(1100, 700))
    assert count_near(pixels, (0x09, 0x69, 0xDA)) > 200  # the accumulated error's line and dots
    assert count_near(pixels, (0xCF, 0x22, 0x2E)) > 100  # the tolerance line
    assert count_near(pixels, (0xFF, 0xEB, 0xE9), within=3) > 5000  # the DIVERGED verdict box


def test_node_data_follows_model_explorers_format(run):
    tmp, result = run
    accumulated, local, status = (json.loads((tmp / n).read_text())
                                  for n in ("errors.json", "errors.local.json", "errors.status.json"))
    nodes = {n.name for n in onnx.load(tmp / "hostile.onnx").graph.node}
    layers = {row["onnx_node"]: row for row in result.json["layers"] if row["max_abs"] is not None}
    for document in (accumulated, local, status):
        assert set(document) <= {"results", "thresholds", "gradient", "showExpandedSummaryOnGroupNode",
                                 "showLabelCountColumnsInChildrenStatsTable"}
        assert document["results"] and "results" not in document["results"]  # read as data for the shown graph
        assert set(document["results"]) <= nodes
        assert all(set(r) <= {"value", "bgColor", "textColor"} for r in document["results"].values())
    bounds = [t["value"] for t in accumulated["thresholds"]]
    assert bounds == sorted(bounds) and bounds[1] == 1.0 and all(t["bgColor"] for t in accumulated["thresholds"])
    # in units of the tolerance: the segment's own max |a - b| / (atol + rtol |b|), recomputed from the repro
    import onnxruntime as ort

    tol, folder = result.json["tolerance"], tmp / "repro"
    (actual,) = ort.InferenceSession(folder / "segment.onnx").run(None, dict(np.load(folder / "inputs.npz")))
    expected = np.load(folder / "expected.npz")[TENSOR].astype(np.float64)
    ratio = np.max(np.abs(actual - expected) / (tol["atol"] + tol["rtol"] * np.abs(expected)))
    assert ratio > 50 and local["results"][NODE]["value"] == pytest.approx(ratio, rel=1e-3)
    assert accumulated["results"][NODE]["value"] == local["results"][NODE]["value"]  # it reads the graph input
    assert layers["node_relu"]["local_max_abs"] == 0 and local["results"]["node_relu"]["value"] == 0
    assert accumulated["results"]["node_relu"]["value"] > 50  # inherited
    assert status["results"][NODE]["value"] == "first divergence"
    assert status["results"]["node_relu"]["value"] == "diverged (inherited)"


def _script(folder: Path, *args: str) -> subprocess.CompletedProcess:
    """``repro.py`` in a fresh isolated interpreter (no PYTHONPATH, no user site, script folder off the path)."""
    return subprocess.run([sys.executable, "-I", "-X", "importtime", "repro.py", *args], cwd=folder,
                          capture_output=True, text=True, timeout=120)


def _imported(importtime: str) -> set[str]:
    return {line.split("|")[-1].strip().split(".")[0] for line in importtime.splitlines()
            if line.startswith("import time:")}


def test_a_verification_page_shows_the_matrix(tmp_path):
    """A batch size baked into a Reshape by the tracer: the page lists the configurations, the cause of the ones
    that diverge, and every configuration's error along the graph."""
    configurations = FIXTURES / "configurations"
    page = tmp_path / "matrix.html"
    result = run_cli(configurations / "baked_batch.py", "--onnx", configurations / "baked_batch.onnx",
                     "--batch-sizes", "1,4", "--html", page)
    assert result.exit_status == 1, result.stderr
    html = page.read_text()
    rows = re.findall(r"<tr><td>CPU/all</td><td>(batch=\d)</td><td>(\w+)</td>", html)
    assert rows == [("batch=1", "ok"), ("batch=4", "DIVERGED")]
    assert "baked-shape (90%)" in html and "First divergence in CPU/all batch=4" in html
    seen = render(page, tmp_path)
    assert seen.console == []
    svg = re.search(r'<svg id="plot".*?</svg>', seen.dom, re.S).group(0)
    assert svg.count("<polyline") >= 2 and "tolerance (1×)" in svg  # one line per configuration


def test_node_data_keys_by_graph_when_a_node_is_called_results():
    """Model Explorer reads a file whose ``results`` holds a ``results`` key as data keyed by graph: then it is."""
    from onnx_bisect.records import (Activation, ErrorOrigin, Exporter, LayerResult, MatchMethod, Report, Status,
                                     TensorDiff, TensorPair, Tolerance)
    from onnx_bisect.report.node_data import node_data

    diff = TensorDiff(0.5, 0.1, 0.1, 0.99, float("inf"), False, (2,))
    layer = LayerResult(TensorPair(Activation(0, "fc", "Linear", 0, "", np.zeros(2)), "y", "results", "Gemm",
                                   MatchMethod.METADATA), diff, diff, Status.DIVERGED, ErrorOrigin.INTRODUCED)
    report = Report(False, Tolerance(), Exporter.GIVEN, 17, "cpu", (), None, (layer,), graph_name="main_graph")
    accumulated, _, status = node_data(report)
    assert list(accumulated) == ["main_graph"] and list(status) == ["main_graph"]
    value = accumulated["main_graph"]["results"]["results"]["value"]
    assert value == sys.float_info.max  # JSON has no infinity
    assert json.loads(json.dumps(accumulated, allow_nan=False)) == accumulated
