"""One input case through the stages: observe → align → measure → explain, each step returning a record.

A single bisection is one case; a verification runs many over the same
:class:`~.runner.Runner`; a bisection against a reference ONNX file reuses the
alignment it made by name.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import onnx

from .. import align
from ..align import ops as op_pairs
from ..capture import modules as capture
from ..capture import ops
from ..capture.weights import weight_signatures
from ..measure import compare, localize
from ..records import (Absence, Capture, Cause, LayerResult, LoadedModel, MatchMethod, ModelInputs,
                       OutputResult, Report, Reproduction, Status, TensorDiff, TensorPair, Tolerance)
from ..records.graph import GraphIndex
from ..records.weights import release, release_all
from ..report.progress import Progress
from ..run import expose
from ..source import feeds
from ..source import weights as source_weights
from . import conditioning, explain
from .config import CasePolicy
from .prepare import Prepared, capture_case, weight_warnings
from .runner import Runner
from .verdict import compare_outputs, reproduction_of


@dataclass(frozen=True)
class Observation:
    """What ONNX Runtime computed for one case: the unmodified model's outputs and every exposed tensor."""

    feeds: dict[str, np.ndarray] = field(repr=False)
    feed_warnings: tuple[str, ...]
    final: dict[str, np.ndarray] = field(repr=False)
    probed: dict[str, np.ndarray] = field(repr=False)


@dataclass(frozen=True)
class Alignment:
    """The case's pairs, the cut points among them, and the probed values of the paired tensors."""

    pairs: tuple[TensorPair, ...]
    cuts: dict[str, TensorPair] = field(repr=False)
    probed: dict[str, np.ndarray] = field(repr=False)


@dataclass(frozen=True)
class CutFeeds:
    """The PyTorch values fed at the cut points (in the ONNX layout), and the cut points that cannot be fed."""

    references: dict[str, np.ndarray] = field(repr=False)
    feeds: dict[str, np.ndarray] = field(repr=False)  # the model's feeds plus one ``<tensor>::reference`` per cut
    unfed: tuple[str, ...] = ()  # ONNX computes another size there: observed, not cut
    upcasts: dict[str, str] = field(default_factory=dict)  # a Cast up from a float16 cut -> that cut (fed alike)


@dataclass(frozen=True)
class Measurement:
    """The outputs' verdict, whether the instrumented run reproduces them, and every layer's errors."""

    outputs: tuple[OutputResult, ...]
    ok: bool
    reproduction: Reproduction
    reproduction_max_abs: float
    layers: tuple[LayerResult, ...]
    cut: CutFeeds
    compare: Callable[[np.ndarray, np.ndarray], TensorDiff] = field(repr=False)
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class CaseRun:
    """One input case under one runtime setting: its report, the alignment it used, and the ONNX values
    it observed (the unmodified model's outputs and every paired tensor of the instrumented run)."""

    report: Report
    pairs: tuple[TensorPair, ...]
    final: dict[str, np.ndarray] = field(repr=False)
    probed: dict[str, np.ndarray] = field(repr=False)


def bisect_case(prepared: Prepared, runner: Runner, inputs: ModelInputs, captured: Capture | None = None, *,
                policy: CasePolicy, progress: Progress | None = None) -> CaseRun:
    """Bisect one input case; return its report, the alignment (a template for further cases) and values."""
    progress = progress or Progress(enabled=False)
    p = prepared
    model_feeds = feeds.make_feeds(inputs, p.skeleton, p.loaded.forward_params)
    if captured is None:
        with progress.step("capture", "running PyTorch with forward hooks"):
            captured = capture_case(p.loaded, inputs)
    seen = observe_case(p, runner, model_feeds, policy, progress)
    aligned = align_case(p, seen, captured, inputs, policy, progress)
    measured = measure_case(p, runner, seen, aligned, captured, policy, progress)
    measured, found = explain_judged(p, runner, seen, aligned, measured, captured, inputs, policy, progress)
    report = Report(
        ok=measured.ok, tolerance=policy.tolerance, exporter=p.exported.exporter, opset=p.exported.opset,
        provider=runner.backend.name, outputs=measured.outputs, first_divergence=found.first, layers=found.layers or measured.layers,
        warnings=measured.warnings + found.warnings, notes=p.exported.notes + p.notes + measured.notes,
        timings=dict(progress.timings), peaks=dict(progress.peaks), model_name=p.loaded.name,
        reproduction=measured.reproduction, reproduction_max_abs=measured.reproduction_max_abs, faithful=found.faithful,
        repro=found.repro, graph_name=p.skeleton.graph.name,
    )
    return CaseRun(report, aligned.pairs, seen.final, aligned.probed)


