"""``--extract`` / ``report.extract``: the standalone repro of more faults (a runtime setting, an op narrowed inside
a block, large weights in external data), and the refusals (a folder with something in it, a place that cannot be
written, nothing diverged, a verification matrix)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
CNN = [FIXTURES / "models" / "cnn.py", "--input", FIXTURES / "inputs" / "cnn.npy"]
FIGURE = re.compile(r"max abs error (\S+), (\S+)x the tolerance")


def _script(folder: Path, *args: str) -> tuple[int, float, str]:
    ran = subprocess.run([sys.executable, "-I", "repro.py", *args], cwd=folder, capture_output=True, text=True,
                         timeout=120)
    found = FIGURE.search(ran.stdout)
    assert found, ran.stdout + ran.stderr
    return ran.returncode, float(found.group(1)), ran.stdout


def test_a_runtime_setting_travels_with_the_repro(tmp_path):
    """ONNX Runtime's GELU approximation, switched on by a session entry: the repro runs with that entry, and
    the fix is the segment with the optimizations off."""
    result = run_cli(FIXTURES / "configurations" / "gelu_block.py", "--onnx",
                     FIXTURES / "configurations" / "gelu_block.onnx", "--ort-config",
                     "optimization.enable_gelu_approximation=1", "--atol", "1e-5", "--rtol", "1e-4",
                     "--json", tmp_path / "r.json", "--extract", tmp_path / "repro")
    assert result.exit_status == 1, result.stderr
    fd = result.json["first_divergence"]
    assert fd["cause"] == "runtime-optimization" and fd["confirmed"] is True
    script = (tmp_path / "repro" / "repro.py").read_text()
    assert "'segment.onnx': ('inputs.npz', 'expected.npz', 'ORT_ENABLE_ALL', " \
           "{'optimization.enable_gelu_approximation': '1', 'session.disable_prepacking': '1'})" in script
    assert "'fixed.onnx': ('inputs.npz', 'expected.npz', 'ORT_DISABLE_ALL'" in script
    status, figure, _ = _script(tmp_path / "repro")
    assert status == 1 and figure == pytest.approx(fd["local_max_abs"], rel=1e-5) and figure > 1e-5
    status, figure, _ = _script(tmp_path / "repro", "fixed.onnx")
    assert status == 0 and figure < 1e-5


def test_narrowed_op_and_external_data(tmp_path):
    """An attention block whose output projection (a Gemm) lost its transB: the repro is the op the report narrows
    to (not the block), and with a low threshold its weights go to a .data file beside the model."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import diagnosis_cases as dc
    from onnx_bisect.pipeline.extract import extract

    case = dc.attribute("transformer", "onnxslim")  # the attention projection's Gemm with transB=0
    with dc.quiet():
        import onnx_bisect

        report = onnx_bisect.bisect(case.model, case.inputs, onnx=case.proto)
    fd = report.first_divergence
    assert fd.cause == "attribute-mismatch" and fd.within is not None
    assert len(fd.layer.segment) < len(fd.within.segment)
    x = extract(report, str(tmp_path / "repro"), external_bytes=0)
    assert x.reproduces and x.fixed_passes and x.external_data
    assert set(x.nodes) == set(fd.layer.segment) and x.output == fd.layer.pair.tensor
    model = onnx.load(tmp_path / "repro" / "segment.onnx", load_external_data=False)
    external = [i for i in model.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert external and (tmp_path / "repro" / "segment.onnx.data").is_file()
    assert all(dict((e.key, e.value) for e in i.external_data)["location"] == "segment.onnx.data" for i in external)
    status, figure, _ = _script(tmp_path / "repro")
    assert status == 1 and figure == pytest.approx(x.measured.max_abs, rel=1e-5)
    assert x.measured.max_abs == pytest.approx(fd.layer.local.max_abs, rel=0.01)


def test_refuses_a_folder_with_something_in_it(tmp_path):
    folder = tmp_path / "repro"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    result = run_cli(*CNN, "--onnx", FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx", "--extract", folder)
    assert result.exit_status == 2 and result.stdout == ""
    assert result.stderr.startswith("onnx-bisect: error: --extract") and "not empty" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert [p.name for p in folder.iterdir()] == ["keep.txt"] and (folder / "keep.txt").read_text() == "mine"


def test_refuses_a_place_that_cannot_be_written(tmp_path):
    (tmp_path / "file").write_text("")
    result = run_cli(*CNN, "--onnx", FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx", "--extract",
                     tmp_path / "file" / "repro")
    assert result.exit_status == 2 and "onnx-bisect: error: --extract" in result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_nothing_to_extract_when_nothing_diverged(tmp_path):
    result = run_cli(*CNN, "--onnx", FIXTURES / "onnx" / "cnn.dynamo.onnx", "--extract", tmp_path / "repro")
    assert result.exit_status == 2 and "OK: all 1 output(s) agree" in result.stdout
    assert result.stderr.strip() == ("onnx-bisect: error: --extract: the outputs agree with the reference, so nothing "
                                     "diverged and there is no segment to extract.")
    assert not (tmp_path / "repro").exists() and list(tmp_path.iterdir()) == []


def test_a_verification_matrix_is_not_extracted(tmp_path):
    result = run_cli(*CNN, "--onnx", FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx", "--batch-sizes", "1,2",
                     "--extract", tmp_path / "repro")
    assert result.exit_status == 2 and "single bisection" in result.stderr and "Traceback" not in result.stderr


def test_the_python_api_keeps_nothing_when_asked_not_to(tmp_path):
    import onnx_bisect
    from onnx_bisect.errors import UsageError

    sys.path.insert(0, str(FIXTURES / "models"))
    import importlib

    cnn = importlib.import_module("cnn")
    x = np.load(FIXTURES / "inputs" / "cnn.npy")
    report = onnx_bisect.bisect(cnn.get_model(), (x,), onnx=str(FIXTURES / "onnx" / "cnn.bn_eps.dynamo.onnx"),
                                extractable=False)
    assert report.repro is None and "repro" not in report.timings
    with pytest.raises(UsageError, match="extractable=True"):
        report.extract(str(tmp_path / "repro"))
    assert "<svg" in report.to_html()
