"""Report stage: the terminal table, the plain-words verdict and the JSON document."""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any

from tabulate import tabulate

from .files import write_atomic
from ..records import (Amplification, Cause, Divergence, MatchMethod, ErrorOrigin, FaithfulLocation, LayerResult, Report, Reproduction, Status,
                      TensorDiff)

NEIGHBOURHOOD = 6
SMALL_MODEL_ROWS = 40


def render_text(report: Report, show_all: bool = False) -> str:
    """Verdict first, then the layer table (neighbourhood of the divergence by default)."""
    parts = [_verdict(report)]
    table = _table(report, show_all)
    if table:
        parts.append(table)
    parts.append(_summary(report))
    unaligned = [r for r in leaf_rows(report.layers) if r.status is Status.UNMATCHED]
    if unaligned:
        shown = "\n".join(f"  {r.pair.activation.name} ({r.pair.activation.module_type}): {r.pair.note}"
                          for r in unaligned[:8])
        more = f"\n  … and {len(unaligned) - 8} more (see the JSON coverage)" if len(unaligned) > 8 else ""
        parts.append(f"Unaligned leaf modules:\n{shown}{more}")
    for w in report.warnings:
        parts.append(f"warning: {w}")
    for n in report.notes:
        parts.append(f"note: {n}")
    return "\n\n".join(parts) + "\n"


def _verdict(report: Report) -> str:
    tol = report.tolerance
    worst = max(report.outputs, key=lambda o: o.diff.tol_ratio, default=None)
    head = (f"onnx-bisect: {report.model_name} — {report.exporter.value} ONNX (opset {report.opset}) "
            f"on {report.provider}; tolerance atol={tol.atol:g}, rtol={tol.rtol:g}")
    if worst is None:
        return head + "\nNo output could be compared."
    if report.ok:
        conditioned = sum(o.conditioned for o in report.outputs)
        within = (f"; {conditioned} beyond the tolerance by float32 rounding alone, as close to a float64 run as "
                  f"{report.reference} — see the note") if conditioned else ""
        return head + (f"\nOK: all {len(report.outputs)} output(s) agree with {report.reference} "
                       f"(worst max abs {worst.diff.max_abs:.3g}, max rel {worst.diff.max_rel:.3g}{within}).")
    lines = [head, f"DIVERGED: output '{worst.name}' differs from {report.reference} by max abs "
                   f"{fmt_num(worst.diff.max_abs)} (max rel {fmt_num(worst.diff.max_rel)}, "
                   f"cosine {worst.diff.cosine:.6f})."]
    fd = report.first_divergence
    if fd is not None:
        p = fd.layer.pair
        computing = computing_nodes(fd.layer)
        nodes = ", ".join(computing[:6]) + (f" … (+{len(computing) - 6})" if len(computing) > 6 else "")
        lines.append(f"First divergence: {divergence_where(fd)}. Segment nodes: {nodes or p.node}{narrowed_text(fd)}.")
        if fd.amplification is not None:
            lines.append(amplification_text(fd.amplification))
        if fd.cause is Cause.UNKNOWN:
            lines.append(f"Cause: unknown. {fd.explanation}")
        else:
            lines.append(f"Cause: {fd.cause} (confidence {fd.confidence:.0%}; {PROOF[fd.confirmed]}). {fd.explanation}")
            if fd.fix:
                lines.append(f"Fix: {fd.fix}")
    return "\n".join(lines)


def computing_nodes(layer: LayerResult) -> list[str]:
    """The segment's nodes that compute (its Constant nodes hold data, like initializers, and are left out)."""
    return [n for n, op in zip(layer.segment, layer.segment_ops) if op != "Constant"] if layer.segment_ops \
        else list(layer.segment)


def amplification_text(amp: Amplification) -> str:
    """How an error below the tolerance was traced: its own size, the gain after it, the bisection's runs."""
    carried = (f"this segment's own error is {amp.local_ratio:.2g}× the tolerance, and the layers after it amplify "
               f"it about {amp.gain:.3g}×" if amp.local_ratio < 1 else
               f"this segment carries most of the outputs' error (its own error is {amp.local_ratio:.2g}× the "
               "tolerance)")
    return (f"Amplified: {carried}: computing freely from here on, the outputs differ by "
            f"{amp.output_ratio:.3g}× the tolerance; with this segment fed PyTorch's value too, by "
            f"{amp.output_ratio_without:.2g}× (bisected over {amp.cut_points} cut points in {amp.runs} runs). "
            f"The cause below is judged against the tolerance divided by {amp.gain:.3g}.")


