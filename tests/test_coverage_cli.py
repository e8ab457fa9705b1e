"""``onnx-bisect coverage`` end to end: exit statuses, the table, JSON, bad input, and the main job's export error."""
from __future__ import annotations

from pathlib import Path

from conftest import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "coverage"


def test_unsupported_nodes_exit_1_with_table_and_json(tmp_path):
    r = run_cli("coverage", FIXTURES / "low_precision.onnx", "--json", tmp_path / "c.json")
    assert r.exit_status == 1, r.stderr
    assert r.stdout.splitlines()[-1].startswith("BLOCKED")
    table = {line.split()[2]: line.split()[0] for line in r.stdout.splitlines() if line.startswith("unsupported")}
    assert set(table) == {"Mul", "Trilu", "Relu"}
    assert r.json["summary"] == {"unsupported": 3, "falls back": 2, "needs newer opset": 0, "risky": 1, "ok": 2}
    nodes = {n["name"]: n for n in r.json["nodes"]}
    assert nodes["trilu_int8"]["kernels"]["CPUExecutionProvider"]["verdict"] == "no kernel for these types"
    assert nodes["matmul_fp16"]["status"] == "falls back" and nodes["matmul_fp16"]["confirmed"] is True
    assert sorted(r.json["placement"]["refused"]) == ["mul_bf16", "relu_int16", "trilu_int8"]


def test_provider_without_registry_in_this_build_is_reported_not_guessed(tmp_path):
    r = run_cli("coverage", FIXTURES / "new_ops.onnx", "--provider", "CUDAExecutionProvider",
                "--provider", "CPUExecutionProvider", "--opset", "13", "--json", tmp_path / "c.json")
    assert r.exit_status == 0, r.stderr
    assert "CUDAExecutionProvider (registry not available in this build" in r.stdout
    cuda = next(p for p in r.json["providers"] if p["name"] == "CUDAExecutionProvider")
    assert cuda["state"] == "registry not available in this build"
    assert r.json["summary"]["unsupported"] == r.json["summary"]["falls back"] == 0
    statuses = {g["op_type"]: g["status"] for g in r.json["groups"]}
    assert statuses == {"LayerNormalization": "needs newer opset", "Gelu": "needs newer opset",
                        "ReduceMean": "needs newer opset", "Sigmoid": "ok"}


def test_fallback_to_cpu_is_read_from_a_session(tmp_path):
    # AzureExecutionProvider is in this build but has no kernels: the session puts every node on the CPU fallback
    r = run_cli("coverage", FIXTURES / "new_ops.onnx", "--provider", "AzureExecutionProvider", "--all",
                "--json", tmp_path / "c.json")
    assert r.exit_status == 0, r.stderr
    rows = {line.split()[2]: line.split()[0] for line in r.stdout.splitlines() if line.startswith("falls back")}
    assert set(rows) == {"layernorm", "gelu", "reducemean", "sigmoid"}
    assert all(n["runs_on"] == "CPUExecutionProvider" and n["confirmed"] for n in r.json["nodes"])


def test_bad_input_is_one_paragraph_and_exit_2(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    for argv in (["coverage", tmp_path / "missing.onnx"], ["coverage", broken],
                 ["coverage", FIXTURES / "new_ops.onnx", "--provider", "CUDAExecutionProviderr"],
                 ["coverage", tmp_path / "model.txt"]):
        r = run_cli(*argv)
        assert r.exit_status == 2, (argv, r.stdout, r.stderr)
        assert r.stderr.startswith("onnx-bisect: error: ") and "Traceback" not in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
    assert "neither a .py model nor an .onnx file" in r.stderr


def test_main_job_export_failure_shows_the_triage():
    r = run_cli(FIXTURES / "no_lowering.py")
    assert r.exit_status == 2 and "Traceback" not in r.stderr
    assert "aten::linalg_eigvals at " in r.stderr and "no_lowering.py:12" in r.stderr
    assert "aten.linalg_eig" in r.stderr
