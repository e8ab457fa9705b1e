"""What a run is asked to do: the command line's choices as a typed record, and the policy of one input case."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..records import Divergence, Exporter, OptLevel, RuntimeSettings, TensorPair, Tolerance


@dataclass(frozen=True)
class Config:
    """Everything one run needs to know, independent of the command line.

    Several providers or optimization levels, session-entry variants, axes, a
    dataset or edge cases ask for a verification over several configurations
    (see :mod:`onnx_bisect.pipeline.verify`); ``is_matrix`` tells.
    """

    model: str
    inputs: tuple[str, ...] = ()
    onnx: str | None = None
    exporter: Exporter | None = None
    opset: int | None = None
    tolerance: Tolerance = field(default_factory=Tolerance)
    save_onnx: str | None = None
    ort_config: tuple[tuple[str, str], ...] = ()  # ONNX Runtime session config entries
    providers: tuple[str, ...] = ("CPUExecutionProvider",)  # "NAME[:key=value,...]"; several: a matrix
    opt_levels: tuple[OptLevel, ...] = (OptLevel.ALL,)  # ONNX Runtime graph optimization levels; several: a matrix
    ort_variants: tuple[tuple[tuple[str, str], ...], ...] = ()  # extra session-entry sets to compare
    axes: tuple[Any, ...] = ()  # specs.AxisSpec: batch sizes, other dynamic dimensions
    dataset: str | None = None
    edge_cases: bool = False
    reference: str | None = None  # another ONNX model as the reference (``model`` is then an ONNX file)
    keep_repro: bool = False  # keep the first divergence's segment standalone (``--extract``)
    low_memory: bool | None = None  # one framework in memory at a time; None: automatic (see pipeline.memory)
    window_mb: float | None = None  # expose intermediate tensors in windows of at most this many MiB

    @property
    def is_matrix(self) -> bool:
        """Whether this asks for more than one configuration."""
        return bool(self.axes or self.dataset or self.edge_cases or self.ort_variants
                    or len(self.providers) > 1 or len(self.opt_levels) > 1)

    @property
    def runtime(self) -> RuntimeSettings:
        """The runtime setting of a single bisection."""
        from .specs import parse_provider

        name, options = parse_provider(self.providers[0])
        return RuntimeSettings(name, options, self.opt_levels[0], self.ort_config)


class DiagnosisMemo:
    """Diagnoses by (tensor, introduced) across the cases of one runtime setting: a dataset whose samples all
    diverge at one node is diagnosed once, on the first of them."""

    def __init__(self):
        self._found: dict[tuple[str, bool], Divergence] = {}

    def get(self, tensor: str, introduced: bool) -> Divergence | None:
        """The diagnosis an earlier case made at ``tensor``, if any."""
        return self._found.get((tensor, introduced))

    def keep(self, divergence: Divergence) -> None:
        """Remember ``divergence`` for later cases."""
        self._found[(divergence.layer.pair.tensor, divergence.introduced)] = divergence

    def read_only(self) -> DiagnosisMemo:
        """A view that answers from this memo but keeps nothing (for an explanation that may be discarded)."""
        view = _ReadOnlyMemo()
        view._found = self._found
        return view


class _ReadOnlyMemo(DiagnosisMemo):
    def keep(self, divergence: Divergence) -> None:
        """Keeps nothing: see :meth:`DiagnosisMemo.read_only`."""


@dataclass(frozen=True)
class CasePolicy:
    """How much of one input case to run.

    ``template`` reuses the alignment of an earlier case (it is a property of
    the model and the graph, not of the inputs: value matching on zeros would be
    meaningless).  ``thorough=False`` skips the local run when the final outputs
    agree and keeps only each layer's verdict, max abs and tolerance ratio (a
    verification of many cases needs the rest only where something diverges).
    ``memo`` shares diagnoses across the cases of one runtime setting.
    ``keep_repro`` builds the first divergence's standalone repro (only when asked: it costs a re-match of the
    confirmed rule and holds one segment's inputs and weights).
    """

    tolerance: Tolerance = field(default_factory=Tolerance)
    template: tuple[TensorPair, ...] | None = None
    thorough: bool = True
    memo: DiagnosisMemo | None = field(default=None, compare=False)
    keep_repro: bool = False  # cut the first divergence's segment out as a standalone repro (``Report.repro``)
