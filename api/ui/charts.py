"""Inline SVG line charts of the fleet's recent history (no chart library, no script needed)."""

from __future__ import annotations

from collections.abc import Sequence

from markupsafe import Markup, escape

from common.fleet_stats import Point

#: The chart's drawing area in SVG units (it scales to its box).
WIDTH, HEIGHT = 600, 120


def line_chart(points: Sequence[Point], field: str, label: str, unit: str) -> Markup:
    """A polyline of the points' `field` (gaps where it is None), captioned with its latest and peak."""
    values: list[float | None] = [getattr(p, field) for p in points]
    known = [v for v in values if v is not None]
    peak = max(known, default=0.0) or 1.0
    step = WIDTH / max(len(points) - 1, 1)
    segments: list[list[str]] = [[]]
    for i, v in enumerate(values):
        if v is None:
            if segments[-1]:
                segments.append([])
            continue
        segments[-1].append(f"{i * step:.1f},{HEIGHT - v / peak * (HEIGHT - 4):.1f}")
    lines = "".join(f'<polyline points="{" ".join(s)}"/>' for s in segments if s)
    latest = next((v for v in reversed(values) if v is not None), None)
    caption = f"{label}: {_fmt(latest)}{unit} now, peak {_fmt(max(known, default=None))}{unit}"
    return Markup(
        f'<figure class="chart"><svg viewBox="0 0 {WIDTH} {HEIGHT}" preserveAspectRatio="none" role="img" '
        f'aria-label="{escape(caption)}">{lines}</svg><figcaption>{escape(caption)}</figcaption></figure>')


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"