#: causes a confirmed fix proves to be a fault, whatever float32 rounding does: re-run with another attribute,
#: weight, epsilon or formula the segment agrees with PyTorch (rounding, the runtime's fusions, a lower precision
#: or a numerically delicate op are what a float64 run may still call the model's own conditioning)
PROVEN_FAULTS = frozenset({Cause.ATTRIBUTE_MISMATCH, Cause.WEIGHT_MISMATCH, Cause.EPSILON_MISMATCH,
                           Cause.GELU_APPROXIMATION, Cause.BATCHNORM_FOLD, Cause.RESIZE_MODE, Cause.TRAINING_MODE,
                           Cause.BAKED_SHAPE, Cause.BATCH_MIXING, Cause.DTYPE})


def explain_judged(p: Prepared, runner: Runner, seen: Observation, aligned: Alignment, measured: Measurement,
                   captured: Capture, inputs: ModelInputs, policy: CasePolicy, progress: Progress):
    """``(measurement, explanation)``: the differences re-judged against float32 rounding, then explained.

    A float64 forward tells rounding the model amplifies from a fault (:mod:`.conditioning`); a divergence
    whose fix is confirmed by re-running — another attribute, weight, epsilon or formula and the segment agrees
    with PyTorch — is a fault whatever rounding does.  So diverging outputs are explained first, and the float64
    run is asked only when that explanation proves no fault (then explained again if it changed a verdict)."""
    def run_explain(m: Measurement, pol: CasePolicy) -> explain.Explanation:
        return explain.explain_case(p, runner, seen.feeds, seen.final, aligned, m, captured, inputs, pol, progress)

    found = None
    if not measured.ok:
        found = run_explain(measured, dataclasses.replace(
            policy, memo=None if policy.memo is None else policy.memo.read_only()))
        first = found.first
        proven = first is not None and first.confirmed is True and first.cause in PROVEN_FAULTS
        judged = None if proven else conditioning.judge(p, measured.outputs, measured.layers, captured, inputs,
                                                        seen.final, aligned.probed, policy.tolerance, progress)
        if judged is None:  # the explanation stands: keep it for later cases
            if policy.memo is not None and first is not None:
                policy.memo.keep(first)
            return measured, found
    else:
        judged = conditioning.judge(p, measured.outputs, measured.layers, captured, inputs, seen.final,
                                    aligned.probed, policy.tolerance, progress)
    if judged is not None:
        measured = dataclasses.replace(measured, outputs=judged.outputs, layers=judged.layers, notes=(judged.note,),
                                       ok=all(o.agrees for o in judged.outputs))
    return measured, run_explain(measured, policy)


def observe_case(p: Prepared, runner: Runner, made_feeds: tuple[dict[str, np.ndarray], tuple[str, ...]],
                 policy: CasePolicy, progress: Progress) -> Observation:
    """The unmodified model's outputs (first, while no instrumented values are held: its session has the
    largest footprint), then the probe's exposed tensors."""
    model_feeds, feed_warnings = made_feeds
    with progress.step("final", "running the unmodified ONNX model"):
        final = runner.final(model_feeds)
    with progress.step("probe", f"running ONNX Runtime with {len(p.candidates)} tensors exposed"):
        wanted = None if policy.template is None else paired_tensors(policy.template, p.index)
        probed = runner.probe(model_feeds, wanted)
    return Observation(model_feeds, tuple(feed_warnings), final, probed)


def align_case(p: Prepared, seen: Observation, captured: Capture, inputs: ModelInputs, policy: CasePolicy,
               progress: Progress) -> Alignment:
    """Pair the capture with the probed tensors (or reuse the template's pairs) and choose the cut points."""
    with progress.step("align", "aligning PyTorch activations with ONNX tensors"):
        if policy.template is None:
            modules, op_acts = ops.split(captured)
            pairs = (align.align_activations(modules, p.index, p.scopes, seen.probed, anchor=_anchor(p, modules),
                                             divided=_divided(p))
                     + op_pairs.pair_ops(op_acts, p.index, seen.probed))
        else:
            pairs = align.reuse_alignment(policy.template, captured)
        cuts = localize.cut_points(pairs, p.index)
        kept = {q.tensor for q in pairs} | set(p.index.graph_outputs)
        probed = {t: v for t, v in seen.probed.items() if t in kept}  # free the candidates nobody matched
        release_all()  # the pages of stored values alignment read (low-memory runs) go back to the system
    if policy.template is None and _unaligned_leaves(pairs):
        with progress.step("liveness", "checking which unaligned outputs the model uses"):
            pairs = _mark_unused(pairs, p.loaded, inputs)  # one PyTorch forward with autograd recording
    return Alignment(pairs, cuts, probed)


