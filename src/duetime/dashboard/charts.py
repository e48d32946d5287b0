"""Bar charts as inline SVG, drawn on the server from plain numbers.

A ``Chart`` knows nothing of where its numbers come from (per-minute throughput, tasks
due per bucket, ...): callers build its columns, so the data source can change without
touching the drawing. Colours come from CSS classes in the stylesheet, never from inline
styles, which the Content-Security-Policy forbids.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup, escape


@dataclass(frozen=True, slots=True)
class Series:
    """One stacked layer of the bars: its name (in the hover text and legend) and the CSS
    class that colours it."""

    name: str
    css_class: str


@dataclass(frozen=True, slots=True)
class Column:
    """One bar: its hover label (e.g. the minute it covers) and one value per series."""

    label: str
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class Chart:
    title: str  # for screen readers
    series: tuple[Series, ...]
    columns: Sequence[Column]
    ticks: Sequence[tuple[int, str]]  # column index -> label under the axis
    empty_text: str = "nothing in this window"

    @property
    def total(self) -> float:
        return sum(sum(column.values) for column in self.columns)


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten that is at least ``value`` (1 for 0)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return float(step * power)
    return float(10 * power)  # pragma: no cover - the loop always returns


def _number(value: float) -> str:
    return f"{value:,.0f}" if value == int(value) else f"{value:,.1f}"


def render_svg(chart: Chart, width: int = 640, height: int = 150) -> Markup:
    """The chart as an ``<svg>`` element that scales to its container's width."""
    # Room for axis labels drawn up to twice as large on small screens (see the CSS).
    left, right, top, bottom = 44, 6, 14, 26
    plot_w, plot_h = width - left - right, height - top - bottom
    count = max(len(chart.columns), 1)
    slot = plot_w / count
    gap = min(2.0, slot * 0.2)
    peak = nice_ceiling(max((sum(c.values) for c in chart.columns), default=0))
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(chart.title)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for fraction in (0.0, 0.5, 1.0):
        y = top + plot_h * (1 - fraction)
        parts.append(
            f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>'
            f'<text class="axis" x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(_number(peak * fraction))}</text>"
        )
    for index, column in enumerate(chart.columns):
        x = left + index * slot + gap / 2
        hover = "; ".join(
            f"{series.name} {_number(value)}"
            for series, value in zip(chart.series, column.values, strict=True)
        )
        parts.append(f"<g><title>{escape(column.label)}: {escape(hover)}</title>")
        # A full-height hit area, so a hover shows the figures even over an empty minute.
        parts.append(
            f'<rect class="hit" x="{x:.1f}" y="{top}" width="{slot - gap:.1f}" height="{plot_h}"/>'
        )
        base = float(top + plot_h)
        for series, value in zip(chart.series, column.values, strict=True):
            if value <= 0:
                continue
            bar_h = max(plot_h * value / peak, 1.0)
            base -= bar_h
            parts.append(
                f'<rect class="bar {escape(series.css_class)}" x="{x:.1f}" y="{base:.1f}" '
                f'width="{slot - gap:.1f}" height="{bar_h:.1f}"/>'
            )
        parts.append("</g>")
    for index, label in chart.ticks:
        x = left + (index + 0.5) * slot
        anchor = "start" if index == 0 else "end" if index >= count - 1 else "middle"
        if anchor == "start":
            x = left
        elif anchor == "end":
            x = width - right
        parts.append(
            f'<text class="axis" x="{x:.1f}" y="{height - 5}" text-anchor="{anchor}">'
            f"{escape(label)}</text>"
        )
    if chart.total == 0:
        parts.append(
            f'<text class="empty" x="{left + plot_w / 2:.1f}" y="{top + plot_h / 2:.1f}" '
            f'text-anchor="middle">{escape(chart.empty_text)}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
