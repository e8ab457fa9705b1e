"""Typed records of the coverage triage.

The triage stages (export triage, inventory, validation, kernel matching,
placement, opset triage, risk rules) share only these types.  Everything is
immutable; statuses are Enums and become strings only at the JSON edge.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import Cause


class Status(enum.Enum):
    """What the triage concludes about one ONNX node, most severe first."""

    UNSUPPORTED = "unsupported"  # no requested provider (nor the CPU fallback) can run it
    FALLS_BACK = "falls back"  # runs, but not where asked: a later provider, or float32 via inserted Casts
    NEEDS_NEWER_OPSET = "needs newer opset"  # defined after the --opset target
    RISKY = "risky"  # runs, but its semantics commonly differ between frameworks
    OK = "ok"

    @property
    def rank(self) -> int:
        """0 for the most severe status."""
        return list(Status).index(self)


class KernelVerdict(enum.Enum):
    """Whether one execution provider can run one node, read from ONNX Runtime's kernel registry."""

    SUPPORTED = "kernel"
    EXPANDED = "expanded"  # no kernel, but the op has an ONNX function body that ONNX Runtime inlines
    FLOAT32_VIA_CAST = "float32 via Cast"  # CPU: no float16 kernel; ONNX Runtime inserts Casts to float32
    NO_KERNEL_FOR_TYPES = "no kernel for these types"
    NO_KERNEL_FOR_VERSION = "no kernel for this version"
    NO_KERNEL = "no kernel"
    NOT_ASSESSED = "not assessed"  # the provider's registry is not available in this build

    @property
    def runs(self) -> bool:
        """Whether the node can run on the provider (possibly in another form)."""
        return self in (KernelVerdict.SUPPORTED, KernelVerdict.EXPANDED, KernelVerdict.FLOAT32_VIA_CAST)


class RegistryState(enum.Enum):
    """What this onnxruntime build knows about an execution provider's kernels."""

    KERNELS = "kernel registry"
    NO_STATIC_REGISTRY = "no static kernel registry"  # in the build, claims nodes at session creation
    NOT_IN_BUILD = "registry not available in this build"


class ProblemKind(enum.Enum):
    """Why an exporter could not (faithfully) export part of the model."""

    NO_LOWERING = "no ONNX lowering"
    PYTHON_OP = "custom autograd Function / Python op"
    DATA_DEPENDENT = "data-dependent control flow"
    CAPTURE_FAILED = "graph capture failed"
    DECOMPOSITION_FAILED = "decomposition failed"  # the exporter's own aten decompositions broke
    TRACE_SPECIALIZED = "trace baked in a Python value"
    OTHER = "export error"


#: the coverage API's name for the diagnosis causes a risky op points at (one list, in ``records``)
Slug = Cause


# -- export side ---------------------------------------------------------------------


@dataclass(frozen=True)
class SourceLine:
    """A line of the user's code, from a stack trace."""

    file: str
    line: int
    code: str = ""

    def __str__(self) -> str:
        path = Path(self.file)
        try:
            path = path.resolve().relative_to(Path.cwd())
        except (ValueError, OSError):
            pass
        return f"{path}:{self.line}"


@dataclass(frozen=True)
class ExportProblem:
    """An operator (or construct) one exporter could not export faithfully."""

    exporter: str  # "dynamo" | "torchscript"
    kind: ProblemKind
    operator: str | None  # e.g. "aten.linalg_eig.default", "aten::linalg_eigvals", "prim::PythonOp NumpyClip"
    source: SourceLine | None
    message: str  # the exporter's own words, one line
    fatal: bool = True  # False: the export succeeded but is specialised to the sample


@dataclass(frozen=True)
class ExportAttempt:
    """One exporter's try at the model."""

    exporter: str
    ok: bool
    seconds: float
    problems: tuple[ExportProblem, ...] = ()
    onnx_ops: tuple[tuple[str, int], ...] = ()  # ("Gemm", 2) or ("com.microsoft::Gelu", 1) when it succeeded
    opset: int | None = None


