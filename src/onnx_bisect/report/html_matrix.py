"""The HTML page of a verification (``MatrixReport``): the verdict, the configuration matrix, each distinct first
divergence with its cause and fix, the accumulated error of every configuration along the graph, the dataset's
worst layers and the runtime settings against each other."""
from __future__ import annotations

from html import escape

from ..records import ConfigStatus, MatrixReport
from .html import PALETTE, divergence_card, simple_table
from .html_plot import Series, svg_plot
from .matrix import (AGREEMENT_HEADERS, DATASET_HEADERS, MATRIX_HEADERS, agreement_rows, dataset_rows,
                     distinct_divergences, headline, matrix_rows)
from .text import fmt_num

#: configurations drawn in the plot at most (the diverging ones first)
PLOTTED = 10


def matrix_body(report: MatrixReport) -> str:
    """The sections of a verification page."""
    lines = headline(report).splitlines()
    bad = not report.ok or not report.tested
    parts = [f"<h1>onnx-bisect: {escape(report.model_name)}</h1><p class=\"sub\">{escape(lines[0])}</p>",
             f'<div class="verdict {"bad" if bad else "ok"}"><strong>{escape(lines[1] if len(lines) > 1 else "")}'
             f"</strong><br>{escape(' '.join(lines[2:]))}</div>",
             "<h2>Configurations</h2>" + simple_table(MATRIX_HEADERS, matrix_rows(report, show_all=True))]
    for fd, where in distinct_divergences(report):
        shown = ", ".join(where[:6]) + (f" … (+{len(where) - 6})" if len(where) > 6 else "")
        parts.append(divergence_card(fd).replace("<h2>First divergence</h2>",
                                                 f"<h2>First divergence in {escape(shown)}</h2>", 1))
    parts.append(_plot(report))
    if report.dataset:
        parts.append("<h2>Dataset, per layer over the samples</h2>"
                     + simple_table(DATASET_HEADERS, dataset_rows(report, show_all=True)))
    if report.agreements:
        parts.append("<h2>Runtime settings against each other</h2>"
                     + simple_table(AGREEMENT_HEADERS, agreement_rows(report, show_all=True)))
    skipped = sorted({(r.status.value, r.message) for r in report.results
                      if r.status in (ConfigStatus.UNAVAILABLE, ConfigStatus.ERROR) and r.message})
    items = [f"<li><strong>{escape(s)}:</strong> {escape(m)}</li>" for s, m in skipped]
    items += [f"<li><strong>warning:</strong> {escape(w)}</li>" for w in report.warnings]
    items += [f"<li><strong>note:</strong> {escape(n)}</li>" for n in report.notes]
    if items:
        parts.append(f"<h2>Messages</h2><ul>{''.join(items)}</ul>")
    return "".join(parts)


def _plot(report: MatrixReport) -> str:
    """Each configuration's accumulated error per layer (the diverging configurations first)."""
    ran = [r for r in report.results if r.layer_errors]
    if not ran:
        return ""
    ran = sorted(ran, key=lambda r: r.status is not ConfigStatus.DIVERGED)[:PLOTTED]
    columns: dict[str, tuple[float, str]] = {}
    for r in ran:
        for e in r.layer_errors:
            columns.setdefault(e.tensor, (e.order, f"{e.name} ({e.module_type}) → ONNX node {e.node or '-'}"))
    order = sorted(columns, key=lambda t: columns[t][0])
    series, tips = [], {t: [columns[t][1]] for t in order}
    for k, r in enumerate(ran):
        by_tensor = {e.tensor: e for e in r.layer_errors}
        label = f"{r.runtime.label} {r.case.label}"
        series.append(Series(label, PALETTE[k % len(PALETTE)],
                             tuple(by_tensor[t].tol_ratio if t in by_tensor else None for t in order)))
        for t in order:
            if t in by_tensor:
                e = by_tensor[t]
                tips[t].append(f"{label}: max abs {fmt_num(e.max_abs)}, {fmt_num(e.tol_ratio)}× tolerance")
    svg = svg_plot(series, ["\n".join(tips[t]) for t in order], [], "Accumulated error per configuration",
                   legend=False)
    legend = "".join(f'<li><span style="color:{s.colour}">&#9632;</span> {escape(s.name)}</li>' for s in series)
    more = len([r for r in report.results if r.layer_errors]) - len(ran)
    return ("<h2>Error along the graph, per configuration</h2>" + svg + f'<ul class="legend">{legend}</ul>'
            + '<p class="muted">Accumulated error of each '
            "configuration's layers in graph order, in units of the tolerance (log scale; 1× is the tolerance)."
            + (f" {more} more configuration(s) not drawn." if more > 0 else "") + "</p>")
