"""The only module that knows the order of the stages.

load → export → capture → expose/run → align → compare → localize → diagnose → report

:func:`prepare` does what every input case shares (export, graph index, scope
map, preflight); :class:`Runner` holds one runtime setting's ONNX Runtime
sessions; :func:`bisect_case` runs one input case through them.  A single
bisection is one of each; ``verify`` runs many cases over the same three.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from .. import align
from ..align import ops as op_pairs
from ..align.scopes import ScopeMap
from ..capture import modules as capture
from ..capture import ops
from ..diagnose import preflight
from ..diagnose.runner import DiagnosisContext, diagnose
from ..errors import InputError, UsageError
from ..measure import compare, localize, observe
from ..records.graph import GraphIndex
from ..report.progress import Progress
from ..run import expose
from ..run.backend import Backend, Session, make_backend
from ..source import export, feeds, graph, load, weights
from ..records import (Absence, OptLevel, Capture, Divergence, ErrorOrigin, Exporter, ExportedModel, LayerResult, LoadedModel, MatchMethod,
                      ModelInputs, OutputResult, Report, Reproduction, RuntimeSettings, Status, TensorPair, Tolerance)


@dataclass(frozen=True)
class Config:
    """Everything one run needs to know, independent of the command line.

    Several providers or optimization levels, session-entry variants, axes, a
    dataset or edge cases ask for a verification over several configurations
    (see :mod:`onnx_bisect.verification`); ``is_matrix`` tells.
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


@dataclass(frozen=True)
class Prepared:
    """What every input case shares: the model, its ONNX graph, the scope map and preflight warnings."""

    loaded: LoadedModel
    exported: ExportedModel
    skeleton: onnx.ModelProto  # shape-inferred (free dimensions stay symbolic), large weights split off
    weights: weights.Weights
    index: GraphIndex  # shapes pinned to the sample's
    scopes: ScopeMap
    candidates: tuple[str, ...]  # the tensors the probe exposes
    warnings: tuple[str, ...] = ()
    reference_weights: dict[str, np.ndarray] | None = field(default=None, repr=False)  # --reference's initializers


def run(config: Config, progress: Progress | None = None) -> Report:
    """Load the model and inputs named in ``config`` and bisect."""
    progress = progress or Progress(enabled=False)
    with progress.step("load", "loading the model"):
        loaded, file_module = load.load_model(config.model)
        inputs = load.load_inputs(config.inputs, loaded, file_module)
    return bisect_loaded(
        loaded, inputs, onnx_path=config.onnx, exporter=config.exporter, opset=config.opset,
        runtime=config.runtime, tolerance=config.tolerance, save_onnx=config.save_onnx, progress=progress,
    )


def bisect(
    model: Any,
    inputs: Any,
    onnx: str | onnx.ModelProto | None = None,
    *,
    atol: float = 1e-4,
    rtol: float = 1e-3,
    exporter: str | None = None,
    opset: int | None = None,
    provider: str = "CPUExecutionProvider",
    save_onnx: str | None = None,
    ort_config: dict[str, str] | None = None,
    ort_opt_level: str | OptLevel = OptLevel.ALL,
) -> Report:
    """Bisect a PyTorch ``model`` against its ONNX export (or the given ONNX model).

    ``inputs`` is a tensor, an array, a tuple of them (positional arguments) or
    a dict (keyword arguments).  Returns a :class:`Report`; ``report.ok`` tells
    whether the final outputs agree within ``atol``/``rtol``.
    """
    loaded = loaded_from_module(model)
    model_inputs = load.to_model_inputs(inputs, loaded)
    from .specs import parse_provider

    name, options = parse_provider(provider)
    return bisect_loaded(
        loaded, model_inputs, onnx_path=onnx, exporter=Exporter(exporter) if exporter else None, opset=opset,
        runtime=RuntimeSettings(name, options, ort_opt_level, tuple((ort_config or {}).items())),
        tolerance=Tolerance(atol, rtol), save_onnx=save_onnx,
    )


