"""Backends run an ONNX model and return the requested tensors."""
from .base import Backend
from .onnxruntime import OnnxRuntimeBackend

__all__ = ["Backend", "OnnxRuntimeBackend", "make_backend"]


def make_backend(provider: str = "CPUExecutionProvider", session_config=None, opt_level: str = "all") -> Backend:
    """The backend for an execution provider name (ONNX Runtime for now) with session settings."""
    return OnnxRuntimeBackend(provider, session_config, opt_level)
