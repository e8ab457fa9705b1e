"""The explain step of one case: the first divergence, located faithfully when exposure changed the outputs,
and diagnosed (or taken from an earlier case's diagnosis)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import onnx

from ..diagnose import (Baseline, CutRun, DiagnosisContext, OnnxModel, clips, diagnose,
                        explained_by_quantization, float_twin)
from ..measure import localize, observe
from ..records import (Cause, Divergence, ErrorOrigin, FaithfulLocation, LayerResult, Repro, Reproduction, Status,
                       TensorPair, Tolerance)
from ..report.progress import Progress
from ..run import expose
from ..source import graph
from .config import CasePolicy
from .prepare import Prepared
from . import amplify
from .refine import ops_around, refine
from .repro import build_repro
from .runner import Runner
from .verdict import reproduction_of


@dataclass(frozen=True)
class Explanation:
    """The first divergence (diagnosed), how it was located, and the warnings explaining found on the way."""

    first: Divergence | None = None
    faithful: FaithfulLocation | None = None
    warnings: tuple[str, ...] = ()
    repro: Repro | None = None  # only when the policy asks for it
    layers: tuple[LayerResult, ...] | None = None  # the measured layers restated (quantization noise), if any


def explain_case(p: Prepared, runner: Runner, model_feeds, final, aligned, measured, captured, inputs,
                 policy: CasePolicy, progress: Progress) -> Explanation:
    """Name the first divergence and its cause; when the outputs agree, warn about a hidden one."""
    if measured.ok:
        layers = None
        if _quantized(p):
            layers = _without_quantization_noise(p, runner, model_feeds, measured, captured, inputs, policy)
        return Explanation(warnings=tuple(hidden_divergence(layers or measured.layers)), layers=layers)
    layer, introduced = localize.first_divergence(measured.layers)
    skipped: tuple[str, ...] = ()
    if introduced and _quantized(p):
        layer, skipped = _beyond_quantization(p, runner, layer, measured, model_feeds, captured, inputs, policy)
    references, faithful = measured.cut.references, None
    if measured.reproduction is Reproduction.DIFFERENT:
        with progress.step("observe", "locating the divergence with faithful exposures"):
            def reproduces(values) -> bool:
                return reproduction_of(p.index, values, final, policy.tolerance)[0] is not Reproduction.DIFFERENT

            located = locate_faithfully(p, runner, aligned.pairs, model_feeds, reproduces, measured.compare)
        if located is not None:
            faithful, layer, introduced, references = located
    if layer is None:
        return Explanation(faithful=faithful, warnings=(
            "The final outputs diverge, but no aligned tensor does: the divergence lies after the "
            "last aligned tensor or in a part of the graph no activation maps to.",))
    cmp, tolerance, amp = measured.compare, policy.tolerance, None
    if not introduced and references is measured.cut.references:
        traced = trace_amplification(p, runner, measured, captured, tolerance, progress)
        if traced is not None:
            amp, layer, cmp, tolerance = traced
            introduced = True
    refined, ops = _narrowed(p, runner, layer, references, model_feeds, aligned.cuts, measured.layers, captured, inputs,
                             tolerance, cmp, progress) if introduced else (None, ())
    wide = _context(p, runner, layer, introduced, measured.layers, references, model_feeds, captured, inputs,
                    tolerance, cmp, refined.ops) if refined is not None else None
    if refined is not None:
        layer, references = refined.layer, refined.references
        layer, tolerance, cmp = _within_tolerance(refined.within, layer, tolerance, cmp)
    earlier = policy.memo.get(layer.pair.tensor, introduced) if policy.memo is not None else None
    if earlier is not None:
        first = dataclasses.replace(
            earlier, layer=layer, evidence={**earlier.evidence, "diagnosed_on_an_earlier_sample": True},
            explanation="(Diagnosed on an earlier sample that diverges at the same tensor.) " + earlier.explanation)
        return Explanation(first, faithful)
    ctx = _context(p, runner, layer, introduced, measured.layers, references, model_feeds, captured, inputs,
                   tolerance, cmp, refined.ops if refined is not None else ops)
    with progress.step("diagnose", "diagnosing the first divergence"):
        ctx, first, refined = _diagnosed(ctx, wide, refined, _quantized(p), not ops and introduced,
                                         lambda: ops_around(p, layer, references, aligned.cuts, inputs))
    repro = _repro(ctx, first, runner, policy, progress)
    if refined is not None or amp is not None:
        first = dataclasses.replace(first, within=refined.within if refined else None, amplification=amp)
    first = pinned_by_fix(first, p.index)
    if policy.memo is not None:
        policy.memo.keep(first)
    return Explanation(first, faithful, warnings=_passed_over(skipped), repro=repro)


def _diagnosed(ctx: DiagnosisContext, wide: DiagnosisContext | None, refined, quantized: bool, bare: bool,
               capture_ops):
    """The diagnosis of ``ctx``, and again where it names no cause or no confirmed one: as the wider segment it
    was narrowed from, with PyTorch's ops around a segment too small to narrow (``bare``: none captured), as a
    quantized segment's float twin; ``(context, divergence, refinement)``."""
    first = diagnose(ctx)
    if first.cause is Cause.UNKNOWN and wide is not None:
        ctx, first, refined = _wider(ctx, first, wide, refined)
    elif first.cause is Cause.UNKNOWN and refined is None and bare:
        ctx, first = _with_ops(ctx, first, capture_ops)
    if first.confirmed is not True and quantized:
        first = _in_float(ctx, first)
    return ctx, first, refined


