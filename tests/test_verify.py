"""Verification matrix end to end: datasets, providers, fixed dimensions, dynamic export, faithful location."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import helper

import onnx_bisect
from conftest import run_cli
from onnx_bisect.records import CaseKind, ConfigStatus, Reproduction

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "fixtures"
SAMPLE = np.load(FIXTURES / "inputs" / "mlp.npy")


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 16)
        self.act = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def _mlp():
    torch.manual_seed(0)
    return Mlp().eval()


def _clipped_relu_onnx(model: torch.nn.Module, cap: float) -> onnx.ModelProto:
    """The model's export with its Relu replaced by Clip(0, cap): right for small activations only."""
    buffer = io.BytesIO()
    torch.onnx.export(model, (torch.randn(1, 6),), buffer, dynamo=False, opset_version=17, input_names=["x"],
                      dynamic_axes={"x": {0: "batch"}})
    proto = onnx.load_from_string(buffer.getvalue())
    relu = next(n for n in proto.graph.node if n.op_type == "Relu")
    proto.graph.initializer.extend([helper.make_tensor("cap_lo", onnx.TensorProto.FLOAT, [], [0.0]),
                                    helper.make_tensor("cap_hi", onnx.TensorProto.FLOAT, [], [cap])])
    relu.op_type = "Clip"
    relu.input.extend(["cap_lo", "cap_hi"])
    return proto


def test_dataset_names_the_samples_that_diverge_and_aggregates_per_layer():
    model = _mlp()
    scales = [0.2, 3.0, 0.4, 0.1, 5.0, 0.3]
    dataset = [torch.randn(1, 6, generator=torch.Generator().manual_seed(i)) * s for i, s in enumerate(scales)]
    with torch.no_grad():
        peaks = [float(model.act(model.fc1(x)).max()) for x in dataset]
    cap = 2.0
    report = onnx_bisect.verify(model, dataset[0], _clipped_relu_onnx(model, cap), dataset=dataset)
    cells = {r.case.label: r for r in report.results if r.case.kind is CaseKind.DATASET}
    diverged = {i for i in range(len(scales)) if cells[f"sample {i}"].status is ConfigStatus.DIVERGED}
    assert diverged == {i for i, p in enumerate(peaks) if p > cap} and diverged, (peaks, diverged)
    for i in diverged:
        assert cells[f"sample {i}"].first_divergence.layer.pair.activation.module == "act"
    act = next(a for a in report.dataset if a.name == "act")
    assert act.samples == len(scales) and act.diverged_samples == len(diverged)
    assert act.worst_sample == int(np.argmax(peaks)) and act.worst_max_abs == pytest.approx(max(peaks) - cap, rel=1e-4)
    assert act.p99_max_abs == pytest.approx(act.worst_max_abs)
    fc1 = next(a for a in report.dataset if a.name == "fc1")
    assert fc1.diverged_samples == 0, "upstream of the clip every sample agrees"
    assert report.exit_status == 1


def test_cli_dataset_directory_and_json(tmp_path: Path):
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(3):
        np.save(folder / f"{i}.npy", np.random.default_rng(i).standard_normal(SAMPLE.shape).astype(np.float32))
    model = FIXTURES / "models" / "mlp.py"
    result = run_cli(model, "--input", folder, "--onnx", FIXTURES / "onnx" / "mlp.torchscript.onnx",
                     "--json", tmp_path / "m.json")
    assert result.exit_status == 0, result.stdout + result.stderr  # a clean export agrees on every sample
    doc = result.json
    assert all(c["status"] == "ok" and c["kind"] == "dataset" for c in doc["configurations"])
    assert [c["inputs"] for c in doc["configurations"]] == ["sample 0 (0.npy)", "sample 1 (1.npy)", "sample 2 (2.npy)"]
    assert {"ok", "dynamic_axes", "summary", "configurations", "dataset", "agreements", "timings"} <= set(doc)
    assert doc["dataset"] and all(a["samples"] == 3 and a["diverged_samples"] == 0 for a in doc["dataset"])
    assert all(0 <= a["worst_sample"] < 3 and a["p99_max_abs"] <= a["worst_max_abs"] for a in doc["dataset"])


