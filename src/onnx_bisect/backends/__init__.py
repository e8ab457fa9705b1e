"""Backends run an ONNX model and return the requested tensors."""
from .base import Backend
from .onnxruntime import OnnxRuntimeBackend

__all__ = ["Backend", "OnnxRuntimeBackend", "make_backend"]


def make_backend(provider: str = "CPUExecutionProvider") -> Backend:
    """The backend for an execution provider name (ONNX Runtime for now)."""
    return OnnxRuntimeBackend(provider)