def _narrowed(p: Prepared, runner: Runner, layer, references, model_feeds, cuts, layers, captured, inputs, tolerance,
              cmp, progress: Progress):
    """``refine``'s narrowing of ``layer`` to an op (in a quantized segment, of its float twin), not kept where it
    leaves behind a quantizer that clips; ``(refinement or None, PyTorch's ops around it)``."""
    refined, ops = refine(p, runner, layer, references, model_feeds, cuts, inputs, cmp, progress, lambda o: _float_twin(
        p, runner, layer, layers, references, model_feeds, captured, inputs, tolerance, cmp, o))
    if refined is not None and _clipping_left_behind(p, runner, layer, refined.layer, layers, references,
                                                     model_feeds, captured, inputs, tolerance, cmp):
        refined = None
    return refined, ops


def _repro(ctx: DiagnosisContext, first: Divergence, runner: Runner, policy: CasePolicy, progress: Progress):
    """The divergent segment cut out as a model of its own, when the policy asks for it."""
    if not policy.keep_repro:
        return None
    with progress.step("repro", "cutting the divergent segment out as a model of its own"):
        return build_repro(ctx, first, runner.backend.settings)


def _wider(ctx: DiagnosisContext, first: Divergence, wide: DiagnosisContext, refined):
    """An op-level segment no cause explains, diagnosed again as the module-level segment it was narrowed from:
    values can pair an op with the wrong one of two PyTorch ops (a Transpose whose permutation became the
    identity holds the value of the view before PyTorch's transpose, so the narrowed segment is the LayerNorm
    after it).  The wider diagnosis stands when its fix is confirmed by re-running; ``(ctx, first, refined)``."""
    wider = diagnose(dataclasses.replace(wide, focus=first.layer.segment))
    if wider.cause is Cause.UNKNOWN or wider.confirmed is not True:
        return ctx, first, refined
    return wide, dataclasses.replace(wider, evidence={**wider.evidence, "narrowed_segment_unexplained": list(
        first.layer.segment)}), None


def _with_ops(ctx: DiagnosisContext, first: Divergence, capture):
    """A segment too small to narrow that no cause explains, diagnosed again with PyTorch's ops around it (the
    bounds of a functional hardtanh no module holds; the op whose value an Identity hands on); that diagnosis
    stands when it names a cause (``first`` names none: an unconfirmed cause says more than none, where
    :func:`_wider` replaces a named one and asks for a confirmed fix)."""
    ops = capture()
    if not ops:
        return ctx, first
    again = dataclasses.replace(ctx, ops=ops)
    found = diagnose(again)
    return (again, found) if found.cause is not Cause.UNKNOWN else (ctx, first)


