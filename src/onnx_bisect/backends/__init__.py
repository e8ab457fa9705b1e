"""Backends run an ONNX model and return the requested tensors."""
from .base import Backend, Session
from .onnxruntime import OnnxRuntimeBackend, available_providers

__all__ = ["Backend", "Session", "OnnxRuntimeBackend", "available_providers", "make_backend"]


def make_backend(settings=None) -> Backend:
    """The backend for a :class:`~onnx_bisect.records.RuntimeSettings` (ONNX Runtime for now)."""
    return OnnxRuntimeBackend(settings)
