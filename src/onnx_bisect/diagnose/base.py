"""What a diagnosis rule sees and what it returns.

A rule is a small class with a ``cause`` slug and one ``match(ctx)`` method
returning a :class:`Finding` or None.  The runner in ``__init__`` evaluates all
rules on the first divergence, confirms the best finding by re-running the
segment with the rule's counterfactual applied, and turns it into the report's
``Divergence``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np
import onnx

from ..graph import GraphIndex, NodeInfo
from ..records import Capture, ExportedModel, LayerResult, LoadedModel, TensorDiff, Tolerance
from ..weights import Weights

#: re-run the cut graph (each segment fed PyTorch values) on a modified model;
#: returns the local values of the cut tensors.  ``optimize=False`` disables
#: the backend's graph optimizations for that run.
LocalRun = Callable[..., Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class DiagnosisContext:
    """Everything known about the first divergence."""

    layer: LayerResult
    introduced: bool
    layers: tuple[LayerResult, ...]
    graph: GraphIndex
    skeleton: onnx.ModelProto  # the ONNX graph, shape-inferred, large weights split off
    weights: Weights
    loaded: LoadedModel  # loaded.module is the PyTorch model
    exported: ExportedModel
    capture: Capture
    references: Mapping[str, np.ndarray]  # PyTorch value of every cut tensor, in the ONNX dtype
    feeds: Mapping[str, np.ndarray]
    tolerance: Tolerance
    local_run: LocalRun
    compare: Callable[[np.ndarray, np.ndarray], TensorDiff]

    @property
    def segment_nodes(self) -> list[NodeInfo]:
        """The ONNX nodes of the divergent segment, in graph order."""
        names = set(self.layer.segment)
        return [n for n in self.graph.nodes if n.name in names]

    def initializer(self, name: str) -> np.ndarray | None:
        """An initializer's value, wherever it is stored (None if it is not one)."""
        if name in self.weights.arrays:
            return self.weights.arrays[name]
        for init in self.skeleton.graph.initializer:
            if init.name == name and init.data_location != onnx.TensorProto.EXTERNAL:
                return onnx.numpy_helper.to_array(init)
        return None

    def torch_module(self, qualname: str | None = None):
        """The PyTorch module of the divergent layer (or of ``qualname``)."""
        name = self.layer.pair.activation.module if qualname is None else qualname
        return dict(self.loaded.module.named_modules()).get(name)


Counterfactual = Callable[[DiagnosisContext], "tuple[onnx.ModelProto, Weights]"]


@dataclass(frozen=True)
class Finding:
    """A rule's claim about the cause, with the numbers behind it."""

    cause: str
    confidence: float  # 0..1
    summary: str  # one or two sentences in plain words
    fix: str
    evidence: dict[str, Any] = field(default_factory=dict)
    counterfactual: Counterfactual | None = field(default=None, compare=False, repr=False)


class Rule:
    """Base class of a diagnosis rule: one known cause per subclass."""

    cause: str = "unknown"

    def match(self, ctx: DiagnosisContext) -> Finding | None:  # pragma: no cover - interface
        """Return a finding when this cause explains the divergence, else None."""
        raise NotImplementedError