def loaded_from_module(model: Any) -> LoadedModel:
    """A :class:`LoadedModel` for an ``nn.Module`` handed over from Python."""
    return LoadedModel(module=model, name=type(model).__name__, source="<python>", was_training=bool(model.training),
                       forward_params=load._forward_params(model))


def bisect_loaded(
    loaded: LoadedModel,
    inputs: ModelInputs,
    *,
    onnx_path: str | onnx.ModelProto | None,
    exporter: Exporter | None,
    opset: int | None,
    runtime: RuntimeSettings | None = None,
    tolerance: Tolerance,
    save_onnx: str | None = None,
    progress: Progress | None = None,
) -> Report:
    """Run every stage on an already loaded model and inputs."""
    progress = progress or Progress(enabled=False)
    backend = make_backend(runtime)
    with progress.step("capture", "running PyTorch with forward hooks"):
        captured = capture_case(loaded, inputs)
    exported = obtain_onnx(loaded, inputs, onnx_path, exporter, opset, progress)
    if exported.program is not None:
        with progress.step("capture", "running the exported program op by op"):
            values = frozenset(t for n in exported.proto.graph.node for t in n.output)
            captured = ops.with_ops(captured, ops.capture_ops(exported.program, inputs, len(captured.activations),
                                                              values))
    prepared = prepare(loaded, inputs, captured, exported=exported, backend=backend, save_onnx=save_onnx,
                       progress=progress)
    return bisect_case(prepared, Runner(prepared, backend), inputs, captured, tolerance=tolerance,
                       progress=progress).report


def obtain_onnx(loaded: LoadedModel, inputs: ModelInputs, onnx_path: str | onnx.ModelProto | None,
                exporter: Exporter | None, opset: int | None, progress: Progress,
                dynamic_axes: dict[str, dict[int, str]] | None = None) -> ExportedModel:
    """Export the model (``onnx_path`` None), or load the given file or proto."""
    if onnx_path is None:
        with progress.step("export", f"exporting to ONNX ({(exporter or Exporter.DYNAMO).value})"):
            return export.export_model(loaded, inputs, exporter, opset, dynamic_axes)
    if isinstance(onnx_path, str):
        return export.load_onnx(onnx_path)
    return ExportedModel(proto=onnx_path, exporter=Exporter.GIVEN, opset=export.opset_of(onnx_path))


def prepare(
    loaded: LoadedModel,
    inputs: ModelInputs,
    captured: Capture,
    *,
    onnx_path: str | onnx.ModelProto | None = None,
    exporter: Exporter | None = None,
    opset: int | None = None,
    backend: Backend,
    save_onnx: str | None = None,
    progress: Progress,
    exported: ExportedModel | None = None,
) -> Prepared:
    """Export (or load), index the graph against the sample's capture and run the preflight checks."""
    exported = exported or obtain_onnx(loaded, inputs, onnx_path, exporter, opset, progress)
    with progress.step("prepare", "indexing the ONNX graph"):
        skeleton, weight_store = (
            (exported.proto, exported.weights) if exported.weights is not None else weights.split_weights(exported.proto)
        )
        model_feeds, _ = feeds.make_feeds(inputs, skeleton, loaded.forward_params)
        where = f"ONNX model '{exported.path}'" if exported.path else "The exported ONNX model"
        skeleton = export.validate_onnx(skeleton, where)
        index = graph.index_graph(export.pin_shapes(skeleton, {k: v.shape for k, v in model_feeds.items()}, where))
        modules, op_acts = ops.split(captured)
        scopes = align.map_scopes(modules, index)
        candidates = tuple(dict.fromkeys(align.candidate_tensors(modules, index, scopes)
                                         + op_pairs.op_tensors(op_acts, index)))
    with progress.step("preflight", "checking the model before running it"):
        warnings = preflight.check_model(loaded, inputs, skeleton, weight_store, exported, backend, modules)
    if save_onnx:
        _save(weights.join_weights(skeleton, weight_store) if exported.weights is not None else exported.proto, save_onnx)
    return Prepared(loaded, exported, skeleton, weight_store, index, scopes, candidates, tuple(warnings))