# -- ONNX side -----------------------------------------------------------------------


@dataclass(frozen=True)
class OpSignature:
    """What decides kernel lookup: operator, version and the input types."""

    domain: str  # "" for ai.onnx
    op_type: str
    since_version: int | None  # None: no schema known to onnx or onnxruntime
    input_types: tuple[str | None, ...]  # "float16", "seq(tensor(float))"; None when unknown or omitted

    @property
    def label(self) -> str:
        """``Op v13 (float16, float)`` or ``my.domain::Op``."""
        name = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        version = f" v{self.since_version}" if self.since_version is not None else ""
        types = ", ".join(t or "?" for t in self.input_types)
        return f"{name}{version} ({types})" if self.input_types else f"{name}{version}"


@dataclass(frozen=True)
class NodeInfo:
    """One ONNX node as the triage sees it."""

    index: int  # position in the flattened node list
    name: str  # as in the file ("" when unnamed)
    key: str  # unique name used for placement ("name", or a generated one)
    signature: OpSignature
    output_types: tuple[str | None, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, Any], ...] = ()  # scalar/list attributes only
    graph: str = ""  # "" for the main graph, else the owning node's key and attribute
    type_bindings: tuple[tuple[str, tuple[str, ...]], ...] = ()  # ("T", ("tensor(float16)",))
    has_function: bool = False  # the schema has an ONNX function body usable at the model's opset

    @property
    def display(self) -> str:
        """The name to show a user."""
        return self.name or f"<unnamed {self.signature.op_type} #{self.index}>"

    def attribute(self, name: str, default: Any = None) -> Any:
        """An attribute value, or ``default``."""
        for key, value in self.attributes:
            if key == name:
                return value
        return default


@dataclass(frozen=True)
class Inventory:
    """Every node of the model (subgraphs included) and the graph's tensor wiring."""

    nodes: tuple[NodeInfo, ...]
    opsets: tuple[tuple[str, int], ...]  # (domain, version) the model imports
    ir_version: int
    producers: dict[str, int] = field(default_factory=dict, repr=False)  # tensor -> node index
    constants: dict[str, Any] = field(default_factory=dict, repr=False)  # small initializers / Constant outputs
    graph_inputs: frozenset[str] = frozenset()  # fed at run time (not initializers)
    overridable: frozenset[str] = frozenset()  # initializers also declared as graph inputs
    input_free: frozenset[str] = frozenset()  # tensors no graph input reaches (computed from constants alone)

    def opset(self, domain: str) -> int | None:
        """The version the model imports for ``domain``."""
        domain = "" if domain == "ai.onnx" else domain
        return dict(self.opsets).get(domain)


@dataclass(frozen=True)
class VersionCheck:
    """One version the model declares against what the installed onnx and onnxruntime support."""

    what: str  # "IR" or an opset domain ("ai.onnx", "ai.onnx.ml", ...)
    version: int
    onnx_max: int | None
    ort_max: int | None

    @property
    def ok(self) -> bool:
        """Within both limits (an unknown limit does not count against it)."""
        return all(limit is None or self.version <= limit for limit in (self.onnx_max, self.ort_max))


@dataclass(frozen=True)
class Validation:
    """onnx.checker, shape inference and version limits."""

    checker_error: str | None
    inference_error: str | None
    versions: tuple[VersionCheck, ...]
    issues: tuple[str, ...] = ()  # further findings, e.g. duplicate node names
    runtime_refuses: bool = False  # onnxruntime will not load the file as it is (versions, duplicate names)

    @property
    def ok(self) -> bool:
        """Everything passed."""
        return (self.checker_error is None and self.inference_error is None and not self.issues
                and all(v.ok for v in self.versions))


@dataclass(frozen=True)
class ProviderInfo:
    """An execution provider the user asked for (or the CPU fallback ONNX Runtime adds)."""

    name: str
    state: RegistryState
    kernel_count: int
    implicit: bool = False  # not requested: ONNX Runtime's CPU fallback


