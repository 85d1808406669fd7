"""SVG charts of benchmark results, drawn by hand (plain SVG text, no plotting library).

    .venv/bin/python -m bench.plots --out docs/img bench/out/room-<stamp>.json \\
        bench/out/chat-<stamp>.json

Each JSON file (what a benchmark wrote to ``bench/out/``) is recognised by its contents:

- ``bench.room_bench`` (a ``phases`` list of ``server`` / ``mode`` results):
  ``room-fanout.svg``, deliveries/s in the closed loop of ours, bare ``websockets``
  ``broadcast()`` and python-socketio (bars); ``room-paced-latency.svg``, p50 / p99 of
  each at the paced rate (bars); and, for a mode whose phases carry their latency
  histogram (``latency_hist``, or ``hist`` inside ``latency``: ``bench/room_client.py``'s
  log buckets, 200 per factor e of microseconds), ``room-latency-<mode>.svg``: latency
  by percentile, one line per server.
- ``bench.chat_bench`` (``saturation`` and ``latency`` load phases):
  ``chat-throughput.svg``, the node's saturation acks/s against the raw store's
  msgs/s per batch size (bars); ``chat-latency.svg``, ack and delivery latency by
  percentile at the paced rate (every ``pNN_ms`` of the summaries, and the max).

Every chart has a ``<title>``, a subtitle with the settings, and a footer with the
command, commit, date (UTC) and how busy the machine was. White background, so
it reads the same on GitHub's light and dark themes; ~720 px wide.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

WIDTH = 720
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
INK, MUTED, GRID, AXIS = "#1a1a1a", "#555555", "#e3e3e3", "#888888"
# Okabe-Ito, readable by the colour blind: ours, ws, sio, and the store
COLORS = {"ours": "#0072B2", "ws": "#E69F00", "sio": "#CC79A7", "store": "#999999",
          "store_best": "#666666", "p50": "#56B4E9", "p99": "#0072B2",
          "ack": "#0072B2", "delivery": "#D55E00"}
SERVER_NAMES = {"ours": "imgate (ours)", "ws": "websockets broadcast()",
                "sio": "python-socketio"}
SERVERS = ("ours", "ws", "sio")
LOG_BUCKETS = 200  # bench/room_client.py: histogram buckets per factor e of microseconds

Doc = dict[str, Any]


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


# -- reading results -----------------------------------------------------------------------
@dataclass
class Result:
    path: Path
    kind: str  # room | chat
    data: Doc

    def need(self, obj: Any, *keys: str, where: str = "") -> Any:
        """``obj[k1][k2]...``, or a PlotError naming the file and the missing key."""
        for key in keys:
            if not isinstance(obj, dict) or key not in obj or obj[key] is None:
                raise PlotError(f"{self.path}: {where or 'result'}: no {key!r} "
                                f"(a {self.kind} benchmark result was expected)")
            obj = obj[key]
        return obj


def detect_kind(data: Any) -> str:
    """``room`` (bench.room_bench) or ``chat`` (bench.chat_bench), from the contents."""
    if not isinstance(data, dict):
        raise PlotError(f"a JSON object was expected, got {type(data).__name__}")
    phases = data.get("phases")
    if isinstance(phases, list) and any(isinstance(p, dict) and "server" in p and "mode" in p
                                        for p in phases):
        return "room"
    if isinstance(data.get("saturation"), dict) and isinstance(data.get("latency"), dict):
        return "chat"
    raise PlotError("not a bench.room_bench result (a 'phases' list of server/mode results) "
                    "nor a bench.chat_bench result ('saturation' and 'latency'); keys: "
                    + (", ".join(sorted(data)[:12]) or "none"))


def load(path: str | Path) -> Result:
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise PlotError(f"{p}: cannot read: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise PlotError(f"{p}: not JSON: {exc}") from exc
    try:
        return Result(p, detect_kind(data), data)
    except PlotError as exc:
        raise PlotError(f"{p}: {exc}") from exc


def stamp_date(stamp: str) -> str:
    """``20261124T054231Z`` -> ``2026-11-24 05:42 UTC`` (anything else unchanged)."""
    m = re.fullmatch(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)\d\dZ", stamp)
    return f"{m[1]}-{m[2]}-{m[3]} {m[4]}:{m[5]} UTC" if m else stamp


def footer(res: Result, busy: str) -> str:
    d = res.data
    code = d.get("code") or {}
    dirty = code.get("uncommitted_in_gateway_router_store") or []
    m = d.get("machine") or {}
    load_avg = (m.get("loadavg_at_start") or [None])[0]
    parts = [str(d.get("command", "?")),
             f"commit {code.get('commit') or '?'}"
             + (f" + uncommitted changes in {len(dirty)} file(s)" if dirty else ""),
             stamp_date(str(d.get("utc", "?"))),
             f"{m.get('nproc', '?')} CPUs ({m.get('cpu_model', '?')}) shared by everything"
             + (f", load avg {load_avg:.2f} at start" if isinstance(load_avg, int | float)
                else ""),
             f"machine busy {busy}"]
    return "Measured: " + "; ".join(parts) + "."


# -- room fan-out --------------------------------------------------------------------------
def room_phases(res: Result, mode: str) -> dict[str, Doc]:
    """The one-node phases of ``mode`` by server (ours / ws / sio); failed ones left out."""
    phases = res.need(res.data, "phases")
    return {p["server"]: p for p in phases if isinstance(p, dict) and p.get("mode") == mode
            and p.get("server") in SERVERS and "error" not in p}


def _failed(res: Result, mode: str) -> str:
    bad = [f"{p['server']} ({str(p['error'])[:60]})" for p in res.data["phases"]
           if isinstance(p, dict) and p.get("mode") == mode and "error" in p]
    return f" Failed, not shown: {', '.join(bad)}." if bad else ""


def _busy(phases: dict[str, Doc]) -> str:
    return ", ".join(f"{s} {p.get('cpu', {}).get('machine_busy_pct', '?')}%"
                     for s, p in phases.items())


def room_charts(res: Result) -> dict[str, str]:
    s = res.data.get("settings") or {}
    subs = s.get("subscribers", "?")
    who = (f"1 room, {fmt_int(subs)} subscribers in {s.get('client_procs', '?')} processes, "
           "1 publisher, one server process each")
    out: dict[str, str] = {}
    thr = room_phases(res, "throughput")
    if not thr:
        raise PlotError(f"{res.path}: no successful throughput phase of ours, ws or sio"
                        + _failed(res, "throughput"))
    bars = []
    for server in (x for x in SERVERS if x in thr):
        v = float(res.need(thr[server], "deliveries_per_s", where=f"{server} throughput"))
        bars.append(Bar(SERVER_NAMES[server], v, COLORS[server]))
    if "ours" in thr:
        ours = bars[0].value
        bars[0].note = ", ".join(f"{fmt_ratio(ours / b.value)} {k}" for k, b in zip(
            [x for x in SERVERS if x in thr][1:], bars[1:], strict=True) if b.value > 0)
    frame = Frame("Room fan-out: deliveries/s, one node, one room",
                  f"{who}; closed loop, {s.get('window', '?')} un-acked sends, "
                  f"{_g(s.get('seconds'))} s measured after {_g(s.get('warmup'))} s; "
                  "ours without the per-member rate cap. Deliveries = messages received "
                  "by all subscribers." + _failed(res, "throughput"),
                  footer(res, f"(throughput phases) {_busy(thr)}"), plot_height=42 * len(bars)
                  + 30)
    out["room-fanout.svg"] = hbar_chart(frame, bars, "deliveries per second")

    paced = room_phases(res, "paced")
    if paced:
        names = [x for x in SERVERS if x in paced]
        values: list[list[float | None]] = [
            [paced[n].get("latency", {}).get("p50_ms"), paced[n].get("latency", {}).get("p99_ms")]
            for n in names]
        frame = Frame(f"Room fan-out: latency at {_g(s.get('rate'))} msgs/s (paced)",
                      f"{who}; publisher paced at {_g(s.get('rate'))} msgs/s for "
                      f"{_g(s.get('paced_seconds'))} s; latency = receive time - publish "
                      f"time, every message of 1 in {s.get('sample_every', '?')} "
                      "subscribers; ours with its default cap (50/s) and window (25 ms)."
                      + _failed(res, "paced"),
                      footer(res, f"(paced phases) {_busy(paced)}"), plot_height=230)
        out["room-paced-latency.svg"] = grouped_bar_chart(
            frame, [SERVER_NAMES[n] for n in names], [("p50", COLORS["p50"]),
                                                      ("p99", COLORS["p99"])],
            values, "latency (ms)")
    for mode in ("paced", "throughput"):
        with_hist = {n: p for n, p in room_phases(res, mode).items() if _hist(p)}
        if with_hist:
            out[f"room-latency-{mode}.svg"] = room_hist_chart(res, mode, with_hist, who)
    return out


def _hist(phase: Doc) -> dict[int, int]:
    raw = phase.get("latency_hist") or (phase.get("latency") or {}).get("hist") or {}
    if not isinstance(raw, dict):
        return {}
    try:
        return {int(k): int(v) for k, v in raw.items() if int(v) > 0}
    except (TypeError, ValueError) as exc:
        raise PlotError(f"latency histogram of {phase.get('server')} {phase.get('mode')}: "
                        f"bucket -> count expected: {exc}") from exc


def hist_series(name: str, color: str, hist: dict[int, int], max_ms: float | None,
                steps: int = 160) -> Series:
    """Latency by percentile from a log-bucket histogram, from p0 to the last rank."""
    total = sum(hist.values())
    keys = sorted(hist)
    top = math.log10(total) if total > 1 else 0.0
    cum, seen = [], 0
    for k in keys:
        seen += hist[k]
        cum.append(seen)
    points = []
    j = 0
    for i in range(steps + 1):
        x = top * i / steps
        rank = max(1, math.ceil((1 - 10 ** -x) * total - 1e-9))
        while cum[j] < rank:
            j += 1
        points.append((x, math.exp((keys[j] + 0.5) / LOG_BUCKETS) / 1000))
    # the exact max; never below the last bucket's midpoint (+-0.25 %)
    exact = max(max_ms if max_ms is not None else 0.0, points[-1][1])
    return Series(name, color, points, marked=False, max_ms=exact, max_x=top)


def room_hist_chart(res: Result, mode: str, phases: dict[str, Doc], who: str) -> str:
    s = res.data.get("settings") or {}
    series = [hist_series(SERVER_NAMES[n], COLORS[n], _hist(p),
                          (p.get("latency") or {}).get("max_ms")) for n, p in phases.items()]
    how = (f"paced at {_g(s.get('rate'))} msgs/s" if mode == "paced"
           else f"closed loop, {s.get('window', '?')} un-acked sends")
    frame = Frame(f"Room fan-out: latency distribution, {mode}",
                  f"{who}; {how}; from the latency histogram (0.5% buckets) of every message "
                  f"of 1 in {s.get('sample_every', '?')} subscribers; last point = max.",
                  footer(res, f"({mode} phases) {_busy(phases)}"), plot_height=240)
    return percentile_chart(frame, series)


# -- 1:1 chat ------------------------------------------------------------------------------
def chat_charts(res: Result) -> dict[str, str]:
    d, s = res.data, res.data.get("settings") or {}
    sat = res.need(d, "saturation")
    acks = float(res.need(sat, "acks_per_s", where="saturation"))
    bars = []
    raw = d.get("raw")
    best = None
    if isinstance(raw, dict):
        runs = res.need(raw, "runs", where="raw store phase")
        best = raw.get("best_batch")
        for r in runs:
            b = r.get("batch")
            bars.append(Bar(f"store raw, B={b}", float(r["msgs_per_s"]),
                            COLORS["store_best" if b == best else "store"],
                            "best B" if b == best else ""))
    ratio = d.get("ratio")
    bars.append(Bar("imgate node", acks, COLORS["ours"],
                    f"{fmt_ratio(ratio)} the raw store" if ratio else ""))
    raw_note = ("Store raw: the node's documents (1 body + 2 box entries per message) and "
                "indexes, sequential insert_many batches of B messages, w=majority, j=true. "
                if bars[:-1] else "No raw store phase in this run. ")
    frame = Frame("1:1 chat: one node's saturation vs the store's raw rate",
                  f"Node: {s.get('pairs', '?')} sender->receiver pairs, "
                  f"{s.get('window', '?')} sends in flight each, {_g(s.get('duration'))} s "
                  f"measured; acks/s = message stored and acknowledged. {raw_note}",
                  footer(res, f"{_pct(sat)} (saturation)"), plot_height=max(110, 36 * len(bars)))
    out = {"chat-throughput.svg": hbar_chart(frame, bars, "messages per second")}

    lat = res.need(d, "latency")
    series = []
    for key, label, color in (("ack_latency", "ack (send -> ack)", COLORS["ack"]),
                              ("delivery_latency", "delivery (send -> push)",
                               COLORS["delivery"])):
        summary = lat.get(key)
        if isinstance(summary, dict) and summary.get("count"):
            series.append(summary_series(label, color, summary))
    if not series:
        raise PlotError(f"{res.path}: latency phase: no ack_latency or delivery_latency "
                        "percentiles")
    target = lat.get("target_per_s")
    share = f" ({100 * target / acks:.0f}% of saturation)" if target and acks else ""
    frame = Frame(f"1:1 chat: latency at {fmt_num(target or 0)} msgs/s (open loop)",
                  f"{s.get('pairs', '?')} pairs on one node, sends paced at {_g(target)} "
                  f"msgs/s{share}, achieved {_g(lat.get('acks_per_s'))} acks/s, "
                  f"{_g(s.get('duration'))} s measured; every message timed "
                  f"({fmt_int(lat['ack_latency'].get('count', '?'))} acks).",
                  footer(res, f"{_pct(lat)} (paced)"), plot_height=230)
    out["chat-latency.svg"] = percentile_chart(frame, series)
    return out


def summary_series(name: str, color: str, summary: Doc) -> Series:
    """Points from a ``common.latency_summary``: every ``pNN_ms``, then the max at the
    rank of the last sample."""
    pts = sorted((nines(float(m[1])), float(v)) for k, v in summary.items()
                 if (m := re.fullmatch(r"p(\d+(?:\.\d+)?)_ms", k)) and v is not None
                 and float(m[1]) < 100)
    count = int(summary.get("count") or 0)
    max_ms = summary.get("max_ms")
    max_x = math.log10(count) if count > 1 else None
    if max_x is not None and pts and max_x <= pts[-1][0]:
        max_x = pts[-1][0] + 0.3
    return Series(name, color, pts, marked=True,
                  max_ms=float(max_ms) if max_ms is not None and max_x else None, max_x=max_x)


def _pct(phase: Doc) -> str:
    busy = (phase.get("cpu") or {}).get("machine_busy_pct")
    return f"{busy}%" if busy is not None else "?"


def _g(v: Any) -> str:
    return fmt_int(v) if isinstance(v, int | float) and v == int(v) else str(v)


def fmt_int(v: Any) -> str:
    return f"{int(v):,}" if isinstance(v, int | float) else str(v)


# -- main ----------------------------------------------------------------------------------
CHARTS: dict[str, Callable[[Result], dict[str, str]]] = {"room": room_charts, "chat": chat_charts}


def charts(paths: Sequence[str | Path]) -> dict[str, str]:
    """File name -> SVG text for every chart of the given result files."""
    out: dict[str, str] = {}
    seen: dict[str, Path] = {}
    for path in paths:
        res = load(path)
        if res.kind in seen:
            raise PlotError(f"{path}: a second {res.kind} result (the first: "
                            f"{seen[res.kind]}); give one result of each kind")
        seen[res.kind] = res.path
        out.update(CHARTS[res.kind](res))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/img", help="directory for the SVGs (default "
                   "docs/img)")
    p.add_argument("json", nargs="+", help="bench/out/room-*.json and/or chat-*.json")
    args = p.parse_args(argv)
    try:
        svgs = charts(args.json)
    except PlotError as exc:
        print(f"bench.plots: error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in svgs.items():
        (out / name).write_text(text)
        print(f"{out / name} ({len(text.encode()) / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
