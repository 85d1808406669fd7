"""The drawing half of ``bench.plots``: number formats and ticks, an SVG text
builder, and the chart kinds (horizontal bars, grouped bars, latency by
percentile). Plain SVG text, no plotting library; nothing here reads results.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

__all__ = ["AXIS", "Bar", "FONT", "Frame", "GRID", "INK", "MUTED", "PlotError", "Series",
           "Svg", "WIDTH", "fmt_num", "fmt_ratio", "grouped_bar_chart", "hbar_chart",
           "linear_ticks", "log_ticks", "nice_step", "nines", "percentile_chart", "wrap"]

WIDTH = 720
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK, MUTED, GRID, AXIS = "#1a1a1a", "#555555", "#e3e3e3", "#888888"


class PlotError(ValueError):
    """A result file that cannot be plotted: says which file and what is missing."""


# -- numbers -------------------------------------------------------------------------------
def fmt_num(v: float) -> str:
    """3 significant digits with k / M: 6733558 -> 6.73M, 138395.7 -> 138k, 9.58 -> 9.58."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return _sig3(v / div) + suffix
    return _sig3(v)


def _sig3(v: float) -> str:
    if v == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(v)))))
    text = f"{v:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ratio(v: float) -> str:
    return f"{v:,.0f}x" if v >= 100 else f"{v:.1f}x" if v >= 10 else f"{v:.2f}x"


def nice_step(span: float, n: int) -> float:
    """A step of 1, 2 or 5 x 10^k giving about ``n`` intervals over ``span``."""
    raw = span / max(1, n)
    mag: float = 10.0 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def linear_ticks(hi: float, n: int = 5) -> list[float]:
    """0, step, ... up to the first tick >= ``hi``."""
    if hi <= 0:
        return [0.0, 1.0]
    step = nice_step(hi, n)
    count = math.ceil(hi / step - 1e-9)
    return [round(i * step, 12) for i in range(count + 1)]


def log_ticks(lo: float, hi: float) -> list[float]:
    """1, 2, 5 x 10^k from below ``lo`` to above ``hi`` (only decades when that is many)."""
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    mults = (1.0,) if k1 - k0 > 4 else (1.0, 2.0, 5.0)
    ticks = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults]
    below = [t for t in ticks if t <= lo]
    above = [t for t in ticks if t >= hi]
    first, last = (below[-1] if below else ticks[0]), (above[0] if above else ticks[-1])
    return [t for t in ticks if first <= t <= last]


# -- SVG text ------------------------------------------------------------------------------
def _n(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".")


@dataclass
class Svg:
    """An SVG document built element by element."""

    title: str
    height: int
    width: int = WIDTH
    parts: list[str] = field(default_factory=list)

    def rect(self, x: float, y: float, w: float, h: float, fill: str, **attrs: str) -> None:
        tip = attrs.pop("tip", None)
        extra = "".join(f" {'class' if k == 'cls' else k.replace('_', '-')}={quoteattr(v)}"
                        for k, v in attrs.items())
        body = f"><title>{escape(tip)}</title></rect>" if tip else "/>"
        self.parts.append(f'<rect x="{_n(x)}" y="{_n(y)}" width="{_n(max(w, 0))}" '
                          f'height="{_n(max(h, 0))}" fill="{fill}"{extra}{body}')

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str = AXIS,
             width: float = 1, dash: str | None = None) -> None:
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.parts.append(f'<line x1="{_n(x1)}" y1="{_n(y1)}" x2="{_n(x2)}" y2="{_n(y2)}" '
                          f'stroke="{stroke}" stroke-width="{_n(width)}"{d}/>')

    def text(self, x: float, y: float, s: str, size: float = 12, anchor: str = "start",
             fill: str = INK, weight: str = "normal", cls: str = "label",
             rotate: bool = False) -> None:
        rot = f' transform="rotate(-90 {_n(x)} {_n(y)})"' if rotate else ""
        bold = ' font-weight="bold"' if weight != "normal" else ""
        self.parts.append(f'<text class="{cls}" x="{_n(x)}" y="{_n(y)}" font-size="{_n(size)}" '
                          f'text-anchor="{anchor}" fill="{fill}"{bold}{rot}>{escape(s)}</text>')

    def polyline(self, points: Sequence[tuple[float, float]], stroke: str, label: str,
                 width: float = 2) -> None:
        pts = " ".join(f"{_n(x)},{_n(y)}" for x, y in points)
        self.parts.append(f'<polyline class="series" data-label={quoteattr(label)} '
                          f'points="{pts}" fill="none" stroke="{stroke}" '
                          f'stroke-width="{_n(width)}" stroke-linejoin="round"/>')

    def circle(self, x: float, y: float, r: float, fill: str, tip: str) -> None:
        self.parts.append(f'<circle cx="{_n(x)}" cy="{_n(y)}" r="{_n(r)}" fill="{fill}">'
                          f"<title>{escape(tip)}</title></circle>")

    def render(self) -> str:
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}" '
                f'font-family="{FONT}" role="img">')
        return "\n".join([head, f"<title>{escape(self.title)}</title>",
                          f'<rect class="background" x="0" y="0" width="{self.width}" '
                          f'height="{self.height}" fill="#ffffff"/>', *self.parts, "</svg>\n"])


