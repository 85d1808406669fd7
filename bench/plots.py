"""Charts of benchmark results (SVG, drawn with matplotlib: the ``bench`` extra).

    .venv/bin/python -m bench.plots --out docs/img bench/out/room-<stamp>.json \\
        bench/out/chat-<stamp>.json

Each JSON file (what a benchmark wrote to ``bench/out/``) is recognised by its contents:

- ``bench.room_bench`` (a ``phases`` list of ``server`` / ``mode`` results):
  ``room-fanout.svg``, deliveries/s in the closed loop of ours, bare ``websockets``
  ``broadcast()`` and python-socketio (bars); ``room-paced-latency.svg``, p50 / p99 of
  each at the paced rate (bars); and, for a mode whose phases carry their latency
  histogram (``latency_hist``, or ``hist`` inside ``latency``: ``bench.stats``' log
  buckets), ``room-latency-<mode>.svg``: latency by percentile, one line per server.
- ``bench.chat_bench`` (``saturation`` and ``latency`` load phases):
  ``chat-throughput.svg``, the node's saturation acks/s against the raw store's
  msgs/s per batch size (bars); ``chat-latency.svg``, ack and delivery latency by
  percentile at the paced rate (every ``pNN_ms`` of the summaries, and the max).

Every chart has a title, a subtitle with the settings, and a footer with the command,
commit, date (UTC) and how busy the machine was; white background, ~720 px wide.
Reading the results into ``Chart``s (``charts``) needs no matplotlib; ``draw`` does.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import bucket_mid, hist_rank

# Okabe-Ito, readable by the colour blind: ours, ws, sio, and the store
COLORS = {"ours": "#0072B2", "ws": "#E69F00", "sio": "#CC79A7", "store": "#999999",
          "store_best": "#666666", "p50": "#56B4E9", "p99": "#0072B2",
          "ack": "#0072B2", "delivery": "#D55E00"}
SERVER_NAMES = {"ours": "imgate (ours)", "ws": "websockets broadcast()",
                "sio": "python-socketio"}
SERVERS = ("ours", "ws", "sio")

Doc = dict[str, Any]


class PlotError(ValueError):
    """A result file that cannot be plotted: says which file and what is missing."""


@dataclass
class Bar:
    label: str
    value: float
    color: str
    note: str = ""  # after the value, at the bar's end


@dataclass
class Series:
    name: str
    color: str
    points: list[tuple[float, float]]  # (x: nines, y: ms)
    marked: bool  # a marker and label on every point (few points)
    max_ms: float | None = None  # drawn as the last point, labelled "max"
    max_x: float | None = None


@dataclass
class Chart:
    """One figure, as data: ``hbar`` (``bars``), ``grouped`` (``groups`` x ``legend``,
    ``values[g][s]``) or ``percentile`` (``series``)."""

    kind: str
    title: str
    subtitle: str
    footer: str
    axis: str
    bars: list[Bar] = field(default_factory=list)
    groups: list[str] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)
    values: list[list[float | None]] = field(default_factory=list)
    series: list[Series] = field(default_factory=list)


# -- numbers -------------------------------------------------------------------------------
def fmt_num(v: float) -> str:
    """3 significant digits with k / M: 6733558 -> 6.73M, 138395.7 -> 138k, 9.58 -> 9.58."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return fmt_num(v / div) + suffix
    if v == 0:
        return "0"
    text = f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_ratio(v: float) -> str:
    return f"{v:,.0f}x" if v >= 100 else f"{v:.1f}x" if v >= 10 else f"{v:.2f}x"


def nines(p: float) -> float:
    """A percentile on the "nines" scale: p50 -> 0.3, p90 -> 1, p99 -> 2, p99.9 -> 3."""
    return -math.log10(1 - p / 100)


def _g(v: Any) -> str:
    return fmt_int(v) if isinstance(v, int | float) and v == int(v) else str(v)


def fmt_int(v: Any) -> str:
    return f"{int(v):,}" if isinstance(v, int | float) else str(v)


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


