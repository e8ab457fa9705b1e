"""The HTML report (``--html FILE``, ``report.to_html()``): one self-contained page that opens offline.

Hand-written: the plot is inline SVG (:mod:`.html_plot`), the table's sorting and filtering a small inline script,
the styles inline; nothing is fetched (a Content-Security-Policy forbids every request and lets only this page's
own script run, by its hash).  Every string from the model or a file (module, node and tensor names, messages
quoting them) is HTML-escaped, so a node named ``<script>…`` is text.
"""
from __future__ import annotations

import json
import math
from html import escape

from .. import __version__
from ..records import Cause, Divergence, LayerResult, MatrixReport, Report, Status, TensorDiff
from .html_assets import CSP, SCRIPT, STYLE
from .html_plot import Mark, Series, svg_plot
from .text import (NEIGHBOURHOOD, PROOF, computing_nodes, coverage_json, divergence_where, fmt_num, jsonable, narrowed_text,
                   reproduction_line, status_text)

ACCUMULATED, LOCAL = "#0969da", "#bc4c00"
PALETTE = ["#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#9a6700", "#1b7c83", "#bf3989", "#57606a", "#953800"]


def render_html(report: Report | MatrixReport) -> str:
    """The whole page for a single bisection or a verification matrix."""
    if isinstance(report, MatrixReport):
        from .html_matrix import matrix_body

        return page(f"onnx-bisect: {report.model_name}", matrix_body(report))
    return page(f"onnx-bisect: {report.model_name}", report_body(report))


def page(title: str, body: str) -> str:
    """A complete HTML document around ``body`` (already escaped)."""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<link rel=\"icon\" href=\"data:,\"><title>{escape(title)}</title><style>{STYLE}</style></head>"
            f"<body><main>{body}<footer>Written by onnx-bisect {escape(__version__)}; this file is self-contained "
            f"and works offline.</footer></main><script>{SCRIPT}</script></body></html>\n")


def report_body(report: Report) -> str:
    """The sections of a single bisection: verdict, cause, plot, coverage, layers, warnings."""
    tol = report.tolerance
    head = (f"<h1>onnx-bisect: {escape(report.model_name)}</h1><p class=\"sub\">{escape(report.exporter.value)} ONNX "
            f"(opset {report.opset}) on {escape(report.provider)}, against {escape(report.reference)}; tolerance "
            f"atol={tol.atol:g}, rtol={tol.rtol:g} (allclose: |onnx − ref| ≤ atol + rtol·|ref|)</p>")
    parts = [head, _verdict(report), _plot_section(report)]
    if report.first_divergence is not None:
        parts.append(divergence_card(report.first_divergence))
    parts += [_coverage(report), _layer_table(report), _messages(report.warnings, report.notes)]
    return "".join(parts)


def _verdict(report: Report) -> str:
    worst = max(report.outputs, key=lambda o: o.diff.tol_ratio, default=None)
    if worst is None:
        return '<div class="verdict bad"><strong>No output could be compared.</strong></div>'
    if report.ok:
        text = (f"OK: all {len(report.outputs)} output(s) agree with {report.reference} (worst max abs "
                f"{fmt_num(worst.diff.max_abs)}, {fmt_num(worst.diff.tol_ratio)}× the tolerance).")
    else:
        text = (f"DIVERGED: output '{worst.name}' differs from {report.reference} by max abs "
                f"{fmt_num(worst.diff.max_abs)} ({fmt_num(worst.diff.tol_ratio)}× the tolerance, max rel "
                f"{fmt_num(worst.diff.max_rel)}, cosine {worst.diff.cosine:.6f}).")
    rows = [[o.name, *_diff_cells(o.diff), "ok" if o.diff.ok else ("conditioned" if o.conditioned else "DIVERGED")]
            for o in report.outputs]
    return (f'<div class="verdict {"ok" if report.ok else "bad"}"><strong>{escape(text)}</strong></div>'
            + simple_table(["output", "max abs", "max rel", "× tolerance", "verdict"], rows)
            + f'<p class="muted">{escape(reproduction_line(report.reproduction, report.reproduction_max_abs, report.faithful))}</p>')


