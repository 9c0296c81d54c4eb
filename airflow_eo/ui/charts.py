"""Inline SVG charts of the UI page: rows per batch, lag over time, an interval table's time line (pure).

Each function returns one ``<svg>`` element as text: well-formed XML, every text escaped, no
script, no external reference, sized by its ``viewBox`` so it scales with the page (the page
sets its width; the view box is about as wide as a chart is shown, from a phone's 400 px to half
a wide window, so its text stays readable at both). Colours are CSS classes (``bar``, ``line``,
``committed``, ``gap``, ``not-closed``) styled by the page.

Axes say what they count and where they start and end: the y axis its top value and unit, the x
axis its first and last batch, or its first and last time written as precisely as it takes for
the two to differ (:func:`time_labels`). The time line strip stretches to its width and draws no
text: the page writes its ends beside it (:func:`strip_ends`).

Example::

    >>> svg = bar_chart([("1", 10, "batch 1: 10 rows"), ("2", 30, "batch 2: 30 rows")], "rows per batch")
    >>> svg.startswith("<svg") and svg.count('class="bar"')
    2
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape
from typing import Sequence

from airflow_eo.ui.tables import Span, SpanState

WIDTH, HEIGHT = 480, 210
LEFT, BOTTOM, TOP = 66, 44, 14  # room for the axis labels and the x axis' title (at the narrow layout's larger text)
X_LABEL = 18  # the x labels' baseline under the axis
STRIP_WIDTH = 1000  # the strip is stretched to the page's width (preserveAspectRatio="none")


def _svg(label: str, body: list[str], height: int = HEIGHT, width: int = WIDTH, css: str = "chart",
         stretch: bool = False) -> str:
    aspect = ' preserveAspectRatio="none"' if stretch else ""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}"{aspect} role="img" '
            f'aria-label="{escape(label)}" class="{css}"><title>{escape(label)}</title>{"".join(body)}</svg>')


def _number(value: float) -> str:
    """Compact axis labels: 950, 12.5k, 3.2M."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{value:g}"


def utc(ms: float) -> str:
    """An epoch-ms time as the page writes it (UTC, to the minute).

    >>> utc(1772582400000)
    '2026-03-04 00:00'
    """
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%d %H:%M")


def time_labels(first_ms: float, last_ms: float) -> tuple[str, str]:
    """The x axis' two end labels of a time chart, in UTC: to the minute, or to the second when
    that is what tells them apart; the second without the date it shares with the first.

    >>> time_labels(1772582400000, 1772589600000)
    ('2026-03-04 00:00', '02:00')
    >>> time_labels(1772582400000, 1772582430000)
    ('2026-03-04 00:00:00', '00:00:30')
    >>> time_labels(1772582400000, 1772755200000)
    ('2026-03-04 00:00', '2026-03-06 00:00')
    """
    first, last = (datetime.fromtimestamp(v / 1000, tz=timezone.utc) for v in (first_ms, last_ms))
    precise = "%H:%M" if f"{first:%Y%m%d%H%M}" != f"{last:%Y%m%d%H%M}" else "%H:%M:%S"
    same_day = f"{first:%Y%m%d}" == f"{last:%Y%m%d}"
    return first.strftime(f"%Y-%m-%d {precise}"), last.strftime(precise if same_day else f"%Y-%m-%d {precise}")


def strip_ends(spans: Sequence[Span]) -> tuple[str, str]:
    """Where an interval table's time line starts and ends, as the page writes them beside the strip."""
    return (utc(spans[0].start_ms), utc(spans[-1].end_ms)) if spans else ("", "")


def _axes(top: float, unit: str, x_title: str) -> list[str]:
    """Both axes: the y axis' top value with its unit and 0, the x axis' title under it."""
    base = HEIGHT - BOTTOM
    return [f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/>',
            f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{WIDTH}" y2="{base}"/>',
            f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end">{escape(_number(top))}</text>',
            f'<text x="{LEFT - 6}" y="{TOP + 30}" text-anchor="end" class="unit">{escape(unit)}</text>',
            f'<text x="{LEFT - 6}" y="{base}" text-anchor="end">0</text>',
            f'<text x="{(LEFT + WIDTH) / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle" class="unit">'
            f'{escape(x_title)}</text>']