@dataclass(frozen=True)
class CaseRun:
    """One input case under one runtime setting: its report, the alignment it used, and the ONNX values
    it observed (the unmodified model's outputs and every paired tensor of the instrumented run)."""

    report: Report
    pairs: tuple[TensorPair, ...]
    final: dict[str, np.ndarray] = field(repr=False)
    probed: dict[str, np.ndarray] = field(repr=False)


class Runner:
    """One runtime setting's ONNX Runtime sessions over a prepared model.

    ``final`` is the unmodified graph with the user's settings (the true
    outputs); ``probe`` exposes the alignment candidates; ``local`` is the graph
    cut at the aligned tensors, every segment fed PyTorch values.  With
    ``keep`` (many input cases) each session is created once and reused;
    otherwise each is released after its run, so a single bisection holds one
    session's memory at a time.
    """

    def __init__(self, prepared: Prepared, backend: Backend, keep: bool = False):
        self.prepared = prepared
        self.backend = backend
        self.keep = keep
        self._sessions: dict[str, Session] = {}
        self._cut_at: tuple[str, ...] | None = None
        self._exposed: tuple[str, ...] = prepared.candidates

    def _session(self, role: str, build) -> Session:
        if role in self._sessions:
            return self._sessions[role]
        model, one_shot = build()
        session = self.backend.load(model, self.prepared.weights, one_shot=one_shot)
        if self.keep:
            self._sessions[role] = session
        return session

    def final(self, model_feeds) -> dict[str, np.ndarray]:
        """The unmodified model's outputs: the same graph and weight bytes as the user's file and settings."""
        return self._computed(self._session("final", lambda: (self.prepared.skeleton, False)).run(model_feeds))

    def probe(self, model_feeds, wanted: list[str] | None = None) -> dict[str, np.ndarray]:
        """Every exposed tensor (or just ``wanted`` of them) from the graph exposing them all."""
        session = self._session("probe", lambda: (expose.expose_tensors(self.prepared.skeleton, self._exposed), True))
        return self._computed(session.run(model_feeds, list(self._exposed) if wanted is None else wanted))

    def narrow(self, tensors: list[str]) -> None:
        """From now on the probe exposes only ``tensors`` (once an alignment is known: its paired tensors).

        Fewer outputs leave ONNX Runtime more of its fusions and memory reuse, so
        each further case runs faster and closer to the shipped graph.
        """
        if tuple(tensors) != self._exposed:
            self._exposed = tuple(tensors)
            self._sessions.pop("probe", None)

    def local(self, ref_feeds, references: dict[str, np.ndarray], unfed: tuple[str, ...] = ()) -> dict[str, np.ndarray]:
        """Each cut tensor as its segment computes it from the PyTorch values of the cuts upstream.

        ``unfed`` are cut points whose reference cannot be fed (ONNX computes
        another size there): they are observed, not cut.
        """
        cut_at = tuple(references) + unfed
        if self._cut_at is not None and cut_at != self._cut_at:
            self._sessions.pop("local", None)
        self._cut_at = cut_at
        session = self._session("local", lambda: (expose.expose_tensors(
            expose.cut_at_tensors(self.prepared.skeleton, references), unfed), True))
        return self._computed(session.run(ref_feeds, list(cut_at)))

    def observe(self, model_feeds, tensors) -> dict[str, np.ndarray]:
        """A fresh session of the unmodified graph exposing only ``tensors`` (for faithful location)."""
        p = self.prepared
        return self._computed(self.backend.run(expose.expose_tensors(p.skeleton, tensors), model_feeds, None,
                                               p.weights, one_shot=True))

    def run_cut(self, model, ref_feeds, outputs, store, optimize: bool = True) -> dict[str, np.ndarray]:
        """One run of a cut graph (a diagnosis's counterfactual, a faithful location's segment), values as
        computed (see :meth:`_computed`)."""
        return self._computed(self.backend.run(model, ref_feeds, outputs, store, one_shot=True, optimize=optimize))

    def _computed(self, values) -> dict[str, np.ndarray]:
        """Values marked with the resolution they were computed at (float32 tensors computed from float16 data)."""
        return compare.at_resolution(values, self.prepared.index.half_resolution)


