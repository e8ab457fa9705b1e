"""Render a CoverageReport: a terminal table grouped by status, and the same as JSON."""
from __future__ import annotations

from typing import Any

from tabulate import tabulate

from .export_problems import format_problem
from .records import CoverageReport, FindingGroup, NodeFinding, RegistryState, Status

NAMES_SHOWN = 3
REASON_WIDTH = 160


def group_findings(findings: tuple[NodeFinding, ...]) -> list[FindingGroup]:
    """Collapse nodes with the same status, signature and reason; most severe and most frequent first."""
    groups: dict[tuple, list[NodeFinding]] = {}
    for f in findings:
        groups.setdefault((f.status, f.node.signature, f.reason), []).append(f)
    out = [FindingGroup(status, sig, reason, tuple(members)) for (status, sig, reason), members in groups.items()]
    return sorted(out, key=lambda g: (g.status.rank, -g.count, g.signature.label))


def render_text(report: CoverageReport, show_all: bool = False) -> str:
    """The terminal report."""
    lines = [_headline(report), *_providers(report)]
    if report.validation is not None:
        lines.append(_validation(report))
    if report.placement is not None:
        lines.append(_placement(report))
    lines += _exports(report)
    lines.append("")
    if report.findings:
        lines.append(_every_node(report) if show_all else _groups(report))
        lines.append("")
    lines.append(_summary(report))
    return "\n".join(lines) + "\n"


def _headline(report: CoverageReport) -> str:
    if not report.findings and report.export_failed:
        return f"Coverage of {report.target}: no exporter could export it, so there is no ONNX side to triage."
    opsets = ", ".join(f"{v.what} {v.version}" for v in report.validation.versions) if report.validation else ""
    versions = ", ".join(f"{k} {v}" for k, v in report.versions)
    return (f"Coverage of {report.target} ({report.onnx_source}): {len(report.findings)} nodes; {opsets}\n"
            f"Installed: {versions}")


def _providers(report: CoverageReport) -> list[str]:
    out = []
    for i, p in enumerate(report.providers):
        if p.state is RegistryState.KERNELS:
            state = f"{p.state.value}, {p.kernel_count} kernels"
        elif p.state is RegistryState.NO_STATIC_REGISTRY:
            state = f"{p.state.value}: placement read from a session"
        else:
            state = f"{p.state.value}: not assessed"
        implicit = " (not requested: ONNX Runtime's CPU fallback)" if p.implicit else ""
        out.append(f"{'Providers: ' if i == 0 else '           '}{p.name} ({state}){implicit}")
    return out


def _validation(report: CoverageReport) -> str:
    v = report.validation
    parts = [f"onnx.checker {'ok' if v.checker_error is None else 'FAILED: ' + v.checker_error}",
             f"shape inference {'ok' if v.inference_error is None else 'FAILED: ' + v.inference_error}"]
    for c in v.versions:
        limits = ", ".join(f"{who} ≤ {m}" for who, m in (("onnx", c.onnx_max), ("onnxruntime", c.ort_max))
                           if m is not None)
        parts.append(f"{c.what} {c.version} ({limits}){'' if c.ok else ' TOO NEW'}")
    parts += list(v.issues)
    return "Validation: " + "; ".join(parts)


def _placement(report: CoverageReport) -> str:
    p = report.placement
    if not p.attempted:
        return f"Placement: not confirmed ({p.note})"
    if p.error:
        return f"Placement: ONNX Runtime refuses the whole model: {p.error}"
    counts: dict[str, int] = {}
    for provider in p.assigned.values():
        counts[provider] = counts.get(provider, 0) + 1
    placed = ", ".join(f"{n} on {prov}" for prov, n in sorted(counts.items())) or "none placed"
    extra = [f"{len(p.failed)} refused"] if p.failed else []
    extra += [f"{len(p.expanded)} expanded or folded"] if p.expanded else []
    extra += [f"{len(p.probed)} probed in one-node sessions"] if p.probed else []
    note = f"; {p.note}" if p.note else ""
    return f"Placement (ONNX Runtime session, optimizations off): {placed}" + "".join(f", {e}" for e in extra) + note


def _exports(report: CoverageReport) -> list[str]:
    if not report.exports:
        return []
    lines = ["", "Export:"]
    for a in report.exports:
        status = "ok" if a.ok else "FAILED"
        head = f"  {a.exporter:<12} {status:<7} {a.seconds:5.1f}s"
        if a.ok:
            ops = ", ".join(f"{op} ×{n}" for op, n in a.onnx_ops[:8]) + (" …" if len(a.onnx_ops) > 8 else "")
            lines.append(f"{head}  opset {a.opset}: {ops}")
        else:
            lines.append(head)
        lines += [f"      {'warning' if not p.fatal else 'cannot export'}: {format_problem(p)}" for p in a.problems]
    return lines


def _groups(report: CoverageReport) -> str:
    rows = []
    for g in group_findings(report.findings):
        names = [f.node.display for f in g.findings]
        shown = ", ".join(names[:NAMES_SHOWN]) + (f" (+{len(names) - NAMES_SHOWN})" if len(names) > NAMES_SHOWN else "")
        rows.append([g.status.value, str(g.count), g.signature.label, shown, _clip(g.reason)])
    return tabulate(rows, headers=["status", "count", "operator", "nodes", "reason"], tablefmt="simple",
                    disable_numparse=True)