def test_unavailable_provider_is_a_row_not_a_crash(tmp_path: Path):
    model = FIXTURES / "models" / "mlp.py"
    onnx_file = FIXTURES / "onnx" / "mlp.torchscript.onnx"
    both = run_cli(model, "--onnx", onnx_file, "--provider", "CPUExecutionProvider",
                   "--provider", "CUDAExecutionProvider", "--json", tmp_path / "m.json")
    assert both.exit_status == 0, both.stderr
    status = {c["runtime"]["provider"]: c["status"] for c in both.json["configurations"]}
    assert status == {"CPUExecutionProvider": "ok", "CUDAExecutionProvider": "unavailable"}
    assert "not in this onnxruntime build" in both.stdout
    alone = run_cli(model, "--onnx", onnx_file, "--provider", "CUDAExecutionProvider")
    assert alone.exit_status == 2 and "NOTHING VERIFIED" in alone.stdout and "Traceback" not in alone.stderr
    typo = run_cli(model, "--onnx", onnx_file, "--provider", "CUDAProvider")
    assert typo.exit_status == 2 and "Unknown execution provider 'CUDAProvider'" in typo.stderr


def test_fixed_batch_in_a_given_file_is_untestable_and_said_so(tmp_path: Path):
    model = FIXTURES / "models" / "mlp.py"
    onnx_file = FIXTURES / "onnx" / "mlp.torchscript.onnx"
    fixed = onnx.load(onnx_file).graph.input[0].type.tensor_type.shape.dim[0].dim_value
    result = run_cli(model, "--onnx", onnx_file, "--batch-sizes", f"{fixed},{fixed + 3}", "--json", tmp_path / "m.json")
    cells = {c["inputs"]: c for c in result.json["configurations"]}
    assert cells[f"batch={fixed}"]["status"] == "ok" and cells[f"batch={fixed + 3}"]["status"] == "untestable"
    assert f"axis 0 is fixed to {fixed} (needs {fixed + 3})" in cells[f"batch={fixed + 3}"]["message"]
    assert result.exit_status == 0
    assert f"cannot be tested: batch={fixed + 3}" in result.stdout
    assert "Re-export with those dimensions dynamic" in result.stdout
    nothing = run_cli(model, "--onnx", onnx_file, "--batch-sizes", f"{fixed + 1}")
    assert nothing.exit_status == 2 and "NOTHING VERIFIED" in nothing.stdout


def test_export_marks_dynamic_axes_and_a_clean_transformer_agrees_everywhere(tmp_path: Path):
    result = run_cli(FIXTURES / "models" / "bert.py", "--input", FIXTURES / "inputs" / "bert.npy",
                     "--batch-sizes", "1,3", "--vary", "1=5,9", "--json", tmp_path / "m.json")
    assert result.exit_status == 0, result.stdout + result.stderr
    doc = result.json
    assert [c["inputs"] for c in doc["configurations"]] == [
        "batch=1 dim1=5", "batch=1 dim1=9", "batch=3 dim1=5", "batch=3 dim1=9"]
    assert all(c["status"] == "ok" and c["first_divergence"] is None for c in doc["configurations"])
    assert any(a.startswith("input_ids[0]") for a in doc["dynamic_axes"])
    assert any(a.startswith("input_ids[1]") for a in doc["dynamic_axes"])


def test_optimizer_rewrite_hidden_by_exposure_is_located_faithfully():
    """ONNX Runtime's GELU approximation fuses an erf subgraph; exposing every candidate tensor (a single
    bisection's probe) stops the fusion, so that instrumented run agrees with PyTorch while the shipped graph
    does not: the divergence is then located with exposures that keep the shipped outputs.  The matrix, whose
    probe exposes only the paired tensors once the alignment is known, sees the rewrite directly."""
    from onnx_bisect.source.load import load_inputs, load_model

    loaded, module = load_model(str(FIXTURES / "models" / "bert.py"))
    inputs = load_inputs([str(FIXTURES / "inputs" / "bert.npy")], loaded, module)
    onnx_file = str(FIXTURES / "onnx" / "bert.torchscript.onnx")
    intermediate = "bert.encoder.layer.0.intermediate"
    single = onnx_bisect.bisect(loaded.module, inputs, onnx_file,
                                ort_config={"optimization.enable_gelu_approximation": "1"})
    assert not single.ok and single.reproduction is Reproduction.DIFFERENT
    assert single.faithful is not None and single.faithful.runs >= 1
    assert single.first_divergence.layer.pair.activation.module == intermediate
    assert single.first_divergence.cause == "runtime-optimization" and single.first_divergence.confirmed

    report = onnx_bisect.verify(loaded.module, inputs, onnx_file,
                                ort_variants=[{"optimization.enable_gelu_approximation": "1"}])
    plain, approx = report.results
    assert plain.status is ConfigStatus.OK and approx.status is ConfigStatus.DIVERGED
    assert approx.reproduction is not Reproduction.DIFFERENT, "the narrowed probe keeps the fusion"
    assert approx.first_divergence.layer.pair.activation.module.startswith(intermediate)  # its GELU, or itself
    assert approx.first_divergence.cause == "runtime-optimization"
    agreement, = report.agreements
    assert not agreement.ok and agreement.first_module.startswith(intermediate)