def _x_label(x: float, text: str, anchor: str) -> str:
    return f'<text x="{x:.1f}" y="{HEIGHT - BOTTOM + X_LABEL}" text-anchor="{anchor}">{escape(text)}</text>'


def bar_chart(bars: Sequence[tuple[str, float, str]], label: str, unit: str = "rows", x_title: str = "batch") -> str:
    """One bar per (x label, value, hover text), oldest left; the first and last x labels shown."""
    top = max((v for _, v, _ in bars), default=0) or 1
    span, base = WIDTH - LEFT - 4, HEIGHT - BOTTOM
    step = span / max(len(bars), 1)
    body = _axes(top, unit, x_title)
    for i, (_, value, hover) in enumerate(bars):
        height = (base - TOP) * value / top
        x = LEFT + 2 + i * step
        body.append(f'<rect class="bar" x="{x:.1f}" y="{base - height:.1f}" width="{max(step * 0.8, 1):.1f}" '
                    f'height="{height:.1f}"><title>{escape(hover)}</title></rect>')
    if bars:
        body.append(_x_label(LEFT + 2, bars[0][0], "start"))
    if len(bars) > 1:
        body.append(_x_label(WIDTH - 2, bars[-1][0], "end"))
    return _svg(label, body)


def line_chart(points: Sequence[tuple[float, float, str]], label: str, unit: str = "records",
               x_title: str = "time (UTC)") -> str:
    """A line through (x, y, hover text) points, x in epoch ms; the first and last x as times that
    differ (:func:`time_labels`)."""
    if not points:
        return _svg(label, [*_axes(1, unit, x_title),
                            f'<text x="{(LEFT + WIDTH) / 2:.0f}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>'])
    top = max(y for _, y, _ in points) or 1
    first, last = points[0][0], points[-1][0]
    width, base = WIDTH - LEFT - 8, HEIGHT - BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        return LEFT + 4 + (width * (x - first) / (last - first) if last > first else width / 2), \
            base - (base - TOP) * y / top

    coords = [at(x, y) for x, y, _ in points]
    body = _axes(top, unit, x_title)
    body.append('<polyline class="line" fill="none" points="' +
                " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords) + '"/>')
    for (cx, cy), (_, _, hover) in zip(coords, points):
        body.append(f'<circle class="point" cx="{cx:.1f}" cy="{cy:.1f}" r="3"><title>{escape(hover)}</title></circle>')
    if last > first:
        start, end = time_labels(first, last)
        body += [_x_label(LEFT + 4, start, "start"), _x_label(WIDTH - 4, end, "end")]
    else:  # one time: under its point
        body.append(_x_label(coords[0][0], time_labels(first, first)[0], "middle"))
    return _svg(label, body)


_CLASS = {SpanState.COMMITTED: "committed", SpanState.GAP: "gap", SpanState.NOT_CLOSED: "not-closed"}


def time_line_strip(spans: Sequence[Span], label: str, height: int = 40) -> str:
    """An interval table's time line: committed intervals, gaps and the span not closed, scaled
    to their time; adjacent committed intervals drawn as one run (hover: how many). Stretched to
    the page's width, without text (its ends: :func:`strip_ends`)."""
    if not spans:
        return _svg(label, [], height, STRIP_WIDTH, "strip", stretch=True)
    runs: list[tuple[Span, int, int]] = []  # (first span, end ms, intervals merged)
    for s in spans:
        if runs and s.state is SpanState.COMMITTED and runs[-1][0].state is SpanState.COMMITTED:
            runs[-1] = (runs[-1][0], s.end_ms, runs[-1][2] + 1)
        else:
            runs.append((s, s.end_ms, 1))
    start, end = spans[0].start_ms, spans[-1].end_ms
    total = max(end - start, 1)
    body = []
    for first, run_end, count in runs:
        x = STRIP_WIDTH * (first.start_ms - start) / total
        w = max(STRIP_WIDTH * (run_end - first.start_ms) / total, 1.5)
        what = f"{count} committed intervals" if count > 1 else first.state.value
        hover = f"{what}: {utc(first.start_ms)} to {utc(run_end)}"
        body.append(f'<rect class="{_CLASS[first.state]}" x="{x:.1f}" y="0" width="{w:.1f}" height="{height}">'
                    f'<title>{escape(hover)}</title></rect>')
    return _svg(label, body, height, STRIP_WIDTH, "strip", stretch=True)