def room_charts(res: Result) -> dict[str, Chart]:
    s = res.data.get("settings") or {}
    who = (f"1 room, {fmt_int(s.get('subscribers', '?'))} subscribers in "
           f"{s.get('client_procs', '?')} processes, 1 publisher, one server process each")
    thr = room_phases(res, "throughput")
    if not thr:
        raise PlotError(f"{res.path}: no successful throughput phase of ours, ws or sio"
                        + _failed(res, "throughput"))
    names = [x for x in SERVERS if x in thr]
    bars = [Bar(SERVER_NAMES[n], float(res.need(thr[n], "deliveries_per_s",
                                                where=f"{n} throughput")), COLORS[n])
            for n in names]
    if names[0] == "ours":
        bars[0].note = ", ".join(f"{fmt_ratio(bars[0].value / b.value)} {n}"
                                 for n, b in zip(names[1:], bars[1:], strict=True)
                                 if b.value > 0)
    out = {"room-fanout.svg": Chart(
        "hbar", "Room fan-out: deliveries/s, one node, one room",
        f"{who}; closed loop, {s.get('window', '?')} un-acked sends, {_g(s.get('seconds'))} s "
        f"measured after {_g(s.get('warmup'))} s; ours without the per-member rate cap. "
        "Deliveries = messages received by all subscribers." + _failed(res, "throughput"),
        footer(res, f"(throughput phases) {_busy(thr)}"), "deliveries per second", bars=bars)}

    paced = room_phases(res, "paced")
    if paced:
        names = [x for x in SERVERS if x in paced]
        out["room-paced-latency.svg"] = Chart(
            "grouped", f"Room fan-out: latency at {_g(s.get('rate'))} msgs/s (paced)",
            f"{who}; publisher paced at {_g(s.get('rate'))} msgs/s for "
            f"{_g(s.get('paced_seconds'))} s; latency = receive time - publish time, every "
            f"message of 1 in {s.get('sample_every', '?')} subscribers; ours with its default "
            "cap (50/s) and window (25 ms)." + _failed(res, "paced"),
            footer(res, f"(paced phases) {_busy(paced)}"), "latency (ms)",
            groups=[SERVER_NAMES[n] for n in names],
            legend=[("p50", COLORS["p50"]), ("p99", COLORS["p99"])],
            values=[[(paced[n].get("latency") or {}).get(k) for k in ("p50_ms", "p99_ms")]
                    for n in names])
    for mode in ("paced", "throughput"):
        with_hist = {n: p for n, p in room_phases(res, mode).items() if _hist(p)}
        if with_hist:
            how = (f"paced at {_g(s.get('rate'))} msgs/s" if mode == "paced"
                   else f"closed loop, {s.get('window', '?')} un-acked sends")
            out[f"room-latency-{mode}.svg"] = Chart(
                "percentile", f"Room fan-out: latency distribution, {mode}",
                f"{who}; {how}; from the latency histogram (0.5% buckets) of every message of "
                f"1 in {s.get('sample_every', '?')} subscribers; last point = max.",
                footer(res, f"({mode} phases) {_busy(with_hist)}"), "latency (ms)",
                series=[hist_series(SERVER_NAMES[n], COLORS[n], _hist(p),
                                    (p.get("latency") or {}).get("max_ms"))
                        for n, p in with_hist.items()])
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
    top = math.log10(total) if total > 1 else 0.0
    points = []
    for i in range(steps + 1):
        x = top * i / steps
        rank = max(1, math.ceil((1 - 10 ** -x) * total - 1e-9))
        points.append((x, bucket_mid(hist_rank(hist, rank)) * 1000))
    # the exact max; never below the last bucket's midpoint (+-0.25 %)
    exact = max(max_ms if max_ms is not None else 0.0, points[-1][1])
    return Series(name, color, points, marked=False, max_ms=exact, max_x=top)


