"""Records of a verification over several configurations: input cases, runtime settings, the matrix."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..errors import UsageError
from .core import (Divergence, Exporter, ExitStatus, FaithfulLocation, ModelInputs, OutputResult, Reproduction, TextEnum,
                   Tolerance)

__all__ = ['OptLevel', 'CaseKind', 'InputCase', 'RuntimeSettings', 'ConfigStatus', 'LayerError', 'ConfigResult', 'LayerAggregate', 'ProviderAgreement', 'MatrixReport']


class OptLevel(TextEnum):
    """ONNX Runtime's graph optimization levels."""

    DISABLE = "disable"
    BASIC = "basic"
    EXTENDED = "extended"
    ALL = "all"

    @classmethod
    def parse(cls, value: "str | OptLevel") -> "OptLevel":
        """The level named ``value``; a UsageError listing the levels when there is none."""
        try:
            return cls(value)
        except ValueError:
            raise UsageError(f"Unknown optimization level '{value}'; use one of "
                             f"{', '.join(o.value for o in cls)}.") from None


class CaseKind(enum.Enum):
    """Where the inputs of a configuration come from."""

    SAMPLE = "sample"  # the given sample, as is
    SHAPE = "shape"  # the sample resized along dynamic axes (batch size, sequence length ...)
    DATASET = "dataset"  # one sample of a dataset
    EDGE = "edge"  # generated from the sample: zeros, large or tiny magnitudes, range extremes


@dataclass(frozen=True)
class InputCase:
    """One set of model inputs to verify, and how it was made."""

    label: str  # e.g. "batch=8", "sample 3", "edge:large"
    kind: CaseKind
    inputs: ModelInputs = field(repr=False, compare=False)
    sizes: tuple[tuple[str, int], ...] = ()  # (axis label, size) of a SHAPE case
    sample: int | None = None  # index of a DATASET case


@dataclass(frozen=True)
class RuntimeSettings:
    """How ONNX Runtime runs the model: provider, its options, optimization level, session entries."""

    provider: str = "CPUExecutionProvider"
    provider_options: tuple[tuple[str, str], ...] = ()
    opt_level: OptLevel = OptLevel.ALL
    session_config: tuple[tuple[str, str], ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "opt_level", OptLevel.parse(self.opt_level))

    @property
    def label(self) -> str:
        """Short name for tables: ``CPU/all``, ``CPU/all+optimization.enable_gelu_approximation=1``."""
        provider = self.provider.removesuffix("ExecutionProvider")
        options = "" if not self.provider_options else "(" + ",".join(f"{k}={v}" for k, v in self.provider_options) + ")"
        extra = "".join(f"+{k}={v}" for k, v in self.session_config)
        return f"{provider}{options}/{self.opt_level}{extra}"


class ConfigStatus(enum.Enum):
    """Outcome of one configuration."""

    OK = "ok"
    DIVERGED = "diverged"
    ERROR = "error"  # ONNX Runtime failed on these inputs (e.g. a shape baked into the graph)
    UNAVAILABLE = "unavailable"  # the execution provider is not in this onnxruntime build
    UNTESTABLE = "untestable"  # the ONNX file fixes a dimension the configuration changes


@dataclass(frozen=True)
class LayerError:
    """One layer's accumulated error in one configuration (numbers only, no arrays)."""

    name: str  # the activation's display name
    module_type: str
    tensor: str
    node: str | None
    max_abs: float
    tol_ratio: float
    ok: bool
    order: float


@dataclass(frozen=True)
class ConfigResult:
    """One cell of the verification matrix: one input case under one runtime setting."""

    case: InputCase
    runtime: RuntimeSettings
    status: ConfigStatus
    outputs: tuple[OutputResult, ...] = ()
    first_divergence: Divergence | None = None
    layer_errors: tuple[LayerError, ...] = ()
    reproduction: Reproduction | None = None
    faithful: FaithfulLocation | None = None
    message: str = ""  # why it errored, was unavailable or untestable
    seconds: float = 0.0

    @property
    def max_abs(self) -> float | None:
        """Largest max-abs error over the final outputs."""
        return max((o.diff.max_abs for o in self.outputs), default=None)


@dataclass(frozen=True)
class LayerAggregate:
    """A layer's accumulated error over every sample of a dataset, under one runtime setting."""

    runtime: str  # RuntimeSettings.label
    name: str
    module_type: str
    node: str | None
    worst_max_abs: float
    worst_sample: int
    p99_max_abs: float
    diverged_samples: int
    samples: int
    order: float


@dataclass(frozen=True)
class ProviderAgreement:
    """Two execution providers compared on one input case: final outputs and the first differing tensor."""

    case: str
    a: str  # runtime labels
    b: str
    max_abs: float  # over the final outputs
    ok: bool
    first_tensor: str | None = None  # earliest exposed tensor where they differ beyond tolerance
    first_node: str | None = None
    first_module: str | None = None


@dataclass(frozen=True)
class MatrixReport:
    """The configurations verified, each with its verdict, and what they have in common."""

    model_name: str
    exporter: Exporter
    opset: int
    tolerance: Tolerance
    results: tuple[ConfigResult, ...]
    dataset: tuple[LayerAggregate, ...] = ()  # per runtime setting and layer, over the dataset's samples
    agreements: tuple[ProviderAgreement, ...] = ()
    dynamic_axes: tuple[str, ...] = ()  # e.g. "input_ids[0]": dimensions the graph leaves free
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)  # the process's peak RSS (MiB) at the end of each step

    @property
    def ok(self) -> bool:
        """True when every tested configuration agrees (unavailable/untestable ones do not count)."""
        return all(r.status not in (ConfigStatus.DIVERGED, ConfigStatus.ERROR) for r in self.results)

    @property
    def tested(self) -> int:
        """How many configurations ran (agreed, diverged or failed in ONNX Runtime)."""
        return sum(1 for r in self.results if r.status in (ConfigStatus.OK, ConfigStatus.DIVERGED, ConfigStatus.ERROR))

    @property
    def exit_status(self) -> ExitStatus:
        """1 if any configuration diverges or fails to run; 2 if none could run at all; else 0."""
        if not self.tested:
            return ExitStatus.USAGE
        return ExitStatus.OK if self.ok else ExitStatus.DIVERGED

    def to_html(self) -> str:
        """The verification as one self-contained HTML page (see ``onnx_bisect.report.html``)."""
        from ..report.html import render_html

        return render_html(self)
