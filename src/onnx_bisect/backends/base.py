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
    ) -> dict[str, np.ndarray]:
        """Run ``model`` (a proto, or a file path) once; return outputs by name.

        ``weights`` supplies the data of initializers split off by
        ``weights.split_weights``; ``outputs=None`` means all graph outputs.
        """
        ...
