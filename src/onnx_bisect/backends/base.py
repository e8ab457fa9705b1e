"""The backend contract: run this ONNX model on these feeds, return these tensors."""
from __future__ import annotations

from typing import Mapping, Protocol, Sequence

import numpy as np
import onnx

from ..weights import Weights


class Backend(Protocol):
    """Something that executes ONNX models."""

    name: str

    def run(
        self,
        model: onnx.ModelProto | str,
        feeds: Mapping[str, np.ndarray],
        outputs: Sequence[str] | None = None,
        weights: Weights | None = None,
        one_shot: bool = False,
        optimize: bool = True,
    ) -> dict[str, np.ndarray]:
        """Run ``model`` (a proto, or a file path) once; return outputs by name.

        ``weights`` supplies the data of initializers split off by
        ``weights.split_weights``; ``outputs=None`` means all graph outputs.
        ``one_shot`` marks an instrumented graph that runs once: the backend may
        skip work that only pays off over many runs.  The user's graph is never
        run one-shot, so its numbers are exactly what the user would get.
        ``optimize=False`` turns the backend's graph optimizations off.
        """
        ...
