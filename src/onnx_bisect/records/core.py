"""Typed records passed between the pipeline stages.

Stages never import each other; they share only these types.  Everything is
immutable so a record can be handed on without defensive copies.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .rows import in_order

__all__ = ['TextEnum', 'Cause', 'ModuleKind', 'Absence', 'Layout', 'ExitStatus', 'Exporter', 'MatchMethod', 'Status', 'Reproduction', 'ErrorOrigin', 'Tolerance', 'Activation', 'Capture', 'LoadedModel', 'ModelInputs', 'ExportedModel', 'TensorPair', 'TensorDiff', 'LayerResult', 'OutputResult', 'Amplification', 'Divergence', 'FaithfulLocation', 'Report']


class TextEnum(str, enum.Enum):
    """An Enum whose members are their text (for tables and JSON) and compare equal to it."""

    def __str__(self) -> str:
        return self.value

    __format__ = str.__format__


class ModuleKind(TextEnum):
    """What a module computes, told by its class's ancestry (``isinstance``), not its name: timm's
    ``BatchNormAct2d`` is a BatchNorm, ``StdConv2d`` and ``Conv2dSame`` are convolutions."""

    CONV = "conv"  # torch.nn.Conv1d/2d/3d and their subclasses (not transposed convolutions)
    CONV_TRANSPOSE = "conv-transpose"  # torch.nn.ConvTranspose1d/2d/3d and their subclasses
    LINEAR = "linear"  # torch.nn.Linear and its subclasses
    BATCHNORM = "batchnorm"  # torch.nn.BatchNorm1d/2d/3d, SyncBatchNorm and their subclasses
    OTHER = "other"

    @property
    def folds_batchnorm(self) -> bool:
        """Whether a following BatchNorm can be folded into this module's weight."""
        return self in (ModuleKind.CONV, ModuleKind.CONV_TRANSPOSE, ModuleKind.LINEAR)


class Cause(TextEnum):
    """What made a segment diverge: the diagnosis rules' causes, shared with the coverage triage's risk tags."""

    GELU_APPROXIMATION = "gelu-approximation"
    BATCHNORM_FOLD = "batchnorm-fold"
    EPSILON_MISMATCH = "epsilon-mismatch"
    WEIGHT_MISMATCH = "weight-mismatch"
    ATTRIBUTE_MISMATCH = "attribute-mismatch"
    RESIZE_MODE = "resize-mode"
    PRECISION = "precision"
    QUANTIZATION = "quantization"
    TRAINING_MODE = "training-mode"
    RUNTIME_OPTIMIZATION = "runtime-optimization"
    DTYPE = "dtype"
    BAKED_SHAPE = "baked-shape"
    NUMERICAL_STABILITY = "numerical-stability"
    BATCH_MIXING = "batch-mixing"
    UNKNOWN = "unknown"  # no rule found a confident cause


class Absence(TextEnum):
    """Why an activation has no ONNX tensor at all (not an alignment failure: nothing computes it)."""

    NO_SCOPE = "no-scope"  # no node carries the module's scope: pruned as unused or folded into a constant
    FOLDED_CONSTANT = "folded-constant"  # its value is an initializer (computed once when the file was made)
    UNUSED_OUTPUT = "unused-output"  # the model's outputs never use it; the exporter pruned what computes it


