"""An SVG chart of a run: replicas, queues and p95 TTFT over simulated time, in three panels.

Plain SVG 1.1 written by hand (no plotting package): every element is well-formed XML, every
coordinate finite, and a gap in a series (no requests in a bucket) breaks its line.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

WIDTH, PANEL_HEIGHT, LEFT, RIGHT, TOP, GAP = 900, 170, 70, 20, 40, 45
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


def _fmt(value: float) -> str:
    return f"{value:.1f}"


def _polyline(points: list[tuple[float, float]], colour: str) -> str:
    if len(points) == 1:
        x, y = points[0]
        return f'<circle cx="{_fmt(x)}" cy="{_fmt(y)}" r="2" fill="{colour}"/>'
    path = " ".join(f"{_fmt(x)},{_fmt(y)}" for x, y in points)
    return f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{path}"/>'


def _panel(top: float, title: str, times: Sequence[float],
           series: Sequence[tuple[str, Sequence[float | None]]], end_seconds: float) -> list[str]:
    plot_width = WIDTH - LEFT - RIGHT
    values = [v for _, column in series for v in column if v is not None]
    ceiling = max(values, default=0.0) or 1.0
    parts = [f'<text x="{LEFT}" y="{_fmt(top - 8)}" font-size="13" font-weight="bold">'
             f'{escape(title)}</text>',
             f'<rect x="{LEFT}" y="{_fmt(top)}" width="{plot_width}" height="{PANEL_HEIGHT}" '
             f'fill="none" stroke="#999"/>',
             f'<text x="{LEFT - 6}" y="{_fmt(top + 10)}" font-size="11" text-anchor="end">'
             f'{ceiling:.3g}</text>',
             f'<text x="{LEFT - 6}" y="{_fmt(top + PANEL_HEIGHT)}" font-size="11" '
             f'text-anchor="end">0</text>']

    def x_of(seconds: float) -> float:
        return LEFT + plot_width * (seconds / end_seconds if end_seconds > 0 else 0.0)

    def y_of(value: float) -> float:
        return top + PANEL_HEIGHT * (1 - value / ceiling)

    for number, (name, column) in enumerate(series):
        colour = COLOURS[number % len(COLOURS)]
        run: list[tuple[float, float]] = []
        for moment, value in zip(times, column, strict=True):
            if value is None:
                if run:
                    parts.append(_polyline(run, colour))
                run = []
                continue
            run.append((x_of(moment), y_of(value)))
        if run:
            parts.append(_polyline(run, colour))
        legend_x = LEFT + plot_width - 180 * (len(series) - number)
        parts.append(f'<text x="{_fmt(legend_x)}" y="{_fmt(top - 8)}" font-size="11" '
                     f'fill="{colour}">{escape(name)}</text>')
    return parts


def render_svg(report: dict[str, Any]) -> str:
    """The chart of `report` (from `build_report`) as an SVG document."""
    timeline = report["timeline"]
    times = timeline["times_seconds"]
    end = max(times, default=0.0)
    queue = [a + w for a, w in zip(timeline["admission_queue"], timeline["engine_waiting"],
                                   strict=True)]
    panels = [
        ("replicas", [("ready", timeline["ready_replicas"]),
                      ("warming", timeline["warming_replicas"])]),
        ("queued requests", [("admission + engine queues", queue),
                             ("running", timeline["running"])]),
        ("latency (seconds)", [("p95 TTFT", timeline["p95_ttft_seconds"])]),
    ]
    height = TOP + len(panels) * (PANEL_HEIGHT + GAP) + 30
    title = (f"{report['trace']['path'].rsplit('/', 1)[-1]}: {report['fleet']['model']} on "
             f"{report['fleet']['gpu']}, routing {report['config']['routing']}")
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
             f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif">',
             f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
             f'<text x="{LEFT}" y="20" font-size="14">{escape(title)}</text>']
    for number, (name, series) in enumerate(panels):
        top = TOP + 20 + number * (PANEL_HEIGHT + GAP)
        parts += _panel(top, name, times, series, end)
    parts.append(f'<text x="{WIDTH - RIGHT}" y="{height - 8}" font-size="11" text-anchor="end">'
                 f'simulated seconds (0 to {end:.0f})</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_chart(report: dict[str, Any], path: Path) -> None:
    """Write the SVG chart of `report` to `path`."""
    path.write_text(render_svg(report), encoding="utf-8")
