"""--reference: one ONNX model bisected against another (float16 and int8 conversions, a planted fault)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from conftest import run_cli
from onnx_bisect.records import MatchMethod
from onnx_bisect.pipeline.reference import bisect_onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import plant  # noqa: E402

FIXTURES = ROOT / "fixtures"
CNN = FIXTURES / "onnx" / "cnn.torchscript.onnx"
BERT = FIXTURES / "onnx" / "bert.dynamo.onnx"
CNN_INPUT = np.load(FIXTURES / "inputs" / "cnn.npy")


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {model.graph.input[0].name: CNN_INPUT}


def test_a_copy_agrees_and_every_tensor_pairs_by_name():
    report = bisect_onnx(str(CNN), str(CNN), (CNN_INPUT,))
    assert report.ok and report.first_divergence is None
    assert report.layers and all(r.pair.method is MatchMethod.NAME for r in report.layers)
    # the reference runs with graph optimizations off, the checked file as deployed: rounding only
    assert all(r.diff is not None and r.diff.ok and r.diff.max_abs < 1e-5 for r in report.layers)


@pytest.mark.parametrize("conv", ["/conv1/Conv", "/conv2/Conv"])
def test_planted_weight_change_is_pinned_to_its_node(conv):
    reference = onnx.load(CNN)
    bad = plant.perturb_initializer(reference, plant.weight_of(reference, conv), rel=0.05)
    report = bisect_onnx(reference, bad, (CNN_INPUT,))
    fd = report.first_divergence
    assert not report.ok and fd.introduced and fd.layer.pair.node == conv, fd.layer.pair.node
    assert "the reference" in report.reference


def test_windowed_reference_finds_the_same_node_with_the_same_numbers_and_runs_in_windows(monkeypatch):
    from onnx_bisect.run import windows

    reference = onnx.load(BERT)
    bad = plant.perturb_initializer(reference, plant.weight_of(reference, _a_matmul(reference, 3)), rel=0.05)
    ids = np.load(FIXTURES / "inputs" / "bert.npy")
    whole = bisect_onnx(reference, bad, (ids,))
    planned = []
    plan = windows.plan_windows
    monkeypatch.setattr(windows, "plan_windows", lambda *a: planned.append(plan(*a)) or planned[-1])
    windowed = bisect_onnx(reference, bad, (ids,), window_mb=0.05)
    assert len(planned) >= 2 and all(len(p) >= 3 for p in planned[:2]), "the reference and the candidate in windows"
    fd, fw = whole.first_divergence, windowed.first_divergence
    assert fd.layer.pair.node == fw.layer.pair.node and fd.cause == fw.cause == "weight-mismatch"
    assert fw.layer.diff.max_abs == pytest.approx(fd.layer.diff.max_abs, rel=1e-4)
    assert [r.pair.tensor for r in windowed.layers] == [r.pair.tensor for r in whole.layers]


def _a_matmul(model: onnx.ModelProto, k: int) -> str:
    """The k-th MatMul node that reads a weight."""
    inits = {i.name for i in model.graph.initializer}
    return [n.name for n in model.graph.node if n.op_type == "MatMul" and any(i in inits for i in n.input)][k]


def test_float16_conversion_blames_half_precision_and_passes_at_a_float16_tolerance():
    reference = onnx.load(BERT)
    half = plant.to_float16(reference)
    ids = np.load(FIXTURES / "inputs" / "bert.npy")
    strict = bisect_onnx(reference, half, (ids,))
    assert not strict.ok and strict.first_divergence.cause == "precision"
    aligned = [r for r in strict.layers if r.pair.tensor]
    assert len(aligned) >= 0.9 * len(strict.layers), "the converter keeps tensor names"
    from onnx_bisect.records import Tolerance

    loose = bisect_onnx(reference, half, (ids,), tolerance=Tolerance(2e-2, 2e-2))
    assert loose.ok and not [r for r in loose.layers if r.status.value == "diverged"]


def test_quantized_file_compares_after_dequantize_and_names_quantization():
    reference = onnx.load(CNN)
    quantized = plant.quantize_static_qdq(reference, _feeds(reference))
    report = bisect_onnx(reference, quantized, (CNN_INPUT,))
    fd = report.first_divergence
    assert not report.ok and fd.cause == "quantization" and fd.confirmed, fd.explanation
    assert "0.0% of the activation clipped" in fd.explanation, "a Relu absorbed by the quantizer is not clipping"
    through = [r for r in report.layers if r.pair.method is MatchMethod.NAME and r.pair.tensor != r.pair.activation.module]
    assert len(through) >= 3 and all(r.pair.op_type == "DequantizeLinear" and "compared after DequantizeLinear"
                                     in r.pair.note for r in through)
    fused = [r for r in report.layers if r.pair.activation.module_type == "Conv"]
    assert fused and all(r.pair.tensor is None for r in fused), "a Conv fused with its Relu is not value-paired"


def test_cli_reference_and_its_usage_errors(tmp_path: Path):
    reference = onnx.load(CNN)
    bad = plant.perturb_initializer(reference, plant.weight_of(reference, "/conv2/Conv"), rel=0.05)
    onnx.save(bad, tmp_path / "cnn.bad.onnx")
    result = run_cli(tmp_path / "cnn.bad.onnx", "--reference", CNN, "--input", FIXTURES / "inputs" / "cnn.npy",
                     "--json", tmp_path / "r.json")
    assert result.exit_status == 1, result.stderr
    assert result.json["first_divergence"]["onnx_node"] == "/conv2/Conv"
    assert "differs from the reference cnn.torchscript.onnx" in result.stdout
    generated = run_cli(tmp_path / "cnn.bad.onnx", "--reference", CNN)
    assert generated.exit_status == 1 and "inputs were generated" in generated.stdout
    wrong = run_cli(FIXTURES / "models" / "cnn.py", "--reference", CNN)
    assert wrong.exit_status == 2 and "MODEL is the ONNX file to check" in wrong.stderr
    both = run_cli(tmp_path / "cnn.bad.onnx", "--reference", CNN, "--onnx", CNN)
    assert both.exit_status == 2 and "do not apply" in both.stderr
