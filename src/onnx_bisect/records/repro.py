"""Records of a standalone repro: the first divergence's segment cut out of the graph, ready to be written
(``--extract``) and run on its own."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .core import TensorDiff, Tolerance
from .matrix import RuntimeSettings
from .weights import Weights

__all__ = ["StandaloneSegment", "Repro", "Extraction"]


@dataclass(frozen=True)
class StandaloneSegment:
    """ONNX nodes cut out of a graph as a model of their own: typed inputs at the cut tensors (or graph
    inputs), one output, the values to feed and the value it must compute."""

    model: Any = field(repr=False)  # onnx.ModelProto; the data of its large initializers is in ``weights``
    weights: Weights = field(repr=False)
    inputs: dict[str, np.ndarray] = field(repr=False)  # by graph-input name
    output: str
    expected: np.ndarray = field(repr=False)  # PyTorch's value of ``output``, in the ONNX layout
    optimize: bool = True  # False: run with the runtime's graph optimizations off (the fix is a setting)


@dataclass(frozen=True)
class Repro:
    """What ``--extract`` writes: the segment the report blames (the narrowed op's region when the divergence
    was narrowed), its error as the report states it, and the diagnosis' confirmed fix applied to it."""

    segment: StandaloneSegment
    error: TensorDiff  # the report's figure: the local error when introduced, else the accumulated one
    introduced: bool
    runtime: RuntimeSettings
    tolerance: Tolerance
    fixed: StandaloneSegment | None = None
    fix: str = ""  # the cause's slug and fix, for the repro script's header
    half_resolution: bool = False  # the output holds float16 data in float32 (judged at float16 resolution)
    low_precision: bool = False  # the output is computed at half precision: its float noise is float16's
    random_ops: tuple[str, ...] = ()  # nodes drawing random numbers (seeded in the repro; the report's run was not)


@dataclass(frozen=True)
class Extraction:
    """A written repro folder and what running it gave: whether the standalone segment reproduces the report's
    error (within 1 % or float noise) and whether the fixed segment passes."""

    folder: str
    files: tuple[str, ...]
    stated: TensorDiff  # the error the report states
    measured: TensorDiff  # the written segment, loaded from the folder and run
    reproduces: bool
    nodes: tuple[str, ...]
    inputs: tuple[str, ...]
    output: str
    fixed: TensorDiff | None = None  # fixed.onnx, loaded from the folder and run
    external_data: bool = False
    random_ops: tuple[str, ...] = ()  # random nodes: the error differs from run to run; reproduced is the verdict

    @property
    def fixed_passes(self) -> bool | None:
        """Whether ``fixed.onnx`` agrees with PyTorch (None when no fix was written)."""
        return None if self.fixed is None else self.fixed.ok
