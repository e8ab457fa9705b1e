"""The backend contract: run this ONNX model on these feeds, return these tensors."""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np
import onnx

from ..records import RuntimeSettings
from ..records.weights import Weights


class Session(Protocol):
    """A model loaded once and run many times (one per configuration)."""

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        """Run once on ``feeds``; return ``outputs`` (all graph outputs when None) by name."""
        ...


class Backend(Protocol):
    """Something that executes ONNX models.

    ``name`` says which runtime and provider (for reports); ``settings`` are the
    runtime settings it runs every model under (the diagnosis reads them: a
    lossy session entry, the optimization level).
    """

    name: str
    settings: RuntimeSettings

    def load(
        self,
        model: onnx.ModelProto | str,
        weights: Weights | None = None,
        one_shot: bool = False,
        optimize: bool = True,
    ) -> Session:
        """Load ``model`` (a proto, or a file path) into a reusable session.

        ``weights`` supplies the data of initializers split off by
        ``weights.split_weights``.  ``one_shot`` marks an instrumented graph: the
        backend may skip work that only pays off over many runs; the user's graph
        is never loaded one-shot, so its numbers are exactly what the user gets.
        ``optimize=False`` turns the backend's graph optimizations off.
        """
        ...

    def own_ops(self) -> frozenset[tuple[str, str]]:
        """``(domain, op_type)`` of the ops this runtime defines beyond the onnx package's schemas (the preflight
        checks a file's other nodes with onnx.checker and notes these); empty when it defines none."""
        ...

    def run(
        self,
        model: onnx.ModelProto | str,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        weights: Weights | None = None,
        one_shot: bool = False,
        optimize: bool = True,
    ) -> dict[str, np.ndarray]:
        """``load`` then run once; return outputs by name (``outputs=None``: all graph outputs)."""
        ...


def make_backend(settings=None) -> Backend:
    """The backend for a :class:`~onnx_bisect.records.RuntimeSettings` (ONNX Runtime for now)."""
    from .onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend(settings)


def available_providers() -> list[str]:
    """Execution providers compiled into the installed onnxruntime."""
    import onnxruntime

    return list(onnxruntime.get_available_providers())