class Layout(TextEnum):
    """How a tensor's elements are laid out relative to another's of the same size."""

    SAME = "same"
    TRANSPOSED = "transposed"  # a 2-d matrix transposed
    RESHAPED = "reshaped"  # the same elements in another shape

    def apply(self, value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """``value`` laid out this way to fit ``shape``."""
        return value.T if self is Layout.TRANSPOSED else value.reshape(shape)


class ExitStatus(enum.IntEnum):
    """Process exit status of the command line."""

    OK = 0
    DIVERGED = 1
    USAGE = 2  # a problem with the input or usage (the message names it and the fix)
    FAILURE = 3  # an exporter or ONNX Runtime failed on input that is fine, or a bug: not the user's fault
    INTERRUPTED = 130  # Ctrl-C
    TERMINATED = 143  # SIGTERM


class Exporter(enum.Enum):
    """Which ``torch.onnx.export`` path produced the ONNX model."""

    DYNAMO = "dynamo"
    TORCHSCRIPT = "torchscript"
    GIVEN = "given"  # the user passed --onnx


class MatchMethod(enum.Enum):
    """How a PyTorch activation was paired with an ONNX tensor."""

    METADATA = "metadata"  # dynamo exporter's pkg.torch.onnx.name_scopes
    SCOPE_NAME = "scope-name"  # TorchScript-style /scope/Op node names
    STRUCTURE = "structure"  # shape + topological order, confirmed by value
    IDENTITY = "identity"  # module returns its input unchanged (Dropout in eval)
    FUSED = "fused"  # computed by a node that also computes its neighbour
    GRAPH_OUTPUT = "graph-output"  # a model output matched to a graph output
    NAME = "name"  # the tensor of the same name in a reference ONNX model (--reference)
    OP = "op"  # an exported-program op paired with the ONNX value named after its FX node
    OP_VALUE = "op-value"  # an ATen op PyTorch ran, paired by value inside a divergent segment, confirmed by re-running
    NONE = "none"


class Status(enum.Enum):
    """Verdict on one aligned layer."""

    MATCHED = "matched"
    DIVERGED = "diverged"
    FUSED = "fused"
    UNMATCHED = "unmatched"
    QUANTIZED = "quantized"  # beyond tolerance by its quantization alone: re-run without its Q/DQ it agrees
    REORDERED = "reordered"  # beyond tolerance only by the order of its rows: PyTorch's rows, permuted by a sort /
    # TopK in its segment that breaks ties among equal keys another way — not a fault
    CONDITIONED = "conditioned"  # beyond tolerance, but rounding: as close to a float64 run as PyTorch's float32
    # value (in a float16 file: as close to PyTorch's float32 value as a float16 PyTorch run)


class Reproduction(enum.Enum):
    """Whether the instrumented run (tensors exposed as outputs) computes the shipped outputs."""

    EXACT = "bit-exact"  # every output equal bit for bit to the unmodified model's
    WITHIN_TOLERANCE = "within-tolerance"  # not bit for bit, but allclose to the unmodified model's
    DIFFERENT = "different"  # exposing tensors changed what ONNX Runtime computes


class ErrorOrigin(enum.Enum):
    """Whether a layer's error beyond tolerance is its own or comes from upstream."""

    NONE = "none"
    INTRODUCED = "introduced"
    INHERITED = "inherited"


@dataclass(frozen=True)
class Tolerance:
    """numpy ``allclose`` tolerance: ``|a - b| <= atol + rtol * |b|``."""

    atol: float = 1e-4
    rtol: float = 1e-3


@dataclass(frozen=True)
class Activation:
    """One tensor output of one call of one PyTorch module."""

    index: int  # position in capture order
    module: str  # qualified module name, "" for the root model
    module_type: str  # class name, e.g. "Linear"
    call: int  # 0 for the first call of this module, 1 for the second ...
    path: str  # position inside a nested output, "" or e.g. "[0]" / "[logits]"
    value: np.ndarray = field(repr=False, compare=False)
    is_leaf: bool = True
    inputs: tuple[int, ...] = ()  # indices of activations this call consumed
    passthrough: bool = False  # output is (value-)identical to one of its inputs
    op: str = ""  # an op (the exported program's FX node name, or a captured ATen op) rather than a module output
    args: tuple = field(default=(), compare=False)  # an op's non-tensor arguments: (position or name, value)
    kind: ModuleKind = ModuleKind.OTHER  # the module's kind (isinstance), for module outputs
    bias: np.ndarray | None = field(default=None, repr=False, compare=False)  # a Linear's / Conv's bias parameter
    params: tuple[str, ...] = field(default=(), compare=False)  # an op's: the model parameters it read

    @property
    def name(self) -> str:
        """Display name: module path, call number when called again, output path."""
        base = self.module or "<model>"
        if self.call:
            base += f"#{self.call + 1}"
        return base + self.path


@dataclass(frozen=True)
class Capture:
    """Everything the PyTorch reference run produced."""

    activations: tuple[Activation, ...]
    outputs: tuple[np.ndarray, ...]  # flattened model outputs, exporter order
    output_names: tuple[str, ...]
    #: every other name a module is registered under -> the one its calls are recorded under (a block shared by
    #: several steps: the dynamo exporter scopes each call by the name it was reached through, TorchScript by the first)
    aliases: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadedModel:
    """A PyTorch model ready to run, plus what we learnt while loading it."""

    module: Any  # torch.nn.Module (kept untyped so records import no torch)
    name: str
    source: str
    was_training: bool
    forward_params: tuple[str, ...]


@dataclass(frozen=True)
class ModelInputs:
    """Positional and keyword arguments of the forward pass, as tensors."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    names: tuple[str, ...] = ()  # forward parameter name of each positional arg


@dataclass(frozen=True)
class ExportedModel:
    """An ONNX model to debug and where it came from."""

    proto: Any = field(repr=False)  # onnx.ModelProto
    exporter: Exporter
    opset: int
    path: str | None = None  # the user's file when --onnx was given
    notes: tuple[str, ...] = ()
    weights: Any = field(default=None, repr=False)  # weights.Weights when proto is already split
    program: Any = field(default=None, repr=False)  # the torch.export ExportedProgram (dynamo exports)
    file: str | None = None  # the .onnx file the skeleton and weights were read from (own exports: in a private folder)


@dataclass(frozen=True)
class TensorPair:
    """A PyTorch activation and the ONNX tensor that computes the same value."""

    activation: Activation
    tensor: str | None
    node: str | None
    op_type: str | None
    method: MatchMethod
    confidence: float = 1.0
    note: str = ""
    perm: tuple[int, ...] | None = None  # the ONNX tensor holds value.transpose(perm), possibly reshaped
    absent: Absence | None = None  # set when no tensor can exist (``note`` says more)
    rows: tuple[int, ...] | None = None  # the ONNX tensor holds the value's rows in this order (after a sort that
    # breaks ties another way: records.rows.row_order)

    def reference(self) -> np.ndarray:
        """The PyTorch value laid out as the ONNX tensor holds it (up to a reshape)."""
        value = self.activation.value
        value = value if self.perm is None else value.transpose(self.perm)
        if self.rows is not None:
            value = in_order(value, self.rows)
        return value

    @property
    def cuttable(self) -> bool:
        """Whether downstream nodes may be fed this pair's reference value."""
        return self.tensor is not None and self.confidence >= 0.9 and self.method not in (
            MatchMethod.IDENTITY,
        )


@dataclass(frozen=True)
class TensorDiff:
    """How far an ONNX tensor is from its PyTorch reference."""

    max_abs: float
    max_rel: float
    mean_abs: float
    cosine: float
    tol_ratio: float  # max |a-b| / (atol + rtol|b|); > 1 means not allclose
    ok: bool
    shape: tuple[int, ...]
    nonfinite: int = 0  # elements that are NaN/inf in ONNX but finite in PyTorch
    sqnr_db: float = float("inf")  # 10·log10(Σ ref² / Σ (onnx − ref)²)
    dtype: str = ""  # the ONNX tensor's dtype
    ulps: float | None = None  # for float16: max error in units of the dtype's resolution at |ref|
    actual_shape: tuple[int, ...] | None = None  # the ONNX shape, when its size differs from ``shape``


@dataclass(frozen=True)
class LayerResult:
    """One row of the report: an aligned (or unaligned) activation."""

    pair: TensorPair
    diff: TensorDiff | None  # accumulated: full ONNX run vs PyTorch
    local: TensorDiff | None  # the segment alone, fed PyTorch values
    status: Status
    origin: ErrorOrigin
    segment: tuple[str, ...] = ()  # ONNX nodes computing this tensor from cut points
    segment_ops: tuple[str, ...] = ()
    order: float = 0.0  # position in graph order


@dataclass(frozen=True)
class OutputResult:
    """A final model output as the unmodified ONNX model produced it."""

    name: str
    diff: TensorDiff
    conditioned: bool = False  # beyond tolerance, but as close to a float64 run as PyTorch's float32 output

    @property
    def agrees(self) -> bool:
        """Within the tolerance, or as close to the float64 truth as PyTorch's float32 (see ``conditioned``)."""
        return self.diff.ok or self.conditioned


@dataclass(frozen=True)
class Amplification:
    """How an error below the tolerance was traced to the segment that introduces it: the outputs diverge,
    no segment's own error exceeds the tolerance, and the layers after this segment amplify its error.

    Bisection over the cut points in graph order: with every cut before this segment fed the PyTorch value
    and everything from it on computing freely, the outputs still diverge (``output_ratio``); with this
    segment cut too, they do not (``output_ratio_without``). Ratios are in units of the tolerance.
    """

    tensor: str  # the ONNX tensor the segment computes
    local_ratio: float  # the segment's own error
    output_ratio: float  # the outputs' worst error with this segment computing from exact inputs, the rest free
    output_ratio_without: float  # ... with this segment cut as well
    output_ratio_all: float  # nothing cut
    runs: int  # ONNX Runtime runs the bisection took
    cut_points: int  # the cut points it searched

    @property
    def gain(self) -> float:
        """How much the layers after the segment amplify its own error."""
        return self.output_ratio / self.local_ratio if self.local_ratio > 0 else float("inf")


@dataclass(frozen=True)
class Divergence:
    """The first segment whose error exceeds tolerance, and what we know about it."""

    layer: LayerResult
    introduced: bool  # True: the segment's local error exceeds tolerance
    cause: Cause  # Cause.UNKNOWN when no rule matched
    explanation: str
    confidence: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)  # numbers supporting the cause
    fix: str = ""
    confirmed: bool | None = None  # re-run with the fix applied: True/False; None = not attempted
    within: LayerResult | None = None  # the module-level layer whose segment this op-level one was narrowed from
    amplification: Amplification | None = None  # set when the error is below tolerance locally, amplified later
    fixed_nodes: tuple[str, ...] = ()  # the nodes the (confirmed) fix changes, when it names a few