def capture_case(loaded: LoadedModel, inputs: ModelInputs, outputs_only: bool = False) -> Capture:
    """The PyTorch reference run (every activation, or ``outputs_only``); a failure is the user's input
    problem, said in one paragraph."""
    try:
        if outputs_only:
            return capture.capture_outputs(loaded.module, inputs)
        return capture.capture_activations(loaded.module, inputs)
    except Exception as exc:
        shapes = ", ".join(
            f"{n}: {getattr(v, 'dtype', type(v).__name__)}{list(getattr(v, 'shape', []))}"
            for n, v in zip(inputs.names, inputs.args)
        )
        raise InputError(
            f"Running the PyTorch model on the given inputs failed ({type(exc).__name__}: "
            f"{str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}). Given: {shapes or 'no positional inputs'}. "
            "Check the number, order, shapes and dtypes of the --input files."
        ) from exc


def bisect_case(
    prepared: Prepared,
    runner: Runner,
    inputs: ModelInputs,
    captured: Capture | None = None,
    *,
    tolerance: Tolerance,
    template: tuple[TensorPair, ...] | None = None,
    progress: Progress | None = None,
    thorough: bool = True,
    diagnosed: dict[tuple[str, bool], Divergence] | None = None,
) -> CaseRun:
    """Bisect one input case; return its report, the alignment (a template for further cases) and values.

    With a ``template`` the alignment of an earlier case is reused (it is a
    property of the model and the graph, not of the inputs: value matching on
    zeros would be meaningless).  ``thorough=False`` skips the local run when
    the final outputs agree, and keeps only each layer's verdict, max abs and
    tolerance ratio (a verification of many cases needs the rest only where
    something diverges).  ``diagnosed`` memoises diagnoses by
    (tensor, introduced) across cases of one runtime setting: a dataset whose
    samples all diverge at one node is diagnosed once, on the first of them.
    """
    progress = progress or Progress(enabled=False)
    p = prepared
    model_feeds, feed_warnings = feeds.make_feeds(inputs, p.skeleton, p.loaded.forward_params)
    if captured is None:
        with progress.step("capture", "running PyTorch with forward hooks"):
            captured = capture_case(p.loaded, inputs)
    # First, while no instrumented values are held: its session has the largest footprint.
    with progress.step("final", "running the unmodified ONNX model"):
        final = runner.final(model_feeds)
    with progress.step("probe", f"running ONNX Runtime with {len(p.candidates)} tensors exposed"):
        probed = runner.probe(model_feeds, None if template is None else paired_tensors(template, p.index))
    with progress.step("align", "aligning PyTorch activations with ONNX tensors"):
        if template is None:
            modules, op_acts = ops.split(captured)
            pairs = align.align_activations(modules, p.index, p.scopes, probed) + op_pairs.pair_ops(op_acts, p.index, probed)
        else:
            pairs = align.reuse_alignment(template, captured)
        cuts = localize.cut_points(pairs, p.index)
        kept = {q.tensor for q in pairs} | set(p.index.graph_outputs)
        probed = {t: v for t, v in probed.items() if t in kept}  # free the candidates nobody matched
    if template is None and _unaligned_leaves(pairs):
        with progress.step("liveness", "checking which unaligned outputs the model uses"):
            pairs = _mark_unused(pairs, p.loaded, inputs)  # one PyTorch forward with autograd recording
    with progress.step("report", "comparing"):
        outputs = compare_outputs(captured, p.index, final, tolerance)
        ok = all(o.diff.ok for o in outputs)
        reproduction, reproduction_max_abs = _reproduction(p.index, probed, final, tolerance)
        # A verification case that agrees keeps three numbers per layer: measure only those.
        cmp = functools.partial(_compare if thorough or not ok else compare.check_tensors, tol=tolerance)
    # A tensor whose ONNX size differs from PyTorch's (a shape baked into the graph) cannot be fed its reference.
    references = {t: _in_onnx_layout(q.reference(), probed[t]) for t, q in cuts.items()
                  if t in probed and probed[t].size == q.activation.value.size}
    unfed = tuple(t for t in cuts if t in probed and t not in references)
    ref_feeds = {**model_feeds, **{expose.reference_input_name(t): v for t, v in references.items()}}
    local_values: dict[str, np.ndarray] = {}
    if thorough or not ok:
        with progress.step("local", f"measuring local error at {len(cuts)} cut points"):
            local_values = runner.local(ref_feeds, references, unfed)
    with progress.step("report", "comparing"):
        layers = localize.localize(pairs, p.index, probed, local_values, cuts, cmp,
                                   accumulated_reliable=reproduction is not Reproduction.DIFFERENT)
        warnings = list(feed_warnings) + list(p.warnings) + _warnings(p.loaded, captured, p.index, reproduction,
                                                                        reproduction_max_abs)

    if ok:
        warnings.extend(_hidden_divergence(layers))
    local_run = _local_run_at(runner, references, ref_feeds)
    first, faithful = None, None
    if not ok:
        layer, introduced = localize.first_divergence(layers)
        if reproduction is Reproduction.DIFFERENT:
            with progress.step("observe", "locating the divergence with faithful exposures"):
                located = _locate_faithfully(p, runner, pairs, model_feeds, final, cmp, tolerance)
            if located is not None:
                faithful, layer, introduced, references, ref_feeds = located
                local_run = _local_run_at(runner, references, ref_feeds)
        if layer is None:
            warnings.append(
                "The final outputs diverge, but no aligned tensor does: the divergence lies after the "
                "last aligned tensor or in a part of the graph no activation maps to."
            )
        elif diagnosed is not None and (layer.pair.tensor, introduced) in diagnosed:
            earlier = diagnosed[(layer.pair.tensor, introduced)]
            first = dataclasses.replace(
                earlier, layer=layer, evidence={**earlier.evidence, "diagnosed_on_an_earlier_sample": True},
                explanation="(Diagnosed on an earlier sample that diverges at the same tensor.) " + earlier.explanation)
        else:
            with progress.step("diagnose", "diagnosing the first divergence"):
                first = diagnose(DiagnosisContext(
                    layer=layer, introduced=introduced, layers=layers, graph=p.index, skeleton=p.skeleton,
                    weights=p.weights, loaded=p.loaded, exported=p.exported, capture=captured,
                    references=references, feeds=model_feeds, tolerance=tolerance, local_run=local_run,
                    compare=cmp, backend=runner.backend, inputs=inputs, reference_weights=p.reference_weights,
                ))
            if diagnosed is not None:
                diagnosed[(layer.pair.tensor, introduced)] = first
    report = Report(
        ok=ok, tolerance=tolerance, exporter=p.exported.exporter, opset=p.exported.opset, provider=runner.backend.name,
        outputs=outputs, first_divergence=first, layers=layers, warnings=tuple(warnings),
        notes=p.exported.notes, timings=dict(progress.timings), model_name=p.loaded.name,
        reproduction=reproduction, reproduction_max_abs=reproduction_max_abs, faithful=faithful,
    )
    return CaseRun(report, pairs, final, probed)