def wrap(text: str, width: int = 112) -> list[str]:
    """Words into lines of at most ``width`` characters."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


@dataclass
class Frame:
    """The parts every chart shares: title, subtitle, footer; and where the plot goes."""

    title: str
    subtitle: str
    footer: str
    plot_height: int
    left: int = 70
    right: int = 24

    def __post_init__(self) -> None:
        self.sub_lines = wrap(self.subtitle, 108)
        self.foot_lines = wrap(self.footer, 118)
        self.top = 34 + 16 * len(self.sub_lines) + 16
        self.bottom = self.top + self.plot_height  # the plot area's bottom edge
        self.height = self.bottom + 44 + 13 * len(self.foot_lines) + 8

    def svg(self) -> Svg:
        svg = Svg(self.title, self.height)
        svg.text(16, 26, self.title, size=16, weight="bold", cls="title")
        for i, line in enumerate(self.sub_lines):
            svg.text(16, 46 + 16 * i, line, size=12, fill=MUTED, cls="subtitle")
        y = self.bottom + 44
        svg.line(16, y - 8, WIDTH - 16, y - 8, stroke=GRID)
        for i, line in enumerate(self.foot_lines):
            svg.text(16, y + 6 + 13 * i, line, size=10, fill=MUTED, cls="footer")
        return svg


# -- chart kinds ---------------------------------------------------------------------------
@dataclass
class Bar:
    label: str
    value: float
    color: str
    note: str = ""  # after the value, at the bar's end


def hbar_chart(frame: Frame, bars: list[Bar], axis_label: str) -> str:
    """Horizontal bars on a linear axis from 0, each labelled with its value and note."""
    frame.left = max(120, 20 + 7 * max(len(b.label) for b in bars))
    svg = frame.svg()
    x0, x1 = frame.left, WIDTH - frame.right - 170
    slot = frame.plot_height / len(bars)
    hi = max(b.value for b in bars)
    ticks = linear_ticks(hi)

    def x(v: float) -> float:
        return x0 + (x1 - x0) * v / ticks[-1]

    for t in ticks:
        svg.line(x(t), frame.top, x(t), frame.bottom, stroke=GRID)
        svg.text(x(t), frame.bottom + 16, fmt_num(t), size=11, anchor="middle", fill=MUTED,
                 cls="tick")
    svg.text((x0 + x1) / 2, frame.bottom + 34, axis_label, size=12, anchor="middle",
             fill=MUTED, cls="axis-label")
    for i, b in enumerate(bars):
        y = frame.top + slot * i + slot * 0.2
        h = slot * 0.6
        w = max(2.0, x(b.value) - x0)  # a sliver stays visible
        svg.rect(x0, y, w, h, b.color, cls="bar", data_label=b.label,
                 data_value=f"{b.value:g}", tip=f"{b.label}: {b.value:,.1f}")
        svg.text(x0 - 8, y + h / 2 + 4, b.label, size=12, anchor="end", cls="bar-label")
        svg.text(x0 + w + 6, y + h / 2 + 4, fmt_num(b.value), size=12, weight="bold",
                 cls="value")
        if b.note:
            svg.text(x0 + w + 6 + 7.5 * len(fmt_num(b.value)) + 6, y + h / 2 + 4, b.note,
                     size=11, fill=MUTED, cls="note")
    svg.line(x0, frame.top, x0, frame.bottom, stroke=AXIS)
    svg.line(x0, frame.bottom, x1, frame.bottom, stroke=AXIS)
    return svg.render()


def grouped_bar_chart(frame: Frame, groups: list[str], series: list[tuple[str, str]],
                      values: list[list[float | None]], axis_label: str) -> str:
    """Vertical bars, one group per entry of ``groups``, one bar per series in each;
    ``values[g][s]`` (None: no bar)."""
    svg = frame.svg()
    x0, x1 = frame.left, WIDTH - frame.right
    hi = max((v for row in values for v in row if v is not None), default=1.0)
    ticks = linear_ticks(hi)

    def y(v: float) -> float:
        return frame.bottom - (frame.bottom - frame.top - 14) * v / ticks[-1]

    for t in ticks:
        svg.line(x0, y(t), x1, y(t), stroke=GRID)
        svg.text(x0 - 6, y(t) + 4, fmt_num(t), size=11, anchor="end", fill=MUTED, cls="tick")
    svg.text(18, (frame.top + frame.bottom) / 2, axis_label, size=12, anchor="middle",
             fill=MUTED, cls="axis-label", rotate=True)
    slot = (x1 - x0) / len(groups)
    bar_w = min(56.0, slot * 0.7 / len(series))
    for g, name in enumerate(groups):
        cx = x0 + slot * (g + 0.5)
        svg.text(cx, frame.bottom + 18, name, size=12, anchor="middle", cls="bar-label")
        for s, (sname, color) in enumerate(series):
            v = values[g][s]
            bx = cx - bar_w * len(series) / 2 + bar_w * s
            if v is None:
                svg.text(bx + bar_w / 2, frame.bottom - 4, "n/a", size=10, anchor="middle",
                         fill=MUTED, cls="value")
                continue
            top = min(y(v), frame.bottom - 2)  # a sliver stays visible
            svg.rect(bx + 2, top, bar_w - 4, frame.bottom - top, color, cls="bar",
                     data_label=f"{name} {sname}", data_value=f"{v:g}",
                     tip=f"{name} {sname}: {v:g}")
            svg.text(bx + bar_w / 2, top - 4, fmt_num(v), size=11, anchor="middle",
                     cls="value")
    _legend(svg, x1, frame.top - 4, series)
    svg.line(x0, frame.top, x0, frame.bottom, stroke=AXIS)
    svg.line(x0, frame.bottom, x1, frame.bottom, stroke=AXIS)
    return svg.render()


def _legend(svg: Svg, right: float, y: float, series: Sequence[tuple[str, str]]) -> None:
    """Swatches and names, right-aligned at ``right``, on the line ending at ``y``."""
    x = right
    for name, color in reversed(series):
        x -= 7 * len(name) + 8
        svg.text(x + 16, y, name, size=11, cls="legend")
        svg.rect(x + 2, y - 9, 10, 10, color, cls="swatch")
        x -= 12


@dataclass
class Series:
    name: str
    color: str
    points: list[tuple[float, float]]  # (x: nines, y: ms)
    marked: bool  # a marker and label on every point (few points)
    max_ms: float | None = None  # drawn as the last point, labelled "max"
    max_x: float | None = None


def nines(p: float) -> float:
    """A percentile on the "nines" scale: p50 -> 0.3, p90 -> 1, p99 -> 2, p99.9 -> 3."""
    return -math.log10(1 - p / 100)


def percentile_chart(frame: Frame, series: list[Series]) -> str:
    """Latency (ms, log scale when it spans > 20x) against the percentile, on the nines
    scale, so the tail gets room."""
    svg = frame.svg()
    x0, x1 = frame.left, WIDTH - frame.right - 30
    xs = [x for s in series for x, _ in s.points] + [s.max_x for s in series if s.max_x]
    ys = [y for s in series for _, y in s.points] + [s.max_ms for s in series if s.max_ms]
    ys = [v for v in ys if v > 0]
    if not ys:
        raise PlotError("no latency above 0 to plot")
    xmax = max(max(xs), 2.0) * 1.04
    lo, hi = min(ys), max(ys)
    log = hi / lo > 20
    ticks = log_ticks(lo, hi) if log else linear_ticks(hi)

    def px(v: float) -> float:
        return x0 + (x1 - x0) * v / xmax

    def py(v: float) -> float:
        span = frame.bottom - frame.top
        if log:
            a, b = math.log10(ticks[0]), math.log10(ticks[-1])
            return frame.bottom - span * (math.log10(max(v, ticks[0])) - a) / (b - a)
        return frame.bottom - span * v / ticks[-1]

    for t in ticks:
        svg.line(x0, py(t), x1, py(t), stroke=GRID)
        svg.text(x0 - 6, py(t) + 4, fmt_num(t), size=11, anchor="end", fill=MUTED, cls="tick")
    marked = {round(100 * (1 - 10 ** -x), 4) for s in series if s.marked for x, _ in s.points}
    shown = sorted({50, 90, 99, 99.9, 99.99, 99.999} | marked
                   | ({0} if any(not s.marked for s in series) else set()))
    for p in shown:
        if nines(p) <= xmax:
            svg.line(px(nines(p)), frame.top, px(nines(p)), frame.bottom, stroke=GRID)
            svg.text(px(nines(p)), frame.bottom + 16, f"p{p:g}", size=11, anchor="middle",
                     fill=MUTED, cls="tick")
    svg.text((x0 + x1) / 2, frame.bottom + 34, "percentile (nines scale: p90, p99, p99.9 "
             "equally spaced)", size=12, anchor="middle", fill=MUTED, cls="axis-label")
    svg.text(18, (frame.top + frame.bottom) / 2, "latency (ms" + (", log scale)" if log
             else ")"), size=12, anchor="middle", fill=MUTED, cls="axis-label", rotate=True)
    labelled: list[tuple[float, float]] = []
    for s in series:
        pts = [(px(x), py(y)) for x, y in s.points]
        if s.max_ms is not None and s.max_x is not None:
            pts.append((px(s.max_x), py(s.max_ms)))
        svg.polyline(_thin(pts), s.color, s.name)
        marks = list(zip(s.points, pts, strict=False)) if s.marked else []
        if s.max_ms is not None and s.max_x is not None:
            marks.append(((s.max_x, s.max_ms), pts[-1]))
        for i, ((xv, yv), (cx, cy)) in enumerate(marks):
            last = i == len(marks) - 1 and s.max_ms is not None
            tip = f"{s.name} {'max' if last else f'p{100 * (1 - 10 ** -xv):.4g}'}: {yv:g} ms"
            svg.circle(cx, cy, 3.5, s.color, tip)
            text = fmt_num(yv) + (" max" if last else "")
            ly = cy - 8
            if any(abs(ly - oy) < 12 and abs(cx - ox) < 40 for ox, oy in labelled):
                ly = cy + 16  # under the point when another label is there
            labelled.append((cx, ly))
            svg.text(cx, ly, text, size=10.5, anchor="middle", fill=s.color, cls="value")
    _legend(svg, x1 + 30, frame.top - 6, [(s.name, s.color) for s in series])
    svg.line(x0, frame.top, x0, frame.bottom, stroke=AXIS)
    svg.line(x0, frame.bottom, x1, frame.bottom, stroke=AXIS)
    return svg.render()


def _thin(points: list[tuple[float, float]], min_px: float = 1.5) -> list[tuple[float, float]]:
    """Drop points closer than ``min_px`` to the last kept one (keeps files small)."""
    out: list[tuple[float, float]] = []
    for p in points:
        if not out or p is points[-1] or math.dist(p, out[-1]) >= min_px:
            out.append(p)
    return out