def _anchor(p: Prepared, modules: Capture) -> Callable[[], dict[str, float]]:
    """The layers anchored by their weights (asked only by loose pairing: a read of every weight)."""
    def anchor() -> dict[str, float]:
        if p.loaded.module is None:
            return {}
        return align.anchored_owners(modules.activations, p.index, weight_signatures(p.loaded.module),
                                     {**_small_weights(p), **p.weights.arrays})
    return anchor


def _small_weights(p: Prepared) -> dict[str, np.ndarray]:
    """The float initializers of two or more dimensions the skeleton holds inline (not external data)."""
    return {i.name: source_weights.to_array(i) for i in p.skeleton.graph.initializer
            if i.name not in p.weights and i.data_location != onnx.TensorProto.EXTERNAL and len(i.dims) >= 2
            and i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)}


def _divided(p: Prepared) -> Callable[[str, float], bool]:
    """``(weight, factor) -> bool`` for :func:`..align.anchors.holds_divided` (the model's signatures and the
    file's weights read once, when first asked)."""
    cache: dict[str, dict] = {}

    def divided(weight: str, factor: float) -> bool:
        if p.loaded.module is None:
            return False
        if not cache:
            cache["signatures"] = weight_signatures(p.loaded.module)
            cache["arrays"] = {**_small_weights(p), **p.weights.arrays}
        value = cache["arrays"].get(weight)
        return value is not None and align.holds_divided(cache["signatures"], value, factor)
    return divided


def measure_case(p: Prepared, runner: Runner, seen: Observation, aligned: Alignment, captured: Capture,
                 policy: CasePolicy, progress: Progress) -> Measurement:
    """The outputs' verdict, the reproduction check, the local run (when needed) and every layer's errors."""
    tolerance = policy.tolerance
    with progress.step("report", "comparing"):
        outputs = compare_outputs(captured, p.index, seen.final, tolerance)
        ok = all(o.diff.ok for o in outputs)
        reproduction, reproduction_max_abs = reproduction_of(p.index, aligned.probed, seen.final, tolerance)
        # A verification case that agrees keeps three numbers per layer: measure only those.
        cmp = read_once(functools.partial(_compare if policy.thorough or not ok else compare.check_tensors,
                                          tol=tolerance))
    cut = cut_feeds(aligned, seen.feeds, p.index)
    local_values: dict[str, np.ndarray] = {}
    if policy.thorough or not ok:
        with progress.step("local", f"measuring local error at {len(aligned.cuts)} cut points"):
            local_values = runner.local(cut.feeds, cut.references, cut.unfed)
    with progress.step("report", "comparing"):
        # a graph output's row reads the unmodified model's value: exposing the other tensors changes what ONNX
        # Runtime fuses, so the instrumented run may differ from it slightly (float16 files), and the outputs'
        # verdict and their rows must not disagree
        shipped = {t: seen.final[t] for t in p.index.graph_outputs if t in seen.final and t in aligned.probed}
        layers = localize.localize(aligned.pairs, p.index, {**aligned.probed, **shipped}, local_values, aligned.cuts,
                                   cmp, accumulated_reliable=reproduction is not Reproduction.DIFFERENT)
    reordered = _reordered_cuts(layers, cut, aligned.probed)
    if reordered and local_values:
        # rows a sort put in another order are fed as the file orders them: a segment after them, fed PyTorch's
        # order while its own sort keeps the file's, would mix the two and show error that is no fault's
        with progress.step("local", f"measuring local error again, {len(reordered)} reordered cut(s) fed as the "
                                    "file orders them"):
            references = {**cut.references, **reordered}
            cut = dataclasses.replace(cut, references=references, feeds=with_references(seen.feeds, references))
            local_values = runner.local(cut.feeds, cut.references, cut.unfed)
        with progress.step("report", "comparing"):
            layers = localize.localize(aligned.pairs, p.index, {**aligned.probed, **shipped}, local_values,
                                       aligned.cuts, cmp, reproduction is not Reproduction.DIFFERENT,
                                       frozenset(reordered))
    with progress.step("report", "comparing"):
        warnings = (list(seen.feed_warnings) + list(p.warnings) + weight_warnings(p, layers)
                    + _warnings(p.loaded, captured, p.index, reproduction, reproduction_max_abs))
    return Measurement(outputs, ok, reproduction, reproduction_max_abs, layers, cut, cmp, tuple(warnings))