@dataclass(frozen=True)
class FaithfulLocation:
    """The first divergence located with exposures that leave the shipped outputs unchanged.

    Used when exposing every aligned tensor changes what ONNX Runtime computes
    (an optimizer fusion is blocked): only a few tensors are exposed per run, and
    a run counts only when its outputs reproduce the unmodified model's.
    """

    last_good: str | None  # the latest faithfully observed tensor within tolerance (None: the graph inputs)
    first_bad: str  # the earliest faithfully observed tensor beyond tolerance
    runs: int  # ONNX Runtime sessions it took
    unobservable: tuple[str, ...] = ()  # tensors whose exposure changed the outputs (inside a fusion)
    boundaries_faithful: bool = False  # whether exposing the coarse module boundaries kept the outputs


@dataclass(frozen=True)
class Report:
    """The complete result of one bisection."""

    ok: bool
    tolerance: Tolerance
    exporter: Exporter
    opset: int
    provider: str
    outputs: tuple[OutputResult, ...]
    first_divergence: Divergence | None
    layers: tuple[LayerResult, ...]
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)  # the process's peak RSS (MiB) at the end of each step
    model_name: str = ""
    reproduction: Reproduction = Reproduction.EXACT
    reproduction_max_abs: float = 0.0  # largest |instrumented - unmodified| over the outputs
    faithful: FaithfulLocation | None = None
    reference: str = "PyTorch"  # what the ONNX model was compared with ("PyTorch", or the reference ONNX file)
    graph_name: str = ""  # the ONNX graph's name (Model Explorer's graph id)
    #: the first divergence's segment, standalone (a ``Repro``): kept only when asked (``--extract``, or the
    #: Python API's ``extractable``), so that nothing more is computed or held otherwise
    repro: Any = field(default=None, repr=False, compare=False)

    @property
    def exit_status(self) -> ExitStatus:
        """0 when the final outputs agree, 1 otherwise."""
        return ExitStatus.OK if self.ok else ExitStatus.DIVERGED

    def to_html(self) -> str:
        """The report as one self-contained HTML page (see ``onnx_bisect.report.html``)."""
        from ..report.html import render_html

        return render_html(self)

    def extract(self, folder: str):
        """Write the first divergent segment as a standalone repro into ``folder`` (created; an existing one must
        be empty) and run it: returns the ``Extraction`` (see ``onnx_bisect.pipeline.extract``)."""
        from ..pipeline.extract import extract

        return extract(self, folder)
