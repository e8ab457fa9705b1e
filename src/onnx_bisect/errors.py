"""Typed errors, one per stage.  Each message says what went wrong and what to do next.

``exit_status`` tells the command line how to end: 2 when the user's input or
usage must change, 3 when a tool or runtime failed on input that is fine (the
message then says what to report, and ``--debug`` shows the traceback).
"""
from __future__ import annotations

#: exit status of a problem with the user's input or usage
BAD_INPUT = 2
#: exit status of a failure that is not the user's input's fault (an exporter or ONNX Runtime crashing, a bug)
FAILURE = 3


class BisectError(Exception):
    """Base class: a problem reported in one paragraph, without a traceback."""

    exit_status: int = BAD_INPUT


class UsageError(BisectError):
    """Bad command-line usage or configuration."""


class ModelLoadError(BisectError):
    """The model file is missing, does not import, or defines no usable model."""


class InputError(BisectError):
    """An input file is missing or does not fit the model's forward signature."""


class ExportError(BisectError):
    """torch.onnx.export failed with every exporter that was tried.

    ``failures`` holds ``(Exporter, exception)`` per exporter tried; the status
    is 2 when the failure is one the user can act on (an operator without a
    lowering, data-dependent control flow, a Python op), 3 when an exporter
    crashed on a model it should export.
    """

    def __init__(self, message: str, failures=(), exit_status: int = BAD_INPUT):
        super().__init__(message)
        self.failures = tuple(failures)
        self.exit_status = exit_status


class OnnxLoadError(BisectError):
    """The ONNX file does not load, does not validate, or does not fit the inputs."""


class BackendError(BisectError):
    """The ONNX backend could not create a session or run the model."""


class RuntimeFailure(BackendError):
    """ONNX Runtime failed on a graph onnx-bisect derived from a model that runs (tensors exposed, graph cut):
    not a problem with the user's model."""

    exit_status = FAILURE
