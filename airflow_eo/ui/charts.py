"""Inline SVG charts of the UI page: rows per batch, lag over time, an interval table's time line (pure).

Each function returns one ``<svg>`` element as text: well-formed XML, every text escaped, no
script, no external reference, sized by its ``viewBox`` so it scales with the page (the page
sets its width). Colours are CSS classes (``bar``, ``line``, ``committed``, ``gap``,
``not-closed``) styled by the page.

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

WIDTH, HEIGHT = 720, 180
LEFT, BOTTOM, TOP = 56, 22, 10  # room for the axis labels


def _svg(label: str, body: list[str], height: int = HEIGHT) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" role="img" '
            f'aria-label="{escape(label)}" class="chart"><title>{escape(label)}</title>{"".join(body)}</svg>')


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


def _y_axis(top: float) -> list[str]:
    base = HEIGHT - BOTTOM
    return [f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{base}"/>',
            f'<line class="axis" x1="{LEFT}" y1="{base}" x2="{WIDTH}" y2="{base}"/>',
            f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end">{escape(_number(top))}</text>',
            f'<text x="{LEFT - 6}" y="{base}" text-anchor="end">0</text>']


def bar_chart(bars: Sequence[tuple[str, float, str]], label: str) -> str:
    """One bar per (x label, value, hover text), oldest left; the first and last x labels shown."""
    top = max((v for _, v, _ in bars), default=0) or 1
    span, base = WIDTH - LEFT - 4, HEIGHT - BOTTOM
    step = span / max(len(bars), 1)
    body = _y_axis(top)
    for i, (_, value, hover) in enumerate(bars):
        height = (base - TOP) * value / top
        x = LEFT + 2 + i * step
        body.append(f'<rect class="bar" x="{x:.1f}" y="{base - height:.1f}" width="{max(step * 0.8, 1):.1f}" '
                    f'height="{height:.1f}"><title>{escape(hover)}</title></rect>')
    for i in sorted({0, len(bars) - 1}) if bars else ():
        body.append(f'<text x="{LEFT + 2 + i * step + step * 0.4:.1f}" y="{HEIGHT - 6}" '
                    f'text-anchor="middle">{escape(bars[i][0])}</text>')
    return _svg(label, body)


def line_chart(points: Sequence[tuple[float, float, str]], label: str) -> str:
    """A line through (x, y, hover text) points, x in epoch ms; the first and last x as dates."""
    if not points:
        return _svg(label, [*_y_axis(1), f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle">no data</text>'])
    top = max(y for _, y, _ in points) or 1
    first, last = points[0][0], points[-1][0]
    width, base = WIDTH - LEFT - 8, HEIGHT - BOTTOM

    def at(x: float, y: float) -> tuple[float, float]:
        return LEFT + 4 + (width * (x - first) / (last - first) if last > first else width / 2), \
            base - (base - TOP) * y / top

    coords = [at(x, y) for x, y, _ in points]
    body = _y_axis(top)
    body.append('<polyline class="line" fill="none" points="' +
                " ".join(f"{cx:.1f},{cy:.1f}" for cx, cy in coords) + '"/>')
    for (cx, cy), (_, _, hover) in zip(coords, points):
        body.append(f'<circle class="point" cx="{cx:.1f}" cy="{cy:.1f}" r="2.5"><title>{escape(hover)}</title></circle>')
    body.append(f'<text x="{LEFT + 4}" y="{HEIGHT - 6}">{escape(utc(first))}</text>')
    if last > first:
        body.append(f'<text x="{WIDTH - 4}" y="{HEIGHT - 6}" text-anchor="end">{escape(utc(last))}</text>')
    return _svg(label, body)


_CLASS = {SpanState.COMMITTED: "committed", SpanState.GAP: "gap", SpanState.NOT_CLOSED: "not-closed"}


def time_line_strip(spans: Sequence[Span], label: str, height: int = 64) -> str:
    """An interval table's time line: committed intervals, gaps and the span not closed, scaled
    to their time; adjacent committed intervals drawn as one run (hover: how many)."""
    if not spans:
        return _svg(label, [f'<text x="{WIDTH / 2}" y="{height / 2}" text-anchor="middle">no interval committed</text>'],
                    height)
    runs: list[tuple[Span, int, int]] = []  # (first span, end ms, intervals merged)
    for s in spans:
        if runs and s.state is SpanState.COMMITTED and runs[-1][0].state is SpanState.COMMITTED:
            runs[-1] = (runs[-1][0], s.end_ms, runs[-1][2] + 1)
        else:
            runs.append((s, s.end_ms, 1))
    start, end = spans[0].start_ms, spans[-1].end_ms
    total, bar = max(end - start, 1), height - 26
    body = []
    for first, run_end, count in runs:
        x = 4 + (WIDTH - 8) * (first.start_ms - start) / total
        w = max((WIDTH - 8) * (run_end - first.start_ms) / total, 1.5)
        what = f"{count} committed intervals" if count > 1 else first.state.value
        hover = f"{what}: {utc(first.start_ms)} to {utc(run_end)}"
        body.append(f'<rect class="{_CLASS[first.state]}" x="{x:.1f}" y="4" width="{w:.1f}" height="{bar}">'
                    f'<title>{escape(hover)}</title></rect>')
    body.append(f'<text x="4" y="{height - 6}">{escape(utc(start))}</text>')
    body.append(f'<text x="{WIDTH - 4}" y="{height - 6}" text-anchor="end">{escape(utc(end))}</text>')
    return _svg(label, body, height)