# -- 1:1 chat ------------------------------------------------------------------------------
def chat_charts(res: Result) -> dict[str, Chart]:
    d, s = res.data, res.data.get("settings") or {}
    sat = res.need(d, "saturation")
    acks = float(res.need(sat, "acks_per_s", where="saturation"))
    bars = []
    raw = d.get("raw")
    if isinstance(raw, dict):
        best = raw.get("best_batch")
        for r in res.need(raw, "runs", where="raw store phase"):
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
    out = {"chat-throughput.svg": Chart(
        "hbar", "1:1 chat: one node's saturation vs the store's raw rate",
        f"Node: {s.get('pairs', '?')} sender->receiver pairs, {s.get('window', '?')} sends in "
        f"flight each, {_g(s.get('duration'))} s measured; acks/s = message stored and "
        f"acknowledged. {raw_note}", footer(res, f"{_pct(sat)} (saturation)"),
        "messages per second", bars=bars)}

    lat = res.need(d, "latency")
    series = [summary_series(label, COLORS[key.split("_")[0]], lat[key])
              for key, label in (("ack_latency", "ack (send -> ack)"),
                                 ("delivery_latency", "delivery (send -> push)"))
              if isinstance(lat.get(key), dict) and lat[key].get("count")]
    if not series:
        raise PlotError(f"{res.path}: latency phase: no ack_latency or delivery_latency "
                        "percentiles")
    target = lat.get("target_per_s")
    share = f" ({100 * target / acks:.0f}% of saturation)" if target and acks else ""
    out["chat-latency.svg"] = Chart(
        "percentile", f"1:1 chat: latency at {fmt_num(target or 0)} msgs/s (open loop)",
        f"{s.get('pairs', '?')} pairs on one node, sends paced at {_g(target)} msgs/s{share}, "
        f"achieved {_g(lat.get('acks_per_s'))} acks/s, {_g(s.get('duration'))} s measured; "
        f"every message timed ({fmt_int(lat['ack_latency'].get('count', '?'))} acks).",
        footer(res, f"{_pct(lat)} (paced)"), "latency (ms)", series=series)
    return out


def summary_series(name: str, color: str, summary: Doc) -> Series:
    """Points from a ``bench.stats.latency_summary``: every ``pNN_ms``, then the max at
    the rank of the last sample."""
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


CHARTS: dict[str, Callable[[Result], dict[str, Chart]]] = {"room": room_charts,
                                                            "chat": chat_charts}


def charts(paths: Sequence[str | Path]) -> dict[str, Chart]:
    """File name -> chart for every chart of the given result files."""
    out: dict[str, Chart] = {}
    seen: dict[str, Path] = {}
    for path in paths:
        res = load(path)
        if res.kind in seen:
            raise PlotError(f"{path}: a second {res.kind} result (the first: "
                            f"{seen[res.kind]}); give one result of each kind")
        seen[res.kind] = res.path
        out.update(CHARTS[res.kind](res))
    return out


# -- drawing (matplotlib) ------------------------------------------------------------------
def draw(chart: Chart, fmt: str = "svg") -> bytes:
    """The chart as an SVG (or ``fmt``: png, pdf) file's bytes."""
    import matplotlib  # type: ignore[import-not-found]  # the bench extra

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt  # type: ignore[import-not-found]

    plt.rcParams.update({"svg.hashsalt": "imgate", "svg.fonttype": "none", "font.size": 9,
                         "axes.edgecolor": "#888888", "axes.spines.top": False,
                         "axes.spines.right": False})
    sub = textwrap.wrap(chart.subtitle, 108)
    foot = textwrap.wrap(chart.footer, 125)
    plot_h = {"hbar": 0.42 * len(chart.bars) + 0.4}.get(chart.kind, 2.4)
    head, tail = 0.45 + 0.17 * len(sub), 0.55 + 0.14 * len(foot)
    height = head + plot_h + tail
    fig = plt.figure(figsize=(7.2, height), facecolor="white")
    ax = fig.add_axes((0.1 if chart.kind != "hbar" else 0.24, tail / height, 0.46
                       if chart.kind == "hbar" else 0.86, plot_h / height))
    fig.text(0.02, 1 - 0.3 / height, chart.title, size=13, weight="bold")
    fig.text(0.02, 1 - 0.38 / height, "\n".join(sub), size=8.5, color="#555555", va="top")
    fig.text(0.02, 0.08 / height, "\n".join(foot), size=7, color="#555555", va="bottom")
    ax.grid(True, color="#e3e3e3", linewidth=0.8)
    ax.set_axisbelow(True)
    if chart.kind == "hbar":
        _hbar(ax, chart)
    elif chart.kind == "grouped":
        _grouped(ax, chart)
    else:
        _percentile(ax, chart)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, facecolor="white", metadata={"Date": None} if fmt == "svg"
                else None)
    plt.close(fig)
    return buf.getvalue()


