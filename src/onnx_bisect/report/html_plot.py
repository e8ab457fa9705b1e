"""The error-growth plot of the HTML report: hand-written inline SVG, log scale, in units of the tolerance.

One x position per layer in graph order; each series is a polyline with a dot per measured layer; the tolerance
(1×) is a dashed line; marks (the first divergence) are vertical lines with a label.  Hovering a layer's column
shows its tooltip (an SVG ``<title>``: module, node and numbers), with no script.  Every text is escaped.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

WIDTH, HEIGHT = 960, 340
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 28, 44
#: errors below this many tolerances are drawn on the floor of the plot
FLOOR = 1e-6


@dataclass(frozen=True)
class Series:
    """One line of the plot: its name, colour and one value per x position (None: not measured there)."""

    name: str
    colour: str
    values: tuple[float | None, ...]
    line: bool = True  # False: dots only (a value per layer that does not flow from one to the next)
    zeros: bool = True  # False: an exact 0 is not drawn (the tooltip still says it)


@dataclass(frozen=True)
class Mark:
    """A vertical line at an x position, labelled (the first divergence)."""

    index: int
    label: str
    colour: str = "#7b1fa2"


def svg_plot(series: list[Series], tooltips: list[str], marks: list[Mark], title: str,
             targets: list[int] | None = None, legend: bool = True) -> str:
    """The plot as an ``<svg>`` element; ``tooltips`` has one text per x position, ``targets`` the row each
    column leads to (``data-layer``), if any."""
    count = len(tooltips)
    lo, hi = _range([v for s in series for v in s.values])
    x = _xscale(count)
    y = _yscale(lo, hi)
    parts = [f'<svg id="plot" class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img"><title>{escape(title)}</title>',
             _axes(lo, hi, y, count)]
    parts += [_mark(m, x, y) for m in marks if 0 <= m.index < count]
    for s in series:
        parts.append(_line(s, x, y, lo, hi))
    parts.append(_bands(tooltips, x, targets))
    parts.append(_legend(series) if legend else "")
    parts.append("</svg>")
    return "".join(parts)


def _range(values: list[float | None]) -> tuple[float, float]:
    """Decades spanning the finite positive values and the tolerance line."""
    finite = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    lo = max(min(finite + [0.1]), FLOOR)
    hi = max(finite + [10.0])
    return 10.0 ** math.floor(math.log10(lo)), 10.0 ** math.ceil(math.log10(hi) + 1e-9)


def _xscale(count: int):
    span = WIDTH - LEFT - RIGHT
    return lambda i: LEFT + (span * (i + 0.5) / count if count else 0.0)


def _yscale(lo: float, hi: float):
    top, bottom = TOP, HEIGHT - BOTTOM
    a, b = math.log10(lo), math.log10(hi)
    return lambda v: bottom - (bottom - top) * (math.log10(min(max(v, lo), hi)) - a) / (b - a)


def _axes(lo: float, hi: float, y, count: int) -> str:
    """Frame, a gridline and label per decade, the tolerance line, the axis titles."""
    out = [f'<rect x="{LEFT}" y="{TOP}" width="{WIDTH - LEFT - RIGHT}" height="{HEIGHT - TOP - BOTTOM}" '
           'class="frame"/>']
    decades = range(round(math.log10(lo)), round(math.log10(hi)) + 1)
    step = max(1, math.ceil(len(decades) / 10))
    for d in list(decades)[::step]:
        yy = y(10.0 ** d)
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{yy:.1f}" y2="{yy:.1f}" class="grid"/>'
                   f'<text x="{LEFT - 6}" y="{yy + 4:.1f}" class="tick">1e{d}</text>')
    t = y(1.0)
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{t:.1f}" y2="{t:.1f}" class="tolerance"/>'
               f'<text x="{WIDTH - RIGHT - 4}" y="{t - 5:.1f}" class="tolerance-label">tolerance (1×)</text>')
    out.append(f'<text x="{(WIDTH + LEFT) / 2:.0f}" y="{HEIGHT - 10}" class="axis">{count} layers in graph order'
               '</text>'
               f'<text x="14" y="{(HEIGHT - BOTTOM + TOP) / 2:.0f}" class="axis" transform="rotate(-90 14 '
               f'{(HEIGHT - BOTTOM + TOP) / 2:.0f})">error / tolerance (log)</text>')
    return "".join(out)


def _line(s: Series, x, y, lo: float, hi: float) -> str:
    """A polyline through the measured values (broken where one is missing) and a dot on each; an infinite
    or NaN value is a triangle on the top edge."""
    runs, current, dots = [], [], []
    for i, v in enumerate(s.values):
        if v is None or (v == 0 and not s.zeros):
            if current:
                runs.append(current)
            current = []
            continue
        px, py = x(i), y(v if math.isfinite(v) else hi)
        current.append(f"{px:.1f},{py:.1f}")
        dots.append(f'<path d="M{px - 4:.1f},{py - 5:.1f}h8l-4,7z"/>' if not math.isfinite(v)
                    else f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.2"/>')
    runs += [current] if current else []
    lines = "".join(f'<polyline points="{" ".join(r)}" fill="none" stroke="{s.colour}" stroke-width="1.6"/>'
                    for r in runs if len(r) > 1 and s.line)
    return f'<g class="series" data-name="{escape(s.name)}">{lines}<g fill="{s.colour}">{"".join(dots)}</g></g>'


def _mark(m: Mark, x, y) -> str:
    px = x(m.index)
    anchor = "end" if px > WIDTH * 0.6 else "start"
    dx = -4 if anchor == "end" else 4
    return (f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{HEIGHT - BOTTOM}" class="mark" stroke="{m.colour}"/>'
            f'<text x="{px + dx:.1f}" y="{TOP + 14}" class="mark-label" fill="{m.colour}" '
            f'text-anchor="{anchor}">{escape(m.label)}</text>')


def _bands(tooltips: list[str], x, targets: list[int] | None) -> str:
    """An invisible column per layer carrying its tooltip, and the layer's row for the page's script."""
    if not tooltips:
        return ""
    width = (WIDTH - LEFT - RIGHT) / len(tooltips)
    return '<g class="bands">' + "".join(
        f'<rect x="{x(i) - width / 2:.2f}" y="{TOP}" width="{width:.2f}" height="{HEIGHT - TOP - BOTTOM}" '
        + ("" if targets is None else f'data-layer="{targets[i]}"')
        + f'><title>{escape(t)}</title></rect>' for i, t in enumerate(tooltips)) + "</g>"


def _legend(series: list[Series]) -> str:
    out, px = [], LEFT + 8
    for s in series:
        key = (f'<line x1="{px}" x2="{px + 18}" y1="{TOP - 10}" y2="{TOP - 10}" stroke="{s.colour}" stroke-width="2"'
               '/>' if s.line else f'<circle cx="{px + 9}" cy="{TOP - 10}" r="3" fill="{s.colour}"/>')
        out.append(f'{key}<text x="{px + 22}" y="{TOP - 6}" class="legend">{escape(s.name)}</text>')
        px += 30 + 7 * len(s.name)
    return "".join(out)