def divergence_card(fd: Divergence) -> str:
    """Where the first divergence is, its cause with the evidence, and the fix."""
    segment = ", ".join(computing_nodes(fd.layer)) or fd.layer.pair.node or "-"
    error = fd.layer.local if fd.introduced else fd.layer.diff
    own = ("introduced by this segment (its local error)" if fd.introduced
           else "accumulated (no single segment exceeds the tolerance)")
    lines = [f"<h2>First divergence</h2><div class=\"card\"><p><strong>{escape(divergence_where(fd))}</strong>"
             f"{escape(narrowed_text(fd))}</p><p>Segment nodes: <code>{escape(segment)}</code></p>"]
    if error is not None:
        lines.append(f"<p>Error {escape(own)}: max abs {fmt_num(error.max_abs)}, "
                     f"{fmt_num(error.tol_ratio)}× the tolerance.</p>")
    if fd.cause is Cause.UNKNOWN:
        lines.append(f"<p><strong>Cause: unknown.</strong> {escape(fd.explanation)}</p>")
    else:
        lines.append(f"<p><strong>Cause: {escape(fd.cause.value)}</strong> (confidence {fd.confidence:.0%}; "
                     f"{escape(PROOF[fd.confirmed])}). {escape(fd.explanation)}</p>")
        if fd.fix:
            lines.append(f'<div class="fix"><strong>Fix:</strong> {escape(fd.fix)}</div>')
    evidence = jsonable(fd.evidence)
    if evidence:
        rows = [[k, _short(json.dumps(v, ensure_ascii=False))] for k, v in evidence.items()]
        lines.append("<details open><summary>Evidence</summary>" + simple_table(["measure", "value"], rows)
                     + "</details>")
    return "".join(lines) + "</div>"


def _plot_section(report: Report) -> str:
    measured = [(i, r) for i, r in enumerate(report.layers) if r.diff is not None or r.local is not None]
    if not measured:
        return ""
    series = [Series("accumulated", ACCUMULATED, tuple(r.diff.tol_ratio if r.diff else None for _, r in measured)),
              Series("local: what its segment adds (0 not drawn)", LOCAL,
                     tuple(r.local.tol_ratio if r.local else None for _, r in measured), line=False, zeros=False)]
    first = _first_index(report)
    marks = [Mark(k, f"first divergence: {_layer_label(r)}") for k, (i, r) in enumerate(measured) if i == first]
    svg = svg_plot(series, [_tooltip(r) for _, r in measured], marks,
                   "Error along graph order, in units of the tolerance", targets=[i for i, _ in measured])
    return ("<h2>Error along the graph</h2>" + svg + '<p class="muted">Each column is a layer in graph order: '
            "<em>accumulated</em> is the plain ONNX run against the reference, <em>local</em> the error its segment "
            "adds when fed the reference's values (a dot per segment; none where it adds exactly 0). Log scale, 1× is "
            "the tolerance; an error below the axis is drawn on its floor, an infinite one as a triangle on its top. Hover a column for its numbers; "
            "click it to find it in the table.</p>")


def _first_index(report: Report) -> int | None:
    fd = report.first_divergence
    if fd is None:
        return None
    first = fd.within or fd.layer
    return next((i for i, r in enumerate(report.layers) if r is first), next(
        (i for i, r in enumerate(report.layers) if r.pair.tensor == first.pair.tensor and r.diff is not None), None))


def _layer_label(r: LayerResult) -> str:
    return f"{r.pair.activation.name or '<model>'} → {r.pair.node or '-'}"


def _tooltip(r: LayerResult) -> str:
    a = r.pair.activation
    lines = [f"{a.name} ({a.module_type}) → ONNX node {r.pair.node or '-'} ({r.pair.op_type or '-'})"]
    if r.diff is not None:
        lines.append(f"accumulated: max abs {fmt_num(r.diff.max_abs)}, {fmt_num(r.diff.tol_ratio)}× tolerance")
    if r.local is not None:
        lines.append(f"local: max abs {fmt_num(r.local.max_abs)}, {fmt_num(r.local.tol_ratio)}× tolerance")
    lines.append(status_text(r))
    return "\n".join(lines)