#: what re-running the segment with the fix applied showed
PROOF = {True: "confirmed: re-running with the fix removes the divergence",
         False: "not confirmed: re-running with the fix did not remove the divergence",
         None: "a hypothesis: the fix could not be re-run automatically"}


def divergence_where(fd: Divergence) -> str:
    """``module bn1 (BatchNorm2d) → ONNX node node_Conv_40 (Conv), tensor 'getitem'`` (or the op, when narrowed)."""
    p = fd.layer.pair
    who = (f"op {p.activation.module_type} in module {p.activation.module or '<model>'}"
           if p.method is MatchMethod.OP_VALUE else f"module {p.activation.name} ({p.activation.module_type})")
    return f"{who} → ONNX node {p.node} ({p.op_type}), tensor '{p.tensor}'"


def narrowed_text(fd: Divergence) -> str:
    """`` (narrowed from the N-node segment computing X)`` when the divergence was narrowed to an op, else ``""``;
    for a segment pinned to the nodes a confirmed fix changes, says so."""
    if fd.within is None:
        return ""
    wider = f"the {len(computing_nodes(fd.within))}-node segment computing {fd.within.pair.activation.name}"
    if (fd.fixed_nodes and set(fd.layer.segment) == set(fd.fixed_nodes)
            and not set(fd.layer.segment) <= set(fd.within.segment)):
        return f" (the nodes the confirmed fix changes; the divergence shows in {wider})"
    return f" (narrowed from {wider})"


def _table(report: Report, show_all: bool) -> str:
    layers = list(report.layers)
    if not layers:
        return ""
    fd = report.first_divergence
    first = _row_of(layers, (fd.within or fd.layer) if fd else None)
    if show_all or len(layers) <= SMALL_MODEL_ROWS:
        rows = layers
    elif first is not None:
        i = layers.index(first)
        rows = layers[max(0, i - NEIGHBOURHOOD): i + NEIGHBOURHOOD + 1]
    else:
        rows = sorted(sorted((r for r in layers if r.diff), key=lambda r: -r.diff.tol_ratio)[:10], key=lambda r: r.order)
    body = [_row(r, r is first) for r in rows]
    title = "" if rows is layers else (
        f"(showing {len(rows)} of {len(layers)} layers: "
        + ("the neighbourhood of the first divergence" if first is not None else "the 10 largest errors")
        + "; --all shows every layer)\n")
    return title + tabulate(body, headers=["", "module", "ONNX node", "op", "shape", "max abs", "max rel", "local", "status"],
                            tablefmt="simple", disable_numparse=True)


def _row_of(layers: list[LayerResult], layer: LayerResult | None) -> LayerResult | None:
    """The table's row of ``layer`` (the diagnosis may restate a row's numbers: an amplified error's local
    error against the tolerance it leaves)."""
    if layer is None:
        return None
    return next((r for r in layers if r is layer), None) or next((r for r in layers if r.pair == layer.pair), None)


def _row(r: LayerResult, is_first: bool) -> list[str]:
    p = r.pair
    return [
        ">>" if is_first else "",
        _clip(p.activation.name, 48),
        _clip(p.node or "-", 36),
        p.op_type or "-",
        "x".join(map(str, p.activation.value.shape)) or "scalar",
        fmt_num(r.diff.max_abs) if r.diff else "-",
        fmt_num(r.diff.max_rel) if r.diff else "-",
        fmt_num(r.local.max_abs) if r.local else "-",
        status_text(r),
    ]


def status_text(r: LayerResult) -> str:
    """``matched``, ``fused``, ``unmatched``, ``quantized``, ``reordered``, ``conditioned``, ``diverged
    (introduced)`` or ``diverged (inherited)``."""
    if r.status is Status.DIVERGED:
        return r.status.value + (" (introduced)" if r.origin is ErrorOrigin.INTRODUCED else " (inherited)")
    return r.status.value


def leaf_rows(layers) -> list[LayerResult]:
    """The rows of leaf-module activations (not the root, containers or exported-program ops)."""
    return [r for r in layers if r.pair.activation.is_leaf and r.pair.activation.module and not r.pair.activation.op]


