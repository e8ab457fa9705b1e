"""Typed errors, one per stage.  Each message says what went wrong and what to do next."""
from __future__ import annotations


class BisectError(Exception):
    """Base class: a problem with the user's input, reported without a traceback."""


class UsageError(BisectError):
    """Bad command-line usage or configuration."""


class ModelLoadError(BisectError):
    """The model file is missing, does not import, or defines no usable model."""


class InputError(BisectError):
    """An input file is missing or does not fit the model's forward signature."""


class ExportError(BisectError):
    """torch.onnx.export failed with every exporter that was tried."""


class OnnxLoadError(BisectError):
    """The ONNX file does not load, does not validate, or does not fit the inputs."""


class BackendError(BisectError):
    """The ONNX backend could not create a session or run the model."""