def _unaligned_leaves(pairs: tuple[TensorPair, ...]) -> dict[tuple[str, int, str], TensorPair]:
    """Leaf activations with no ONNX tensor and no reason yet to call them absent, by (module, call, path)."""
    return {_call_key(q): q for q in pairs
            if q.tensor is None and q.method is MatchMethod.NONE and q.activation.is_leaf and q.activation.module
            and q.absent is None}


def _mark_unused(pairs: tuple[TensorPair, ...], loaded: LoadedModel, inputs: ModelInputs) -> tuple[TensorPair, ...]:
    """Unaligned leaf outputs the model's outputs never use (an LSTM's final states a model discards) are
    absent from the graph, not alignment failures: exporters prune what computes them."""
    lost = _unaligned_leaves(pairs)
    if not lost or loaded.module is None:
        return pairs
    try:
        unused = capture.unused_outputs(loaded.module, inputs, frozenset(lost))
    except Exception:  # noqa: BLE001 - a model that will not run with autograd keeps its reasons
        return pairs
    note = (f"{align.ABSENT}: the model's outputs do not use this value (PyTorch computes it, the exporter "
            "pruned what computes it)")
    return tuple(dataclasses.replace(q, note=note, absent=Absence.UNUSED_OUTPUT) if _call_key(q) in unused else q
                 for q in pairs)