def leaf_coverage(layers) -> tuple[int, int, int]:
    """``(aligned, total, absent)`` over leaf-module activations.

    ``absent`` counts leaves with no node in a scoped graph at all (pruned as
    unused, or folded into a constant): there is nothing to align them with.
    """
    leaves = leaf_rows(layers)
    aligned = sum(1 for r in leaves if r.pair.tensor is not None or r.status is Status.FUSED)
    absent = sum(1 for r in leaves if r.status is Status.UNMATCHED and r.pair.absent is not None)
    return aligned, len(leaves), absent


def _summary(report: Report) -> str:
    counts = Counter(r.status for r in report.layers)
    methods = Counter(r.pair.method.value for r in report.layers if r.pair.tensor is not None)
    aligned, total, absent = leaf_coverage(report.layers)
    how = ", ".join(f"{k} {v}" for k, v in methods.most_common())
    return (f"{len(report.layers)} activations: " + ", ".join(f"{counts.get(s, 0)} {s.value}" for s in Status
                                                        if s not in (Status.QUANTIZED, Status.REORDERED) or counts.get(s))
            + f". Leaf modules aligned: {aligned}/{total}"
            + (f" ({absent} absent from the graph)" if absent else "") + (f"; by {how}." if how else ".")
            + "\n" + reproduction_line(report.reproduction, report.reproduction_max_abs, report.faithful))


def reproduction_line(verdict: Reproduction, max_abs: float, faithful: FaithfulLocation | None) -> str:
    """Whether the instrumented run computed the shipped outputs, and how the divergence was then located."""
    text = {
        Reproduction.EXACT: "The instrumented run reproduces the unmodified model's outputs bit for bit.",
        Reproduction.WITHIN_TOLERANCE: ("The instrumented run reproduces the unmodified model's outputs within "
                                        f"tolerance, not bit for bit (max abs {fmt_num(max_abs)})."),
        Reproduction.DIFFERENT: ("The instrumented run does NOT reproduce the unmodified model's outputs "
                                 f"(max abs {fmt_num(max_abs)}): exposing tensors changed ONNX Runtime's "
                                 "optimisations."),
    }[verdict]
    if faithful is not None:
        text += (f" The divergence was located with {faithful.runs} run(s) exposing few tensors each, every one "
                 f"reproducing the shipped outputs: last agreeing tensor '{faithful.last_good or 'the inputs'}', "
                 f"first diverging tensor '{faithful.first_bad}'"
                 + (f"; {len(faithful.unobservable)} tensor(s) could not be observed without changing the "
                    "outputs (inside a fusion)" if faithful.unobservable else "") + ".")
    return text


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


def fmt_num(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.3g}")


def to_json(report: Report) -> dict[str, Any]:
    """The machine-readable report (stable keys; see the README)."""
    fd = report.first_divergence
    return {
        "ok": report.ok,
        "model": report.model_name,
        "tolerance": {"atol": report.tolerance.atol, "rtol": report.tolerance.rtol},
        "exporter": report.exporter.value,
        "opset": report.opset,
        "provider": report.provider,
        "reference": report.reference,
        "outputs": [{"name": o.name, "max_abs": json_float(o.diff.max_abs), "max_rel": json_float(o.diff.max_rel),
                     "cosine": json_float(o.diff.cosine), "sqnr_db": json_float(o.diff.sqnr_db), "ok": o.agrees,
                     "conditioned": o.conditioned}
                    for o in report.outputs],
        "first_divergence": divergence_json(fd),
        "reproduction": {"verdict": report.reproduction.value, "max_abs": json_float(report.reproduction_max_abs)},
        "faithful_location": faithful_json(report.faithful),
        "coverage": coverage_json(report),
        "layers": [_layer_json(r) for r in report.layers],
        "warnings": list(report.warnings),
        "notes": list(report.notes),
        "timings": {k: round(v, 4) for k, v in report.timings.items()},
        "peak_rss_mb": {k: round(v, 1) for k, v in report.peaks.items()},
    }