#: the share of the segment's error its float twin must keep to be diagnosed in float (less: the quantization,
#: a weight clipped by its scale say, made the rest)
KEPT_BY_TWIN = 0.5


def _in_float(ctx: DiagnosisContext, first: Divergence):
    """A quantized segment no confirmed fix explains, diagnosed again as its float twin (Q/DQ pairs undone,
    PyTorch's weights where rounding explains the file's): where the twin still diverges, the fault is in the float
    computation the quantized graph approximates (a Pad's constant, an index offset, a kernel's layout), and
    quantization noise hid its fix in the quantized segment.  The twin's diagnosis stands when its fix is confirmed
    there; quantization is not asked again (undoing it did not remove the divergence).  The repro stays cut
    from the user's file."""
    try:
        twin = float_twin(ctx)
        if twin is None:
            return first
        kept = ctx.compare(ctx.run_segment(twin.model, twin.weights, feeds=twin.feeds)[ctx.tensor], ctx.reference)
        if kept.ok or ctx.layer.local is None or kept.max_abs < KEPT_BY_TWIN * ctx.layer.local.max_abs:
            return first  # undoing the quantization removes (most of) the error: it is quantization's
        again = dataclasses.replace(ctx, onnx=OnnxModel(graph.index_graph(twin.model), twin.model, twin.weights))
        found = diagnose(again, skip=frozenset({Cause.QUANTIZATION}))
    except Exception:  # noqa: BLE001 - a twin that cannot be diagnosed leaves the quantized diagnosis
        return first
    if found.cause is Cause.UNKNOWN or found.confirmed is not True:
        return first
    note = ("Undoing the segment's quantization (its Q/DQ pairs made identities, PyTorch's float weights) does not "
            "remove the divergence, so quantization is not its cause; in that float computation: ")
    return dataclasses.replace(found, explanation=note + found.explanation,
                               evidence={**found.evidence, "diagnosed_in_float": True})


#: a confirmed fix naming at most this many nodes (a precision fix: the nodes to keep in float32) pins the segment
PINNED_AT_MOST = 12


def pinned_by_fix(first: Divergence, index) -> Divergence:
    """A confirmed fix that changes one node (of a segment too large to point at anything, or just outside it),
    keeps a few nodes in float32, or restores weights a few of its nodes read, says where the fault is: the
    segment becomes those nodes (``Divergence.fixed_nodes``), the one the divergence showed in kept as
    ``within``.  (The values may not say it: a permutation of the integer coordinates a relative position bias is
    gathered with — no float tensor holds PyTorch's value until the Gather; a float16 LayerNorm in a float32
    model, whose output is judged at float16's resolution, so the error shows only in the Linear after it.)"""
    fixed, segment = set(first.fixed_nodes), first.layer.segment
    if first.confirmed is not True or not fixed or len(fixed) > PINNED_AT_MOST:
        return first
    if first.cause is Cause.PRECISION:  # the nodes to keep in float32
        pinned = fixed != set(segment)
    elif first.cause is Cause.WEIGHT_MISMATCH:  # the nodes reading the restored weights
        # a weight read just past the segment (the bias an Add adds to its product; a norm's scale a few nodes on,
        # applied early inside the segment) pins it too
        past = [n for n in index.nodes if n.name in fixed - set(segment)]
        pinned = len(fixed) < len(segment) and fixed <= set(segment) or bool(past) and all(
            first.layer.pair.tensor in n.inputs for n in past) or bool(past) and len(fixed) <= KEPT_WHOLE \
            and bool(fixed & set(segment)) and {n.name for n in past} <= {
                n.name for n in index.downstream(first.layer.pair.tensor, PAST_AT_MOST)} or bool(past) and _beside(
                past, segment, index)
    else:
        # the nodes an edit changes (or they lie outside the segment: a Reshape before it), with the layout ops
        # next to them — two adjacent layout ops can each undo the other's fault, and the fix found may be the
        # neighbour's compensating change; a segment of a few nodes is kept whole
        fixed |= _layout_neighbours(fixed, set(segment), index)
        pinned = len(segment) > KEPT_WHOLE and len(fixed) < len(segment) or not fixed <= set(segment)
    if not pinned:
        return first
    nodes = [n for n in index.nodes if n.name in fixed]  # graph order
    layer = dataclasses.replace(first.layer, segment=tuple(n.name for n in nodes),
                                segment_ops=tuple(n.op_type for n in nodes))
    return dataclasses.replace(first, layer=layer, within=first.within or first.layer)