def _call_key(q: TensorPair) -> tuple[str, int, str]:
    """Which output of which call of which module a pair is about."""
    return q.activation.module, q.activation.call, q.activation.path


def paired_tensors(template: tuple[TensorPair, ...], index: GraphIndex) -> list[str]:
    """The probe outputs a case with a known alignment needs: its paired tensors and the graph outputs."""
    return list(dict.fromkeys([q.tensor for q in template if q.tensor and q.tensor in index.producer]
                              + list(index.graph_outputs)))


def _locate_faithfully(p: Prepared, runner: Runner, pairs, model_feeds, final, cmp, tolerance):
    """The first divergence from exposures that keep the shipped outputs, with its local error.

    Returns ``(location, layer, introduced, references, ref_feeds)`` or None.
    """
    ordered = sorted({q.tensor: q for q in pairs if q.cuttable and q.tensor in p.index.producer}.values(),
                     key=lambda q: p.index.order_of(q.tensor))
    boundaries = frozenset(q.tensor for q in ordered if not q.activation.is_leaf)

    def reproduces(values) -> bool:
        return _reproduction(p.index, values, final, tolerance)[0] is not Reproduction.DIFFERENT

    def measure(pair: TensorPair, value: np.ndarray):
        return cmp(value, pair.reference())

    location, observed = observe.locate_faithfully(
        ordered, boundaries, lambda ts: runner.observe(model_feeds, ts), reproduces, measure)
    if location is None:
        return None
    by_tensor = {q.tensor: q for q in ordered}
    good = [t for t, d in observed.items() if d.ok]
    bad = by_tensor[location.first_bad]
    # Cut only where an exposure kept the shipped outputs: those cuts leave the fusions in place.
    references = {t: np.ascontiguousarray(by_tensor[t].reference().astype(
        np.dtype(onnx.helper.tensor_dtype_to_np_dtype(p.index.elem_types.get(t, onnx.TensorProto.FLOAT))),
        copy=False)) for t in good}
    ref_feeds = {**model_feeds, **{expose.reference_input_name(t): v for t, v in references.items()}}
    cut = expose.expose_tensors(expose.cut_at_tensors(p.skeleton, references), [bad.tensor])
    local_values = runner.run_cut(cut, ref_feeds, [bad.tensor], p.weights)
    local = cmp(local_values[bad.tensor], bad.reference())
    seg = p.index.segment(bad.tensor, frozenset(references))
    introduced = not local.ok
    layer = LayerResult(
        pair=bad, diff=observed[bad.tensor], local=local, status=Status.DIVERGED,
        origin=ErrorOrigin.INTRODUCED if introduced else ErrorOrigin.INHERITED,
        segment=tuple(p.index.nodes[i].name for i in seg), segment_ops=tuple(p.index.nodes[i].op_type for i in seg),
        order=float(p.index.order_of(bad.tensor)),
    )
    return location, layer, introduced, references, ref_feeds


def _local_run_at(runner: Runner, references, ref_feeds):
    """The diagnosis's re-run: a model cut at ``references``' tensors, each segment fed its reference values."""
    def local_run(model, store, optimize: bool = True):
        """Run ``model`` cut at the same tensors, every segment fed the reference values."""
        return runner.run_cut(expose.cut_at_tensors(model, references), ref_feeds, list(references), store,
                              optimize=optimize)
    return local_run


def _compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance):
    return compare.compare_tensors(actual, expected, tol)