def _reordered_cuts(layers, cut: CutFeeds, probed) -> dict[str, np.ndarray]:
    """``{cut tensor: the file's value}`` of the cuts whose layer is reordered (PyTorch's rows in the order the
    file's sort gives them), in the reference's dtype."""
    return {r.pair.tensor: np.ascontiguousarray(np.asarray(probed[r.pair.tensor]).astype(
        cut.references[r.pair.tensor].dtype)) for r in layers if r.status is Status.REORDERED
        and r.pair.tensor in cut.references and r.pair.tensor in probed
        and np.asarray(probed[r.pair.tensor]).shape == cut.references[r.pair.tensor].shape}


def read_once(compare_fn: Callable[[np.ndarray, np.ndarray], TensorDiff]
              ) -> Callable[[np.ndarray, np.ndarray], TensorDiff]:
    """``compare_fn`` handing back the memory pages of the two values once compared, where they are
    memory-mapped (the activation store of a low-memory run: read again from the file if needed)."""
    def compare_and_release(actual: np.ndarray, expected: np.ndarray) -> TensorDiff:
        try:
            return compare_fn(actual, expected)
        finally:
            release([actual, expected])
    return compare_and_release


def cut_feeds(aligned: Alignment, model_feeds: dict[str, np.ndarray], index: GraphIndex) -> CutFeeds:
    """The reference values to feed at the cut points; a tensor whose ONNX size differs from PyTorch's (a
    shape baked into the graph) cannot be fed its reference and is only observed.

    A float16 cut whose readers cast it straight back up to float32 (a node converted to float16 in a float32
    model) is fed at both tensors: the float16 one rounded, as the graph holds it, and each Cast's float32
    output the exact PyTorch value. The rounding to float16 then belongs to the segment that computes in
    float16 (judged at float16's resolution, and traced as an amplified error when the layers after it
    magnify it), not to the float32 segment that reads it."""
    probed = aligned.probed
    references = {t: in_onnx_layout(q.reference(), probed[t]) for t, q in aligned.cuts.items()
                  if t in probed and probed[t].size == q.activation.value.size}
    unfed = tuple(t for t in aligned.cuts if t in probed and t not in references)
    upcasts = _upcasts(index, references, aligned)
    for up, t in upcasts.items():
        q = aligned.cuts[t]
        references[up] = np.ascontiguousarray(q.reference().astype(np.float32).reshape(references[t].shape))
    return CutFeeds(references, with_references(model_feeds, references), unfed, upcasts)


def _upcasts(index: GraphIndex, references: dict[str, np.ndarray], aligned: Alignment) -> dict[str, str]:
    """``{cast output: float16 cut}`` for float16 cuts (of float32 PyTorch values) cast up to float32."""
    out = {}
    for t, value in references.items():
        if value.dtype != np.float16 or aligned.cuts[t].reference().dtype != np.float32:
            continue
        for i in index.consumers.get(t, ()):
            node = index.nodes[i]
            if (node.op_type == "Cast" and node.outputs and node.outputs[0] not in references
                    and node.outputs[0] not in aligned.cuts
                    and index.elem_types.get(node.outputs[0]) == onnx.TensorProto.FLOAT):
                out[node.outputs[0]] = t
    return out


def with_references(model_feeds: dict[str, np.ndarray], references: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's feeds plus each reference under its cut graph input's name."""
    return {**model_feeds, **{expose.reference_input_name(t): v for t, v in references.items()}}


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


def _compare(actual: np.ndarray, expected: np.ndarray, tol: Tolerance):
    return compare.compare_tensors(actual, expected, tol)


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


def in_onnx_layout(reference: np.ndarray, onnx_value: np.ndarray) -> np.ndarray:
    """The reference with the ONNX tensor's dtype and shape, ready to feed (values beyond a float16 tensor's
    range become inf, as they do in the graph)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(reference.astype(onnx_value.dtype, copy=False).reshape(onnx_value.shape))