def _beside(past, segment, index) -> bool:
    """Whether the nodes ``past`` (in graph order) read what the segment's nodes read (through the Casts before
    them), or what such a node computes (its bias Add): the products of one input beside the segment's own (q, k
    and v projections whose weights one fix restores)."""
    def roots(node) -> set[str]:  # its computed inputs, followed up through Casts (one per reader in float16)
        return {index.carried_from(t) for t in node.inputs if t and not index.is_constant(t)}

    reached = {t for n in index.nodes if n.name in segment for t in (*n.inputs, *roots(n))
               if t and not index.is_constant(t)}
    for n in past:
        if not reached & (roots(n) | {t for t in n.inputs if t}):
            return False
        reached.update(o for o in n.outputs if o)
    return True


#: how far past a segment (nodes) a weight its fix restores may be read for the fix to pin the segment
PAST_AT_MOST = 16


#: a segment of at most this many nodes is kept whole when a fix changes some of them
KEPT_WHOLE = 3
#: at most this many layout neighbours of a fixed node join it (more: none of them undoes the node's change)
FEW_NEIGHBOURS = 2
#: ops that only move values: a wrong one can be undone by the next
LAYOUT_OPS = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Concat", "Split", "Slice",
                        "Gather", "Expand", "DepthToSpace", "SpaceToDepth", "Pad"})
#: layout ops whose input, laid out by the op before (a Pad's border), they select from: a shift in either is
#: undone by the other, inside the segment or just before it
SELECTING = frozenset({"Gather", "Slice"})


def _layout_neighbours(fixed: set[str], segment: set[str], index) -> set[str]:
    """The layout ops of ``segment`` that feed a fixed node or read its output directly, and the layout op
    (outside it too) whose output a fixed Gather or Slice selects from — unless there are more than
    :data:`FEW_NEIGHBOURS` of them (a stack of 16 time steps: its Unsqueezes undo no Concat order)."""
    found: set[str] = set()
    for node in (n for n in index.nodes if n.name in fixed):
        near = [index.node_of(t) for t in node.inputs if t] + [
            index.nodes[c] for t in node.outputs for c in index.consumers.get(t, ())]
        layout = {n.name for n in near if n is not None and n.name in segment and n.op_type in LAYOUT_OPS}
        source = node
        for _ in range(3):  # back through the selections (a Gather of a Gather: an unfold's two axes)
            if source is None or source.op_type not in SELECTING or not source.inputs:
                break
            source = index.node_of(source.inputs[0])
        found |= layout if len(layout) <= FEW_NEIGHBOURS else set()
        if source is not None and source is not node and source.op_type in LAYOUT_OPS \
                and source.op_type not in SELECTING:
            found.add(source.name)  # the padded or laid-out tensor a Gather's indices select from
    return found


def _passed_over(modules: tuple[str, ...]) -> tuple[str, ...]:
    if not modules:
        return ()
    listed = ", ".join(modules[:3]) + (f" and {len(modules) - 3} more" if len(modules) > 3 else "")
    return (f"{len(modules)} layer(s) before the first divergence exceed the tolerance by their quantization alone "
            f"({listed}): re-run without their Q/DQ pairs they agree with PyTorch, so that is the quantized model, "
            "not the fault. Raise the tolerance to the quantization's error to compare only what quantization "
            "does not explain.",)


