"""Report stage for a verification: the configuration matrix in the terminal and as JSON."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from typing import Any

from tabulate import tabulate

from ..records import (Cause, CaseKind, ConfigResult, ConfigStatus, Divergence, LayerAggregate, MatrixReport,
                      Reproduction, RuntimeSettings)
from .files import write_atomic
from .text import divergence_json, faithful_json, fmt_num, json_float

#: dataset samples listed one row each; more are folded into one row per runtime setting (--all lists them)
DATASET_ROWS = 8
#: layers listed per runtime setting in the dataset table
DATASET_LAYERS = 8

_REPRODUCTION = {Reproduction.EXACT: "exact", Reproduction.WITHIN_TOLERANCE: "within tol",
                 Reproduction.DIFFERENT: "DIFFERS", None: "-"}


def render_matrix(report: MatrixReport, show_all: bool = False) -> str:
    """Verdict, the configurations × outcome table, dataset per-layer worst cases, runtime agreement, notes."""
    parts = [headline(report), _matrix_table(report, show_all)]
    details = _divergence_details(report)
    if details:
        parts.append(details)
    if report.dataset:
        parts.append(_dataset_table(report, show_all))
    if report.agreements:
        parts.append(_agreement_table(report, show_all))
    skipped = sorted({(r.status.value, r.message) for r in report.results
                      if r.status in (ConfigStatus.UNAVAILABLE, ConfigStatus.ERROR) and r.message})
    parts += [f"{status}: {message}" for status, message in skipped]
    parts += [f"warning: {w}" for w in report.warnings]
    parts += [f"note: {n}" for n in report.notes]
    return "\n\n".join(p for p in parts if p) + "\n"


def headline(report: MatrixReport) -> str:
    """The verdict: what was verified, how many configurations agree, the dynamic dimensions."""
    tol = report.tolerance
    counts = Counter(r.status for r in report.results)
    cases = len({r.case for r in report.results})
    runtimes = len({r.runtime for r in report.results})
    head = (f"onnx-bisect: {report.model_name} — {report.exporter.value} ONNX (opset {report.opset}); "
            f"tolerance atol={tol.atol:g}, rtol={tol.rtol:g}")
    tally = ", ".join(f"{counts[s]} {s.value}" for s in ConfigStatus if counts.get(s))
    tested = counts.get(ConfigStatus.OK, 0) + counts.get(ConfigStatus.DIVERGED, 0) + counts.get(ConfigStatus.ERROR, 0)
    if not tested:
        verdict = "NOTHING VERIFIED: no configuration could run here."
    elif report.ok:
        verdict = f"OK: every tested configuration agrees with PyTorch ({tally})."
    else:
        verdict = f"DIVERGED in {counts.get(ConfigStatus.DIVERGED, 0) + counts.get(ConfigStatus.ERROR, 0)} " \
                  f"configuration(s) ({tally})."
    free = ", ".join(report.dynamic_axes) if report.dynamic_axes else "none (every input dimension is fixed)"
    return (f"{head}\n{cases} input case(s) × {runtimes} runtime setting(s) = {len(report.results)} "
            f"configurations. {verdict}\nDynamic input dimensions in the graph: {free}.")


MATRIX_HEADERS = ["runtime", "inputs", "status", "max abs (outputs)", "instrumented", "first divergence", "cause"]


def _matrix_table(report: MatrixReport, show_all: bool) -> str:
    return tabulate(matrix_rows(report, show_all), headers=MATRIX_HEADERS, tablefmt="simple", disable_numparse=True)


def matrix_rows(report: MatrixReport, show_all: bool) -> list[list[str]]:
    """One row per configuration (a dataset of many samples folded into one row per runtime unless
    ``show_all``), in the columns of ``MATRIX_HEADERS``."""
    rows = []
    for runtime, results in _by_runtime(report).items():
        dataset = [r for r in results if r.case.kind is CaseKind.DATASET]
        fold = len(dataset) > DATASET_ROWS and not show_all
        for r in results:
            if fold and r.case.kind is CaseKind.DATASET:
                if r is dataset[0]:
                    rows.append(_dataset_row(runtime, dataset))
                continue
            rows.append([runtime.label, r.case.label, _status(r), _max_abs(r), _REPRODUCTION[r.reproduction],
                         _where(r.first_divergence, r), _cause(r.first_divergence)])
    return rows


def _by_runtime(report: MatrixReport) -> dict[RuntimeSettings, list[ConfigResult]]:
    grouped: dict[RuntimeSettings, list[ConfigResult]] = defaultdict(list)
    for r in report.results:
        grouped[r.runtime].append(r)
    return grouped


def _dataset_row(runtime: RuntimeSettings, results: list[ConfigResult]) -> list[str]:
    """One row for a folded dataset: how many samples diverge, the worst one, the most common first node."""
    bad = [r for r in results if r.status in (ConfigStatus.DIVERGED, ConfigStatus.ERROR)]
    ran = [r for r in results if r.max_abs is not None]
    worst = max(ran, key=lambda r: r.max_abs, default=None)
    firsts = Counter((_where(r.first_divergence, r), _cause(r.first_divergence)) for r in bad)
    (where, cause), count = firsts.most_common(1)[0] if firsts else (("-", "-"), 0)
    status = f"{len(bad)}/{len(results)} diverged" if bad else f"{len(results)} ok"
    worst_text = f"{fmt_num(worst.max_abs)} ({worst.case.label})" if worst else "-"
    if count and count < len(bad):
        where += f" ({count} of {len(bad)})"
    return [runtime.label, f"dataset ({len(results)} samples)", status, worst_text, "-", where, cause]


def _status(r: ConfigResult) -> str:
    return "DIVERGED" if r.status is ConfigStatus.DIVERGED else r.status.value


def _max_abs(r: ConfigResult) -> str:
    return "-" if r.max_abs is None else fmt_num(r.max_abs)


def _where(fd: Divergence | None, r: ConfigResult) -> str:
    if fd is None:
        if r.status is ConfigStatus.DIVERGED:
            return "after the last aligned tensor"
        if r.status is ConfigStatus.UNTESTABLE:
            return r.message
        return "-"
    p = fd.layer.pair
    return f"{p.activation.name} ({p.activation.module_type}) → {p.node}"


def _cause(fd: Divergence | None) -> str:
    if fd is None:
        return "-"
    return fd.cause.value + ("" if fd.cause is Cause.UNKNOWN else f" ({fd.confidence:.0%})")


def distinct_divergences(report: MatrixReport) -> list[tuple[Divergence, list[str]]]:
    """Each distinct first divergence (by tensor and cause) once, with the configurations it occurs in."""
    seen: dict[tuple[str | None, str], list[str]] = {}
    texts: dict[tuple[str | None, str], Divergence] = {}
    for r in report.results:
        fd = r.first_divergence
        if fd is None:
            continue
        key = (fd.layer.pair.tensor, fd.cause)
        seen.setdefault(key, []).append(f"{r.runtime.label} {r.case.label}")
        texts.setdefault(key, fd)
    return [(texts[key], where) for key, where in seen.items()]


def _divergence_details(report: MatrixReport) -> str:
    """The explanation and fix of each distinct first divergence, once."""
    lines = []
    for fd, where in distinct_divergences(report):
        shown = ", ".join(where[:4]) + (f" … (+{len(where) - 4})" if len(where) > 4 else "")
        lines.append(f"* {fd.layer.pair.activation.name} → {fd.layer.pair.node} in {shown}: {fd.cause.value}. "
                     f"{fd.explanation}" + (f"\n  Fix: {fd.fix}" if fd.fix else ""))
    return "First divergences:\n" + "\n".join(lines) if lines else ""


DATASET_HEADERS = ["runtime", "module", "ONNX node", "worst max abs", "sample", "p99 max abs", "diverged"]


def _dataset_table(report: MatrixReport, show_all: bool) -> str:
    title = "Dataset, per layer over the samples" + ("" if show_all else
                                                    f" (the {DATASET_LAYERS} worst layers per runtime; --all: every layer)")
    return title + ":\n" + tabulate(dataset_rows(report, show_all), headers=DATASET_HEADERS, tablefmt="simple",
                                    disable_numparse=True)


def dataset_rows(report: MatrixReport, show_all: bool) -> list[list[str]]:
    """Per runtime, the dataset's worst layers (every layer with ``show_all``), in ``DATASET_HEADERS``."""
    rows = []
    by_runtime: dict[str, list[LayerAggregate]] = defaultdict(list)
    for a in report.dataset:
        by_runtime[a.runtime].append(a)
    for runtime, layers in by_runtime.items():
        shown = layers if show_all else sorted(
            sorted(layers, key=lambda a: (-a.diverged_samples, -a.worst_max_abs))[:DATASET_LAYERS],
            key=lambda a: a.order)
        for a in shown:
            rows.append([runtime, a.name, a.node or "-", fmt_num(a.worst_max_abs), str(a.worst_sample),
                         fmt_num(a.p99_max_abs), f"{a.diverged_samples}/{a.samples}"])
    return rows


