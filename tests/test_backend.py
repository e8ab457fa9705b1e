"""ONNX Runtime backend: load errors say what failed and what to do."""
from __future__ import annotations

import onnxruntime as ort
import pytest

from conftest import tiny_onnx
from onnx_bisect.run.onnxruntime import OnnxRuntimeBackend
from onnx_bisect.errors import BackendError
from onnx_bisect.records import RuntimeSettings


def _loadable():
    """The tiny model at an IR version this onnxruntime reads (the pipeline's export stage does the same)."""
    model = tiny_onnx()
    model.ir_version = 8
    return model


def _failing_when_optimized(real):
    """An InferenceSession that fails as ONNX Runtime's optimizer does on some files (any level but off)."""
    def make(source, options, providers=None):
        if options.graph_optimization_level != ort.GraphOptimizationLevel.ORT_DISABLE_ALL:
            raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Attempt to replace the existing tensor")
        return real(source, options, providers=providers)
    return make


def test_a_model_only_the_optimizer_fails_on_is_named_so(monkeypatch):
    monkeypatch.setattr(ort, "InferenceSession", _failing_when_optimized(ort.InferenceSession))
    with pytest.raises(BackendError) as err:
        OnnxRuntimeBackend(RuntimeSettings(opt_level="all")).load(_loadable())
    message = str(err.value)
    assert "Attempt to replace the existing tensor" in message
    assert "It loads with graph optimizations off" in message and "--ort-opt-level disable" in message
    assert OnnxRuntimeBackend(RuntimeSettings(opt_level="disable")).load(_loadable()) is not None


def test_a_model_that_fails_either_way_gets_the_general_advice(monkeypatch):
    def broken(source, options, providers=None):
        raise RuntimeError("[ONNXRuntimeError] : 10 : INVALID_GRAPH : broken")
    monkeypatch.setattr(ort, "InferenceSession", broken)
    with pytest.raises(BackendError) as err:
        OnnxRuntimeBackend(RuntimeSettings(opt_level="all")).load(_loadable())
    assert "It loads with graph optimizations off" not in str(err.value)
    assert "Check the model's opset" in str(err.value)


_CRASHING = r'''
import sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx_bisect.run.onnxruntime import OnnxRuntimeBackend, crashes_at_all

x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 13, 16])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)
w = numpy_helper.from_array(np.ones((16, 48), np.float16), "w")
nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0, 2]), helper.make_node("MatMul", ["t", "w"], ["y"])]
model = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 18)])
model.ir_version = 8
assert crashes_at_all(model)
out = OnnxRuntimeBackend().run(model, {"x": np.ones((2, 13, 16), np.float16)})
print(out["y"].shape, float(out["y"][0, 0, 0]))
'''


def test_a_graph_onnx_runtime_crashes_on_at_level_all_runs_at_extended():
    """ONNX Runtime 1.31's CPU provider kills the process (a segmentation fault) creating a session at
    ORT_ENABLE_ALL for a float16 input → Transpose → MatMul — a graph onnx-bisect cuts out of a float16
    transformer. Run in a child process: the workaround failing would kill the test runner."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _CRASHING], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert proc.stdout.split() == ["(13,", "2,", "48)", "16.0"], proc.stdout


@pytest.mark.parametrize("value, threads", [("3", 3), ("", 0), ("0", 0), ("two", 0)])
def test_onnx_runtimes_pool_takes_the_thread_budget_omp_num_threads_gives(monkeypatch, value, threads):
    """PyTorch's forward honours OMP_NUM_THREADS; ONNX Runtime's pool is sized from it too (a machine shared by
    processes: test workers, a serving host), and keeps ONNX Runtime's default (0: one per core) otherwise."""
    seen = []
    real = ort.InferenceSession

    def recording(source, options, providers=None):
        seen.append(options.intra_op_num_threads)
        return real(source, options, providers=providers)

    monkeypatch.setenv("OMP_NUM_THREADS", value)
    monkeypatch.setattr(ort, "InferenceSession", recording)
    OnnxRuntimeBackend().load(_loadable())
    assert seen == [threads]