def _within_tolerance(outer: LayerResult, region: LayerResult, tolerance: Tolerance, cmp):
    """A region whose own error is below the tolerance, found where the error of a segment that exceeds it
    enters (the rest of that segment amplifies it): judged, like an amplified error, against the tolerance
    divided by that gain, its local error restated against it.  ``(region, tolerance, compare)``, unchanged
    when the region exceeds the tolerance itself."""
    if (region.local is None or outer.local is None or not region.local.ok or not region.local.tol_ratio > 0
            or not outer.local.tol_ratio > 1):
        return region, tolerance, cmp
    scale = region.local.tol_ratio / outer.local.tol_ratio
    scaled = Tolerance(atol=tolerance.atol * scale, rtol=tolerance.rtol * scale)
    local = dataclasses.replace(region.local, tol_ratio=outer.local.tol_ratio, ok=False)
    return dataclasses.replace(region, local=local), scaled, amplify.plain_compare(scaled)


def trace_amplification(p: Prepared, runner: Runner, measured, captured, tolerance, progress: Progress):
    """When no segment exceeds the tolerance on its own: the segment whose error the layers after it amplify
    (see ``amplify``), as ``(amplification, its layer, the comparison and tolerance it is judged by)``; None
    when the error builds up over many segments."""
    references, upcasts = measured.cut.references, measured.cut.upcasts
    ordered = sorted((t for t in references if t not in upcasts), key=p.index.order_of)
    local = {r.pair.tensor: r.local.tol_ratio for r in measured.layers if r.local is not None}
    with progress.step("amplify", f"bisecting an amplified error over {len(ordered)} cut points"):
        switched = runner.switched(measured.cut.feeds, references)

        def run(cut):  # a float16 cut's float32 Cast is fed with it
            return switched(set(cut) | {up for up, t in upcasts.items() if t in cut})
        amp = amplify.bisect_amplification(run, ordered, amplify.outputs_ratio(captured, p.index, tolerance),
                                           lambda t: local.get(t, 0.0))
    if amp is None or not amp.local_ratio > 0:
        return None
    layer = amplify.amplified_layer(measured.layers, amp)
    if layer is None:
        return None
    scaled = amplify.amplified_tolerance(tolerance, amp)
    return amp, layer, amplify.plain_compare(scaled), scaled


def _float_twin(p: Prepared, runner: Runner, layer, layers, references, model_feeds, captured, inputs, tolerance,
                cmp, ops=()):
    """A quantized segment's float twin (see ``diagnose.float_twin``), in which refine pairs op values at float
    noise (PyTorch's ``ops`` give the float values of quantized constants no parameter holds); None for a
    segment without quantization."""
    if not _quantized(p):
        return None
    try:
        return float_twin(_context(p, runner, layer, True, layers, references, model_feeds, captured, inputs,
                                   tolerance, cmp, ops), relu_judged=True)
    except Exception:  # noqa: BLE001 - a twin that cannot be built leaves the quantized segment to refine
        return None


def _context(p: Prepared, runner: Runner, layer, introduced, layers, references, model_feeds, captured, inputs,
             tolerance, cmp, ops=()) -> DiagnosisContext:
    return DiagnosisContext(
        layer=layer, introduced=introduced, layers=layers, onnx=OnnxModel(p.index, p.skeleton, p.weights),
        baseline=Baseline(p.loaded, captured, inputs, p.reference_weights),
        cut=CutRun(references, model_feeds, runner.run_cut, runner.backend.settings),
        tolerance=tolerance, compare=cmp, ops=ops,
    )


#: at most this many layers of a quantized model whose outputs agree are re-run without their quantization
MAX_QUANTIZED_RERUNS = 64


def _quantized(p: Prepared) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear") for n in p.index.nodes)


#: at most this many layers of a diverging quantized model are re-run without their quantization to find the
#: first whose own error its quantization does not explain
MAX_QUANTIZED_SKIPS = 64