AGREEMENT_HEADERS = ["runtimes", "inputs", "outputs", "max abs", "first difference"]


def _agreement_table(report: MatrixReport, show_all: bool) -> str:
    rows = agreement_rows(report, show_all)
    agreements = list(report.agreements)
    differ = sum(1 for a in agreements if not a.ok)
    title = (f"Runtime settings against each other: {differ} of {len(agreements)} comparisons differ"
             + ("" if show_all or len(rows) == len(agreements) else " (differences shown; --all: every one)"))
    return title + ":\n" + tabulate(rows, headers=AGREEMENT_HEADERS, tablefmt="simple", disable_numparse=True)


def agreement_rows(report: MatrixReport, show_all: bool) -> list[list[str]]:
    """The runtime settings compared with each other (the differing pairs unless ``show_all``)."""
    agreements = list(report.agreements)
    shown = agreements if show_all else [a for a in agreements if not a.ok] or agreements[:DATASET_ROWS]
    return [[f"{a.a} vs {a.b}", a.case, "agree" if a.ok else "DIFFER", fmt_num(a.max_abs),
             "-" if a.first_tensor is None else f"{a.first_module} → {a.first_node}"] for a in shown]


# ---------------------------------------------------------------- JSON


def matrix_to_json(report: MatrixReport) -> dict[str, Any]:
    """The machine-readable verification (stable keys; see the README)."""
    return {
        "ok": report.ok,
        "model": report.model_name,
        "exporter": report.exporter.value,
        "opset": report.opset,
        "tolerance": {"atol": report.tolerance.atol, "rtol": report.tolerance.rtol},
        "dynamic_axes": list(report.dynamic_axes),
        "summary": dict(Counter(r.status.value for r in report.results)),
        "configurations": [_result_json(r) for r in report.results],
        "dataset": [_aggregate_json(a) for a in report.dataset],
        "agreements": [{"a": a.a, "b": a.b, "inputs": a.case, "ok": a.ok, "max_abs": json_float(a.max_abs),
                        "first_tensor": a.first_tensor, "first_node": a.first_node, "first_module": a.first_module}
                       for a in report.agreements],
        "warnings": list(report.warnings),
        "notes": list(report.notes),
        "timings": {k: round(v, 4) for k, v in report.timings.items()},
        "peak_rss_mb": {k: round(v, 1) for k, v in report.peaks.items()},
    }