def _every_node(report: CoverageReport) -> str:
    ordered = sorted(report.findings, key=lambda f: (f.status.rank, f.node.index))
    rows = [[f.status.value, f.node.display, f.node.signature.label, f.runs_on or "-", _clip(f.reason)]
            for f in ordered]
    return tabulate(rows, headers=["status", "node", "operator", "runs on", "reason"], tablefmt="simple",
                    disable_numparse=True)


def _summary(report: CoverageReport) -> str:
    counts = ", ".join(f"{report.count(s)} {s.value}" for s in Status)
    blocked = []
    if report.export_failed:
        blocked.append("no exporter succeeded")
    if report.runtime_refused:
        blocked.append("ONNX Runtime refuses the model")
    if report.count(Status.UNSUPPORTED):
        blocked.append("some nodes cannot run on the requested providers")
    unassessed = [p.name for p in report.providers if p.state is RegistryState.NOT_IN_BUILD]
    tail = f" Not assessed: {', '.join(unassessed)} (registry not available in this build)." if unassessed else ""
    falls = report.count(Status.FALLS_BACK)
    requested = [p for p in report.providers if not p.implicit]
    if not blocked and requested and all(p.state is RegistryState.NOT_IN_BUILD for p in requested):
        verdict = "Not assessed: no requested provider is in this build; the rows show ONNX Runtime's CPU fallback"
    else:
        verdict = ("BLOCKED: " + "; ".join(blocked) if blocked else
                   "Every node can run" + (f", {falls} not where asked (falls back)" if falls else ""))
    return f"{verdict}. Nodes: {counts}.{tail}"


def _clip(text: str) -> str:
    return text if len(text) <= REASON_WIDTH else text[: REASON_WIDTH - 1] + "…"


# -- JSON ------------------------------------------------------------------------------


def to_json(report: CoverageReport, show_all: bool = False) -> dict[str, Any]:
    """The machine-readable report; statuses and enums become their string values here."""
    return {
        "target": report.target,
        "ok": report.exit_status == 0,
        "exit_status": report.exit_status,
        "onnx_source": report.onnx_source,
        "versions": dict(report.versions),
        "providers": [{"name": p.name, "state": p.state.value, "kernels": p.kernel_count, "implicit": p.implicit}
                      for p in report.providers],
        "validation": _validation_json(report),
        "placement": _placement_json(report),
        "export": [_attempt_json(a) for a in report.exports],
        "opset_target": report.opset_target,
        "summary": {s.value: report.count(s) for s in Status},
        "groups": [_group_json(g) for g in group_findings(report.findings)],
        "nodes": [_finding_json(f) for f in sorted(report.findings, key=lambda f: f.node.index)
                  if show_all or f.status is not Status.OK],
        "notes": list(report.notes),
        "timings": report.timings,
    }


def _validation_json(report: CoverageReport):
    v = report.validation
    if v is None:
        return None
    return {"ok": v.ok, "checker_error": v.checker_error, "inference_error": v.inference_error,
            "versions": [{"what": c.what, "version": c.version, "onnx_max": c.onnx_max, "ort_max": c.ort_max,
                          "ok": c.ok} for c in v.versions],
            "issues": list(v.issues)}


def _placement_json(report: CoverageReport):
    p = report.placement
    if p is None:
        return None
    return {"attempted": p.attempted, "error": p.error, "note": p.note, "placed": len(p.assigned),
            "refused": sorted(p.failed), "expanded": sorted(p.expanded), "probed": sorted(p.probed)}


def _attempt_json(a) -> dict[str, Any]:
    return {"exporter": a.exporter, "ok": a.ok, "seconds": round(a.seconds, 3), "opset": a.opset,
            "onnx_ops": dict(a.onnx_ops),
            "problems": [{"kind": p.kind.value, "operator": p.operator, "fatal": p.fatal, "message": p.message,
                          "file": p.source.file if p.source else None, "line": p.source.line if p.source else None,
                          "code": p.source.code if p.source else None} for p in a.problems]}


def _group_json(g: FindingGroup) -> dict[str, Any]:
    sig = g.signature
    return {"status": g.status.value, "domain": sig.domain, "op_type": sig.op_type,
            "since_version": sig.since_version, "input_types": list(sig.input_types), "count": g.count,
            "nodes": [f.node.display for f in g.findings], "reason": g.reason,
            "risks": sorted({s.value for f in g.findings[:1] for r in f.risks for s in r.slugs})}


def _finding_json(f: NodeFinding) -> dict[str, Any]:
    sig = f.node.signature
    return {
        "name": f.node.display, "key": f.node.key, "status": f.status.value, "domain": sig.domain,
        "op_type": sig.op_type, "since_version": sig.since_version, "input_types": list(sig.input_types),
        "graph": f.node.graph or None, "runs_on": f.runs_on, "confirmed": f.confirmed, "reason": f.reason,
        "kernels": {k.provider: {"verdict": k.verdict.value, "detail": k.detail} for k in f.kernels},
        "opset": None if f.opset is None else {"target": f.opset.target, "since_version": f.opset.since_version,
                                               "target_version": f.opset.target_version,
                                               "introduced": f.opset.introduced},
        "risks": [{"slugs": [s.value for s in r.slugs], "reason": r.reason} for r in f.risks],
    }