def _beyond_quantization(p: Prepared, runner: Runner, first: LayerResult, measured, model_feeds, captured, inputs,
                         policy: CasePolicy) -> tuple[LayerResult, tuple[str, ...]]:
    """In a quantized model, the first layer whose own error beyond the tolerance its quantization does not
    explain (re-run without its Q/DQ pairs, with PyTorch's weights where rounding explains the file's, it still
    differs): layers before it differ by their quantization step, which is the model, not the fault.  ``first``
    when every such error is quantization's (a clipping scale is then the fault, and named there).  With the
    modules of the layers passed over."""
    rows = sorted((r for r in measured.layers if r.origin is ErrorOrigin.INTRODUCED), key=lambda r: r.order)
    by_tensor: dict[str, list[LayerResult]] = {}
    for r in rows:
        by_tensor.setdefault(r.pair.tensor, []).append(r)
    passed: list[str] = []
    for same in list(by_tensor.values())[:MAX_QUANTIZED_SKIPS]:
        row = localize.first_divergence(tuple(same))[0]  # the innermost module computing that tensor
        ctx = _context(p, runner, row, True, measured.layers, measured.cut.references, model_feeds, captured,
                       inputs, policy.tolerance, measured.compare)
        if not explained_by_quantization(ctx) or clips(ctx):
            # beyond its quantization, or its quantization clips (a scale calibrated too small): the fault
            return row, tuple(passed)
        passed.append(row.pair.activation.module or "<model>")
    return first, ()


def _clipping_left_behind(p: Prepared, runner: Runner, layer: LayerResult, narrowed: LayerResult, layers,
                          references, model_feeds, captured, inputs, tolerance, cmp) -> bool:
    """Whether the segment holds a quantizer that clips (a scale calibrated too small) that the op it was
    narrowed to leaves out: in a quantized model the first op beyond the tolerance may differ by its rounding
    alone, before the clipping quantizer the error comes from."""
    if not _quantized(p):
        return False

    def clipping(row: LayerResult) -> bool:
        return clips(_context(p, runner, row, True, layers, references, model_feeds, captured, inputs, tolerance, cmp))
    try:
        return clipping(layer) and not clipping(narrowed)
    except Exception:  # noqa: BLE001 - a segment that cannot be re-run keeps the narrowing
        return False


def _quantization_explains(p: Prepared, runner: Runner, row: LayerResult, measured, model_feeds, captured, inputs,
                           policy: CasePolicy) -> bool:
    """Whether ``row``'s own error is its quantization (see ``diagnose.explained_by_quantization``)."""
    return explained_by_quantization(_context(p, runner, row, True, measured.layers, measured.cut.references,
                                              model_feeds, captured, inputs, policy.tolerance, measured.compare))


def _without_quantization_noise(p: Prepared, runner: Runner, model_feeds, measured, captured, inputs,
                                policy: CasePolicy) -> tuple[LayerResult, ...] | None:
    """The layers, with those whose own error their quantization explains (re-run without it, they agree)
    marked ``quantized`` (and, when that is every introduced error, the error they hand on): a quantized model
    whose outputs agree is not said to hide a fault in its layers. None when nothing changes."""
    introduced = [r for r in measured.layers if r.origin is ErrorOrigin.INTRODUCED][:MAX_QUANTIZED_RERUNS]
    noise = {id(r) for r in introduced
             if _quantization_explains(p, runner, r, measured, model_feeds, captured, inputs, policy)}
    if len(noise) == sum(r.origin is ErrorOrigin.INTRODUCED for r in measured.layers):
        # every error introduced beyond the tolerance is quantization (or none is): what the layers after
        # them inherit is quantization noise adding up
        noise |= {id(r) for r in measured.layers if r.origin is ErrorOrigin.INHERITED}
    if not noise:
        return None
    return tuple(dataclasses.replace(r, status=Status.QUANTIZED, origin=ErrorOrigin.NONE) if id(r) in noise else r
                 for r in measured.layers)


def hidden_divergence(layers: tuple[LayerResult, ...]) -> list[str]:
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


def locate_faithfully(p: Prepared, runner: Runner, pairs, model_feeds, reproduces, cmp):
    """The first divergence from exposures that keep the shipped outputs, with its local error.

    Returns ``(location, layer, introduced, references)`` or None.
    """
    # the tensors no input reaches (a weight standardised by ops of the model, a mask built from constants) agree
    # wherever the fault is, and would mislead a bisection over graph order
    live = p.index.input_fed
    ordered = sorted({q.tensor: q for q in pairs if q.cuttable and q.tensor in live}.values(),
                     key=lambda q: p.index.order_of(q.tensor))
    boundaries = frozenset(q.tensor for q in ordered if not q.activation.is_leaf)

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
    return location, layer, introduced, references