def _result_json(r: ConfigResult) -> dict[str, Any]:
    rt = r.runtime
    return {
        "inputs": r.case.label, "kind": r.case.kind.value, "sizes": dict(r.case.sizes), "sample": r.case.sample,
        "runtime": {"label": rt.label, "provider": rt.provider, "provider_options": dict(rt.provider_options),
                    "opt_level": rt.opt_level.value, "session_config": dict(rt.session_config)},
        "status": r.status.value,
        "max_abs": None if r.max_abs is None else json_float(r.max_abs),
        "outputs": [{"name": o.name, "max_abs": json_float(o.diff.max_abs), "max_rel": json_float(o.diff.max_rel),
                     "ok": o.diff.ok} for o in r.outputs],
        "first_divergence": divergence_json(r.first_divergence),
        "reproduction": None if r.reproduction is None else r.reproduction.value,
        "faithful_location": faithful_json(r.faithful),
        "message": r.message,
        "seconds": round(r.seconds, 4),
    }


def _aggregate_json(a: LayerAggregate) -> dict[str, Any]:
    return {"runtime": a.runtime, "module": a.name, "module_type": a.module_type, "onnx_node": a.node,
            "worst_max_abs": json_float(a.worst_max_abs), "worst_sample": a.worst_sample,
            "p99_max_abs": json_float(a.p99_max_abs), "diverged_samples": a.diverged_samples, "samples": a.samples}


def write_matrix_json(report: MatrixReport, path: str) -> None:
    """Write the JSON verification atomically."""
    write_atomic(path, json.dumps(matrix_to_json(report), indent=2) + "\n")