def _coverage(report: Report) -> str:
    c = coverage_json(report)
    if not c["leaf_activations"]:
        return ""
    methods = ", ".join(f"{k} {v}" for k, v in c["by_method"].items())
    absent = f" ({c['absent_from_graph']} absent from the graph)" if c["absent_from_graph"] else ""
    text = (f"<h2>Coverage</h2><div class=\"card\"><p>Leaf modules aligned: {c['aligned']}/{c['leaf_activations']}"
            f"{escape(absent)} ({c['fraction']:.1%}){'; by ' + escape(methods) if methods else ''}.</p>")
    unaligned = c["unaligned"]
    if unaligned:
        items = "".join(f"<li><code>{escape(u['module'])}</code> ({escape(u['module_type'])}): {escape(u['reason'])}"
                        "</li>" for u in unaligned[:30])
        more = f"<li>… and {len(unaligned) - 30} more (see the JSON coverage)</li>" if len(unaligned) > 30 else ""
        text += f"<p>Unaligned:</p><ul>{items}{more}</ul>"
    return text + "</div>"


LAYER_COLUMNS = [("#", "num"), ("module", ""), ("type", ""), ("ONNX node", ""), ("op", ""), ("shape", ""),
                 ("max abs", "num"), ("max rel", "num"), ("× tol", "num"), ("local", "num"), ("local × tol", "num"),
                 ("status", ""), ("match", "")]


def _layer_table(report: Report) -> str:
    layers = list(report.layers)
    if not layers:
        return ""
    first = _first_index(report)
    near = set(range(max(0, first - NEIGHBOURHOOD), first + NEIGHBOURHOOD + 1)) if first is not None else set()
    order = sorted(range(len(layers)), key=lambda i: (i not in near, i))
    head = "".join(f'<th data-type="{t or "text"}" scope="col">{escape(n)}</th>' for n, t in LAYER_COLUMNS)
    rows = "".join(_layer_row(i, layers[i], i == first, i in near) for i in order)
    what = ("the first divergence and its neighbourhood first, then the others in graph order"
            if near else "in graph order")
    return (f"<h2>Layers</h2><div class=\"controls\"><input type=\"search\" id=\"filter\" placeholder=\"filter "
            f"(module, node, op, status)\" aria-label=\"filter the layers\"><label><input type=\"checkbox\" "
            f"id=\"only-diverged\"> diverged only</label><span class=\"muted\">{len(layers)} layers, {what}; click a "
            f"column to sort.</span></div><table id=\"layers\"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>"
            "</table>")


def _layer_row(i: int, r: LayerResult, first: bool, near: bool) -> str:
    a, p = r.pair.activation, r.pair
    classes = " ".join(c for c, on in (("bad", r.status is Status.DIVERGED), ("first", first), ("near", near)) if on)
    shape = "x".join(map(str, a.value.shape)) or "scalar"
    cells = [_td(str(i), i), _td(a.name or "<model>"), _td(a.module_type), _td(p.node or "-"), _td(p.op_type or "-"),
             _td(shape), *(_num_td(v) for v in _numbers(r)), _td(status_text(r)), _td(p.method.value)]
    return f'<tr id="layer-{i}" class="{classes}">{"".join(cells)}</tr>'


def _numbers(r: LayerResult) -> list[float | None]:
    d, loc = r.diff, r.local
    return [d and d.max_abs, d and d.max_rel, d and d.tol_ratio, loc and loc.max_abs, loc and loc.tol_ratio]


def _td(text: str, value: float | None = None) -> str:
    sort = "" if value is None else f' data-v="{_sort_value(value)}"'
    return f"<td{sort}>{escape(text)}</td>"


def _num_td(value: float | None) -> str:
    if value is None:
        return '<td class="num" data-v="NaN">-</td>'
    return f'<td class="num" data-v="{_sort_value(value)}">{fmt_num(value)}</td>'


def _sort_value(x: float) -> str:
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity") if math.isinf(x) else repr(float(x))


def _diff_cells(d: TensorDiff) -> list[str]:
    return [fmt_num(d.max_abs), fmt_num(d.max_rel), fmt_num(d.tol_ratio)]


def simple_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain table of text cells (escaped)."""
    head = "".join(f"<th scope=\"col\">{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table class=\"simple\"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _messages(warnings: tuple[str, ...], notes: tuple[str, ...]) -> str:
    if not warnings and not notes:
        return ""
    items = [f"<li><strong>warning:</strong> {escape(w)}</li>" for w in warnings]
    items += [f"<li><strong>note:</strong> {escape(n)}</li>" for n in notes]
    return f"<h2>Warnings and notes</h2><ul>{''.join(items)}</ul>"


def _short(text: str, limit: int = 400) -> str:
    return text if len(text) <= limit else text[:limit] + " …"