@dataclass(frozen=True)
class KernelCheck:
    """The registry's answer for one node on one provider."""

    provider: str
    verdict: KernelVerdict
    detail: str = ""


@dataclass(frozen=True)
class Placement:
    """Where an ONNX Runtime session actually put the nodes."""

    attempted: bool
    assigned: dict[str, str] = field(default_factory=dict)  # node key -> provider
    failed: dict[str, str] = field(default_factory=dict)  # node key -> ONNX Runtime's refusal
    expanded: frozenset[str] = frozenset()  # node keys replaced by their function body
    probed: frozenset[str] = frozenset()  # node keys checked with a one-node session
    error: str | None = None  # the session could not be created for a model-level reason
    note: str = ""


@dataclass(frozen=True)
class OpsetNeed:
    """A node defined after the ``--opset`` target."""

    target: int
    since_version: int
    target_version: int | None  # the op's version at the target, None when it does not exist yet
    introduced: int | None  # the opset that first defined the op
    difference: str | None = None  # why the target version cannot express the node; None: same signature


@dataclass(frozen=True)
class RiskFlag:
    """Why a node's numbers commonly differ between frameworks, and which diagnosis it points at."""

    slugs: tuple[Cause, ...]
    reason: str


@dataclass(frozen=True)
class NodeFinding:
    """The triage's conclusion for one node."""

    node: NodeInfo
    status: Status
    reason: str  # one line, the same for every node of a collapsed group
    kernels: tuple[KernelCheck, ...] = ()
    runs_on: str | None = None  # the provider that runs it (predicted, or read from the session)
    confirmed: bool | None = None  # a session agreed (True), disagreed and was followed (False), not asked (None)
    opset: OpsetNeed | None = None
    risks: tuple[RiskFlag, ...] = ()


@dataclass(frozen=True)
class FindingGroup:
    """Nodes with the same status, signature and reason, collapsed into one report row."""

    status: Status
    signature: OpSignature
    reason: str
    findings: tuple[NodeFinding, ...]

    @property
    def count(self) -> int:
        """How many nodes the row stands for."""
        return len(self.findings)


@dataclass(frozen=True)
class CoverageConfig:
    """What to triage and against which runtime."""

    target: str  # MODEL.py[:NAME] or MODEL.onnx
    inputs: tuple[str, ...] = ()
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    opset: int | None = None
    confirm: bool = True  # create ONNX Runtime sessions to confirm placement
    show_all: bool = False


@dataclass(frozen=True)
class CoverageReport:
    """Everything the triage found."""

    target: str
    exports: tuple[ExportAttempt, ...]  # empty for an ONNX file
    onnx_source: str  # "the given file", "the dynamo export" ...
    validation: Validation | None
    providers: tuple[ProviderInfo, ...]
    placement: Placement | None
    findings: tuple[NodeFinding, ...]
    opset_target: int | None = None
    versions: tuple[tuple[str, str], ...] = ()  # ("onnxruntime", "1.31.1") ...
    notes: tuple[str, ...] = ()
    timings: dict[str, float] = field(default_factory=dict)

    def count(self, status: Status) -> int:
        """Nodes with ``status``."""
        return sum(1 for f in self.findings if f.status is status)

    @property
    def export_failed(self) -> bool:
        """A .py model that no exporter could export."""
        return bool(self.exports) and not any(a.ok for a in self.exports)

    @property
    def runtime_refused(self) -> bool:
        """ONNX Runtime refuses the whole model (not one node): nothing can run."""
        return ((self.placement is not None and self.placement.error is not None)
                or (self.validation is not None and self.validation.runtime_refuses))

    @property
    def exit_status(self) -> int:
        """1 when something cannot run (a node, the model, or the export), else 0."""
        blocked = self.count(Status.UNSUPPORTED) or self.export_failed or self.runtime_refused
        return 1 if blocked else 0