def divergence_json(fd: Divergence | None) -> dict[str, Any] | None:
    """The first divergence as JSON (module, ONNX nodes and tensor, errors, cause and evidence)."""
    if fd is None:
        return None
    return {
        "module": fd.layer.pair.activation.module,
        "module_name": fd.layer.pair.activation.name,
        "module_type": fd.layer.pair.activation.module_type,
        "op": fd.layer.pair.activation.module_type if fd.layer.pair.activation.op else None,
        "onnx_nodes": computing_nodes(fd.layer) or ([fd.layer.pair.node] if fd.layer.pair.node else []),
        "onnx_constants": [n for n, op in zip(fd.layer.segment, fd.layer.segment_ops) if op == "Constant"],
        "onnx_node": fd.layer.pair.node,
        "onnx_tensor": fd.layer.pair.tensor,
        "op_types": sorted(set(fd.layer.segment_ops)) or ([fd.layer.pair.op_type] if fd.layer.pair.op_type else []),
        "max_abs": json_float(fd.layer.diff.max_abs) if fd.layer.diff else None,
        "local_max_abs": json_float(fd.layer.local.max_abs) if fd.layer.local else None,
        "introduced": fd.introduced,
        "cause": fd.cause.value,
        "confidence": fd.confidence,
        "evidence": jsonable(fd.evidence),
        "fix": fd.fix,
        "confirmed": fd.confirmed,
        "fixed_nodes": list(fd.fixed_nodes),
        "explanation": fd.explanation,
        "amplification": None if fd.amplification is None else {
            "local_tolerance_ratio": json_float(fd.amplification.local_ratio),
            "gain": json_float(fd.amplification.gain),
            "outputs_tolerance_ratio": json_float(fd.amplification.output_ratio),
            "outputs_tolerance_ratio_without": json_float(fd.amplification.output_ratio_without),
            "runs": fd.amplification.runs, "cut_points": fd.amplification.cut_points},
        "narrowed_from": None if fd.within is None else {
            "module": fd.within.pair.activation.module, "onnx_tensor": fd.within.pair.tensor,
            "onnx_nodes": computing_nodes(fd.within)},
    }


def faithful_json(location: FaithfulLocation | None) -> dict[str, Any] | None:
    """How the divergence was located when exposing every tensor changed the shipped outputs."""
    if location is None:
        return None
    return {"last_good": location.last_good, "first_bad": location.first_bad, "runs": location.runs,
            "unobservable": list(location.unobservable), "boundaries_faithful": location.boundaries_faithful}


def coverage_json(report: Report) -> dict[str, Any]:
    """The leaf-module alignment summary: counts, methods, and each unaligned leaf with its reason."""
    aligned, total, absent = leaf_coverage(report.layers)
    leaves = leaf_rows(report.layers)
    return {
        "leaf_activations": total,
        "aligned": aligned,
        "absent_from_graph": absent,
        "fraction": round(aligned / (total - absent), 4) if total - absent else 1.0,
        "by_method": dict(Counter(r.pair.method.value for r in leaves if r.pair.method.value != "none")),
        "unaligned": [{"module": r.pair.activation.name, "module_type": r.pair.activation.module_type,
                       "reason": r.pair.note} for r in leaves if r.status is Status.UNMATCHED],
    }


def _layer_json(r: LayerResult) -> dict[str, Any]:
    p = r.pair
    a = p.activation
    return {
        "module": a.module, "name": a.name, "call": a.call, "output": a.path, "module_type": a.module_type,
        "onnx_tensor": p.tensor, "onnx_node": p.node, "op_type": p.op_type,
        "shape": list(a.value.shape), "match": p.method.value, "confidence": p.confidence, "note": p.note,
        "max_abs": _diff(r.diff, "max_abs"), "max_rel": _diff(r.diff, "max_rel"),
        "mean_abs": _diff(r.diff, "mean_abs"), "cosine": _diff(r.diff, "cosine"),
        "sqnr_db": _diff(r.diff, "sqnr_db"), "dtype": r.diff.dtype if r.diff else None,
        "ulps": r.diff.ulps if r.diff else None,
        "local_max_abs": _diff(r.local, "max_abs"), "local_max_rel": _diff(r.local, "max_rel"),
        "status": r.status.value, "origin": r.origin.value, "segment": list(r.segment),
    }


def _diff(d: TensorDiff | None, key: str):
    return None if d is None else json_float(getattr(d, key))


def jsonable(value):
    """Evidence values (numpy scalars/arrays, nested containers) as JSON values."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "tolist"):
        return jsonable(value.tolist())
    if isinstance(value, float):
        return json_float(value)
    return value


def json_float(x: float):
    """JSON has no inf/nan: write them as strings."""
    return x if math.isfinite(x) else str(x)


def write_json(report: Report, path: str) -> None:
    """Write the JSON report atomically."""
    write_atomic(path, json.dumps(to_json(report), indent=2) + "\n")
