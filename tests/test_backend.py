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