def compare_outputs(captured, index, final, tol) -> tuple[OutputResult, ...]:
    """The unmodified model's outputs against PyTorch's, by position."""
    results = []
    for name, ref in zip(index.graph_outputs, captured.outputs):
        if name in final:
            # np.asarray: the verdict judges the output as the dtype it declares (see Runner._computed)
            results.append(OutputResult(name, compare.compare_tensors(np.asarray(final[name]), ref, tol)))
    return tuple(results)


def _reproduction(index: GraphIndex, instrumented, final, tol: Tolerance) -> tuple[Reproduction, float]:
    """Whether the instrumented run's graph outputs equal the unmodified run's: bit for bit, within
    tolerance, or not; and the largest difference."""
    verdict, worst = Reproduction.EXACT, 0.0
    for name in index.graph_outputs:
        a, b = instrumented.get(name), final.get(name)
        if a is None or b is None or (a.shape == b.shape and np.array_equal(a, b, equal_nan=a.dtype.kind == "f")):
            continue
        diff = compare.compare_tensors(a, b, tol)
        worst = max(worst, diff.max_abs)
        if not diff.ok:
            verdict = Reproduction.DIFFERENT
        elif verdict is Reproduction.EXACT:
            verdict = Reproduction.WITHIN_TOLERANCE
    return verdict, worst


def _hidden_divergence(layers: tuple[LayerResult, ...]) -> list[str]:
    """A warning when the outputs agree but a segment inside introduces error beyond tolerance: a fault
    that the rest of the model hides on these inputs (a normalisation after it, a saturating activation)."""
    layer, introduced = localize.first_divergence(layers)
    if layer is None or not introduced:
        return []
    count = sum(1 for r in layers if r.origin is ErrorOrigin.INTRODUCED)
    a, local = layer.pair.activation, layer.local
    node = layer.segment[-1] if layer.segment else layer.pair.tensor
    return [f"The outputs agree, but {count} layer(s) inside the model introduce error beyond tolerance, first "
            f"{a.module or '<model>'} ({a.module_type}) → ONNX node {node}: local max abs {local.max_abs:.3g}, "
            f"{local.tol_ratio:.3g}× the tolerance. The layers after it hide the difference on these inputs; "
            "other inputs may not (run with --dataset or --edge-cases to check)."]


def _warnings(loaded, captured, index, reproduction: Reproduction, reproduction_max_abs: float) -> list[str]:
    notes = []
    if loaded.was_training:
        notes.append(
            "The model came in training mode; onnx-bisect ran and exported it in eval mode. If your "
            "deployment exported it in training mode, Dropout and BatchNorm batch statistics will differ."
        )
    if len(captured.outputs) != len(index.graph_outputs):
        notes.append(
            f"PyTorch returned {len(captured.outputs)} output tensor(s) but the ONNX graph has "
            f"{len(index.graph_outputs)}; only the first {min(len(captured.outputs), len(index.graph_outputs))} "
            "were compared, by position."
        )
    if reproduction is Reproduction.DIFFERENT:
        notes.append(
            "The instrumented run disagrees with the unmodified model at the outputs (max abs "
            f"{reproduction_max_abs:.3g}): exposing intermediate tensors changed how ONNX Runtime optimised the "
            "graph, so the accumulated errors in the table are not those of the shipped graph. The first "
            "divergence was located with exposures that keep the shipped outputs."
        )
    return notes


def _in_onnx_layout(reference: np.ndarray, onnx_value: np.ndarray) -> np.ndarray:
    """The reference with the ONNX tensor's dtype and shape, ready to feed (values beyond a float16 tensor's
    range become inf, as they do in the graph)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(reference.astype(onnx_value.dtype, copy=False).reshape(onnx_value.shape))


def _save(proto: onnx.ModelProto, path: str) -> None:
    from ..report.text import write_atomic

    try:
        data = proto.SerializeToString()
    except ValueError as exc:  # protobuf refuses messages over 2 GB
        raise UsageError(f"The model is too large for one ONNX file ({exc}); save it with external data "
                         "yourself (onnx.save_model(..., save_as_external_data=True)).") from exc
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise UsageError(f"Cannot write --save-onnx '{path}': {exc.strerror or exc}. Choose a writable path.") from exc
