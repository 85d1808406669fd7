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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.svg_charts import (
    Bar,
    Frame,
    PlotError,
    Series,
    fmt_num,
    fmt_ratio,
    grouped_bar_chart,
    hbar_chart,
    nines,
    percentile_chart,
)

# Okabe-Ito, readable by the colour blind: ours, ws, sio, and the store
COLORS = {"ours": "#0072B2", "ws": "#E69F00", "sio": "#CC79A7", "store": "#999999",
          "store_best": "#666666", "p50": "#56B4E9", "p99": "#0072B2",
          "ack": "#0072B2", "delivery": "#D55E00"}
SERVER_NAMES = {"ours": "imgate (ours)", "ws": "websockets broadcast()",
                "sio": "python-socketio"}
SERVERS = ("ours", "ws", "sio")
LOG_BUCKETS = 200  # bench/room_client.py: histogram buckets per factor e of microseconds

Doc = dict[str, Any]


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