def _hbar(ax: Any, chart: Chart) -> None:
    ys = range(len(chart.bars))
    ax.barh(ys, [b.value for b in chart.bars], height=0.6, color=[b.color for b in chart.bars])
    ax.set_yticks(ys, [b.label for b in chart.bars])
    ax.invert_yaxis()
    ax.grid(False, axis="y")
    ax.xaxis.set_major_formatter(lambda v, _: fmt_num(v))
    ax.set_xlabel(chart.axis, color="#555555")
    for y, b in zip(ys, chart.bars, strict=True):
        ax.annotate(fmt_num(b.value), (b.value, y), xytext=(5, 0), textcoords="offset points",
                    va="center", weight="bold", annotation_clip=False)
        if b.note:
            ax.annotate(b.note, (b.value, y), xytext=(10 + 7 * len(fmt_num(b.value)), 0),
                        textcoords="offset points", va="center", color="#555555",
                        annotation_clip=False)


def _grouped(ax: Any, chart: Chart) -> None:
    width = 0.7 / len(chart.legend)
    for s, (name, color) in enumerate(chart.legend):
        for g, row in enumerate(chart.values):
            x = g - 0.35 + width * (s + 0.5)
            v = row[s]
            if v is None:
                ax.text(x, 0, "n/a", ha="center", va="bottom", color="#555555")
                continue
            ax.bar(x, v, width * 0.9, color=color, label=name if g == 0 else None)
            ax.annotate(fmt_num(v), (x, v), xytext=(0, 2), textcoords="offset points",
                        ha="center", va="bottom")
    ax.set_xticks(range(len(chart.groups)), chart.groups)
    ax.grid(False, axis="x")
    ax.set_ylabel(chart.axis, color="#555555")
    ax.legend(frameon=False, loc="upper left")


def _percentile(ax: Any, chart: Chart) -> None:
    ys = [y for s in chart.series for _, y in s.points] + [s.max_ms for s in chart.series
                                                           if s.max_ms]
    ys = [v for v in ys if v > 0]
    if not ys:
        raise PlotError("no latency above 0 to plot")
    if max(ys) / min(ys) > 20:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(lambda v, _: fmt_num(v))
    for n, s in enumerate(chart.series):
        pts = list(s.points)
        if s.max_ms is not None and s.max_x is not None:
            pts.append((s.max_x, s.max_ms))
        ax.plot([x for x, _ in pts], [y for _, y in pts], color=s.color, label=s.name,
                marker="o" if s.marked else None, markersize=4, linewidth=1.8)
        marks = pts if s.marked else pts[-1:] if s.max_ms is not None else []
        for i, (x, y) in enumerate(marks):
            last = i == len(marks) - 1 and s.max_ms is not None
            if not s.marked:
                ax.plot([x], [y], "o", color=s.color, markersize=4)
            ax.annotate(fmt_num(y) + (" max" if last else ""), (x, y),
                        xytext=(0, 5 if n % 2 == 0 else -12), textcoords="offset points",
                        ha="center", color=s.color, size=8)
    marked = {round(100 * (1 - 10 ** -x), 4) for s in chart.series if s.marked
              for x, _ in s.points}
    xmax = max([2.0] + [x for s in chart.series for x, _ in s.points]
               + [s.max_x for s in chart.series if s.max_x]) * 1.04
    shown = [p for p in sorted({50, 90, 99, 99.9, 99.99, 99.999} | marked
                               | ({0} if any(not s.marked for s in chart.series) else set()))
             if nines(p) <= xmax]
    ax.set_xticks([nines(p) for p in shown], [f"p{p:g}" for p in shown])
    ax.set_xlim(0 if any(not s.marked for s in chart.series) else None, xmax)
    ax.set_xlabel("percentile (nines scale: p90, p99, p99.9 equally spaced)", color="#555555")
    ax.set_ylabel(chart.axis + (", log scale" if ax.get_yscale() == "log" else ""),
                  color="#555555")
    ax.legend(frameon=False, loc="lower right")


# -- main ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.plots", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="docs/img", help="directory for the SVGs (default "
                   "docs/img)")
    p.add_argument("json", nargs="+", help="bench/out/room-*.json and/or chat-*.json")
    args = p.parse_args(argv)
    try:
        found = charts(args.json)
        import matplotlib  # type: ignore[import-not-found]  # noqa: F401 - checked first
    except PlotError as exc:
        print(f"bench.plots: error: {exc}", file=sys.stderr)
        return 2
    except ImportError:
        print("bench.plots: error: matplotlib is not installed (the bench extra: "
              "pip install -r requirements-bench.lock)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, chart in found.items():
        data = draw(chart)
        (out / name).write_bytes(data)
        print(f"{out / name} ({len(data) / 1024:.1f} KiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
