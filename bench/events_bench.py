"""Events benchmark: what do ``offline.msg`` events cost a node at 1:1 saturation?

Run from the repository root (it starts its own nodes, uses the local Redis /
RabbitMQ / MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.events_bench                  # 50 pairs, window 32, 10 s, 2 rounds
    .venv/bin/python -m bench.events_bench --duration 3 --warmup 1 --rounds 1   # smoke test

The load is ``bench.chat_bench``'s (``bench.load``: P sender->receiver pairs on
one node) with one difference: the receivers never connect, so every message
is stored for a user with no device, and the node queues an ``offline.msg``
event for each (``gateway.ws.session.push_sent``; deliveries are 0 by design).
Two configurations of the node are compared, each run on a freshly started
node in a fresh namespace:

- **off**: ``IM_EVENTS=none``;
- **on**: ``IM_EVENTS=offline,presence`` (the default), and a queue of this
  process's own (not durable, exclusive, auto-delete) bound to ``{ns}.events``
  with ``offline.#``, drained by a consumer here that only counts, so the
  broker routes every event somewhere (with no queue bound it drops them).

``--rounds`` rounds of off, on (off, on, off, on, ... to cancel drift in the
store's speed); in each run, as in ``bench.chat_bench``:

1. **Saturation**: closed loop, each sender keeps ``--window`` sends in
   flight; ``--warmup`` s, then ``--duration`` s measured.
2. Events on: wait (bounded, ``OUTBOX_WAIT_S``) until the node's outbox
   drained: events published + dropped = messages stored (the node's
   ``im_sends_total{outcome="stored"}``); its backlog when saturation ended and
   the time it took are reported.
3. **Fixed-rate latency**: open loop at ``--rate`` msgs/s for every run
   (default: half the first events-off run's saturation rate); then the
   outbox drained again.

Per run: saturation acks/s, the node's CPU (cores, and CPU ms per acked
message), latency p50/p99, and for events-on runs ``offline.msg`` events
published (the node's ``im_events_total``) against messages stored, retried
and dropped, and what the bound queue received. Then the mean per
configuration and on vs off.

Output: a markdown report on stdout and everything as JSON in
``bench/out/events-<UTC timestamp>.json`` (node logs beside it). All traffic
goes to 127.0.0.1; every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from statistics import mean
from typing import Any
from urllib.parse import urlsplit

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from bench import cli, common
from bench.chat_bench import latency_phase, saturation_phase
from bench.cluster import Run
from bench.load import open_load
from bench.report import cleanup_line, fmt, header_lines, lat, md_table, node_lines
from gateway.config import Settings
from testkit.nodes import NodeProcess
from testkit.poll import until

CONFIGS = ("off", "on")
EVENTS_ON = Settings.events  # the node's default, "offline,presence"
EVENTS_OFF = "none"  # every run checks that an "off" node published nothing
OUTBOX_WAIT_S = 60.0  # longest wait for the node's events outbox to drain after a phase
QUEUE_WAIT_S = 10.0  # longest wait for the bound queue to receive what was published
EVENTS = "im_events_total"
STORED = 'im_sends_total{outcome="stored"}'

Res = dict[str, Any]


# -- the node's counters -------------------------------------------------------------
def events_count(m: dict[str, float], outcome: str, kind: str | None = "offline.msg") -> int:
    """``im_events_total`` of ``outcome`` for type ``kind`` (None: every type)."""
    total = 0.0
    for key, v in m.items():
        name, _, labels = key.partition("{")
        if (name == EVENTS and f'outcome="{outcome}"' in labels
                and (kind is None or f'type="{kind}"' in labels)):
            total += v
    return int(total)


def event_figures(m: dict[str, float]) -> Res:
    """Messages stored by the node so far and its ``offline.msg`` events by outcome."""
    stored = int(m.get(STORED, 0))
    out = {"stored": stored, **{o: events_count(m, o) for o in ("published", "retried",
                                                                "dropped")},
           "published_any_type": events_count(m, "published", None)}
    out["backlog"] = stored - out["published"] - out["dropped"]  # still in the outbox
    return out


async def drain_outbox(node: NodeProcess, events_on: bool) -> Res:
    """Events on: wait (bounded) until every stored message's event left the outbox
    (published or dropped); the counters then, the backlog found first and how long
    it took. Events off: the counters (nothing to wait for)."""
    t = time.perf_counter()
    first = event_figures(await common.fetch_metrics(node.http_url))
    if not events_on:
        return {**first, "backlog": None, "backlog_at_phase_end": None, "drain_s": None}
    last = first

    async def drained() -> bool:
        nonlocal last
        last = event_figures(await common.fetch_metrics(node.http_url))
        return bool(last["backlog"] <= 0)

    if first["backlog"] > 0:
        await until(drained, OUTBOX_WAIT_S, every=0.2)
    return {**last, "backlog_at_phase_end": first["backlog"],
            "drain_s": round(time.perf_counter() - t, 2)}


# -- the bound queue ----------------------------------------------------------------------
class EventCounter:
    """What reached this process's queue bound to ``{ns}.events``: counts by routing key
    (nothing kept)."""

    def __init__(self) -> None:
        self.by_key: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.by_key.values())

    async def on_message(self, msg: AbstractIncomingMessage) -> None:
        self.by_key[msg.routing_key or ""] += 1


@contextlib.asynccontextmanager
async def bound_queue(amqp_url: str, ns: str, pattern: str = "offline.#"
                      ) -> AsyncIterator[EventCounter]:
    """A queue (not durable, exclusive, auto-delete) bound to the exchange the node
    declared, consumed without acks here while the block runs."""
    counter = EventCounter()
    conn = await aio_pika.connect(amqp_url.split(",")[0].strip(), timeout=10)
    try:
        channel = await conn.channel()
        queue = await channel.declare_queue(exclusive=True, auto_delete=True, durable=False)
        await queue.bind(f"{ns}.events", routing_key=pattern)
        await queue.consume(counter.on_message, no_ack=True)
        yield counter
    finally:
        await conn.close()


def listener_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` on this machine (from /proc; None if it
    cannot be seen), to find RabbitMQ among the busiest processes."""
    inodes = {f"socket:[{ino}]" for p, state, ino in common.tcp_sockets()
              if state == "0A" and p == port}
    for proc in Path("/proc").iterdir():
        if inodes and proc.name.isdigit():
            with contextlib.suppress(OSError):
                if any(os.readlink(fd) in inodes for fd in (proc / "fd").iterdir()):
                    return int(proc.name)
    return None


# -- one run: a fresh node, saturation, latency ---------------------------------------------
async def one_run(r: Run, args: argparse.Namespace, rnd: int, config: str,
                  rate: float | None) -> Res:
    """Saturation then fixed-rate latency (at ``rate``; None: half the saturation
    rate) on a fresh node with events ``config``, receivers offline."""
    ns = r.namespace(f"-{rnd}{config}")
    out: Res = {"round": rnd, "config": config, "namespace": ns}
    nodes: list[NodeProcess] = []
    common.say("events", f"round {rnd}, events {config}")
    try:
        nodes = await r.start_nodes(ns, 1, f"{rnd}-{config}",
                                    events=EVENTS_ON if config == "on" else EVENTS_OFF)
        out["node_pid"] = nodes[0].pid
        out["broker_pid"] = listener_pid(urlsplit(args.amqp_url.split(",")[0].strip()).port
                                         or 5672)
        async with contextlib.AsyncExitStack() as stack:
            queue = (await stack.enter_async_context(bound_queue(args.amqp_url, ns))
                     if config == "on" else None)
            await _phases(args, out, r.secret, nodes[0], rate, queue)
    finally:
        if nodes:
            await r.stop_nodes(nodes)
            out["node"] = r.nodes[-1]
        out["cleanup"] = await r.cleanup()  # this run's namespace only
        r.namespaces.clear()
    return out


async def _phases(args: argparse.Namespace, out: Res, secret: str, node: NodeProcess,
                  rate: float | None, queue: EventCounter | None) -> None:
    load = await open_load([node.ws_url], secret, args.pairs, out["namespace"],
                           receivers_online=False)
    try:
        out["saturation"] = await saturation_phase(load, args, [node])
        out["saturation_events"] = await drain_outbox(node, queue is not None)
        rate = rate or max(1.0, out["saturation"]["acks_per_s"] / 2)
        out["latency"] = await latency_phase(load, args, rate, [node])
        out["latency_events"] = await drain_outbox(node, queue is not None)
    finally:
        out["load_other_frames"] = dict(load.other)
        await load.close()
    if queue is not None:
        published = out["latency_events"]["published"]
        await until(lambda: queue.total >= published, QUEUE_WAIT_S)
        out["queue_received"] = {"total": queue.total, "by_key": dict(queue.by_key)}


# -- figures ------------------------------------------------------------------------------
def figures(run: Res) -> Res:
    """The figures of one run compared across configurations."""
    sat, lat_ = run["saturation"], run["latency"]
    cores = sat["cpu"]["by_pid"].get(str(run["node_pid"]))
    broker = next((p["cores"] for p in sat["cpu"]["top"] if p["pid"] == run.get("broker_pid")),
                  None)
    return {
        "sat_acks_per_s": sat["acks_per_s"],
        "sat_node_cores": cores,
        "sat_node_cpu_ms_per_msg": (round(cores * 1000 / sat["acks_per_s"], 3)
                                    if cores and sat["acks_per_s"] else None),
        "sat_broker_cores": broker,
        "sat_machine_busy_pct": sat["cpu"]["machine_busy_pct"],
        "lat_acks_per_s": lat_["acks_per_s"],
        "lat_ack_p50_ms": lat_["ack_latency"]["p50_ms"],
        "lat_ack_p99_ms": lat_["ack_latency"]["p99_ms"],
    }


def _mean(values: list[Any]) -> float | None:
    vals = [v for v in values if v is not None]
    return round(mean(vals), 3) if vals else None


def summary(runs: list[Res]) -> Res:
    """Mean of each figure per configuration, and on vs off in % of off."""
    ok = [r for r in runs if "figures" in r]
    means = {c: {k: _mean([r["figures"][k] for r in ok if r["config"] == c])
                 for k in (ok[0]["figures"] if ok else {})} for c in CONFIGS}
    return {"mean": means, "on_vs_off_pct": {k: _pct(means["off"][k], means["on"][k])
                                             for k in means["off"]}}


def _pct(off: float | None, on: float | None) -> float | None:
    """``on`` vs ``off``, in % of ``off``."""
    return round(100 * (on - off) / off, 1) if off and on is not None else None


# -- report --------------------------------------------------------------------------------
FIGURES = (("sat_acks_per_s", "saturation acks/s"),
           ("sat_node_cores", "saturation: node CPU (cores)"),
           ("sat_node_cpu_ms_per_msg", "saturation: node CPU ms per acked message"),
           ("sat_broker_cores", "saturation: RabbitMQ CPU (cores; - if not in the top 6)"),
           ("sat_machine_busy_pct", "saturation: machine CPU busy %"),
           ("lat_acks_per_s", "latency run: acks/s"),
           ("lat_ack_p50_ms", "latency run: ack p50 (ms)"),
           ("lat_ack_p99_ms", "latency run: ack p99 (ms)"))


def render(res: Res) -> str:
    s = res["settings"]
    lines = header_lines("Events benchmark (offline.msg, 1:1, receivers offline)", res)
    lines += [f"- one node per run, started fresh; pairs {s['pairs']}, window {s['window']}, "
              f"duration {s['duration']} s, warmup {s['warmup']} s per phase; latency rate "
              f"{fmt(res.get('rate'))} msgs/s for every run; events off: IM_EVENTS="
              f"{EVENTS_OFF!r}, on: IM_EVENTS={EVENTS_ON!r} with a queue bound to "
              "`offline.#`", ""]
    runs = res.get("runs", [])
    lines += ["## Runs", ""] + md_table(
        ["round", "events", "sat acks/s", "node cores", "node CPU ms/msg", "busy %",
         "lat acks/s (target)", "lat ack p50 / p99 ms", "errors", "unexpected frames"],
        [_run_row(r) for r in runs])
    lines += ["## Events (events-on runs; off runs must publish none)", ""] + md_table(
        ["round", "events", "messages stored", "offline.msg published", "published - stored",
         "retried", "dropped", "queue received", "published/s in sat. window",
         "outbox after sat. / drained in (s)", "events of any type published"],
        [_events_row(r) for r in runs if "latency_events" in r])
    sm = res.get("summary")
    if sm:
        rows = [[what, sm["mean"]["off"][k], sm["mean"]["on"][k],
                 fmt(sm["on_vs_off_pct"][k]) + " %" if sm["on_vs_off_pct"][k] is not None
                 else "-"] for k, what in FIGURES]
        lines += [f"## Mean of {s['rounds']} round(s)", ""] + md_table(
            ["figure", "events off", "events on", "on vs off"], rows)
    for r in runs:
        if "error" in r:
            lines.append(f"- round {r['round']} events {r['config']}: {r['error']}")
    lines += node_lines([r["node"] for r in runs if "node" in r], trouble_only=True)
    lines.append(cleanup_line({k: v for r in runs for k, v in r.get("cleanup", {}).items()}))
    return "\n".join(lines)


def _run_row(r: Res) -> list[Any]:
    if "figures" not in r:
        return [r["round"], r["config"], "failed", *["-"] * 7]
    f, sat, lt = r["figures"], r["saturation"], r["latency"]
    errors = {k: sat["errors"].get(k, 0) + lt["errors"].get(k, 0)
              for k in {*sat["errors"], *lt["errors"]}}
    return [r["round"], r["config"], f["sat_acks_per_s"], f["sat_node_cores"],
            f["sat_node_cpu_ms_per_msg"], f["sat_machine_busy_pct"],
            f"{fmt(lt['acks_per_s'])} ({fmt(lt['target_per_s'])})", lat(lt["ack_latency"]),
            ", ".join(f"{k}={v}" for k, v in errors.items()) or "none",
            sum(r["load_other_frames"].values())]


def _events_row(r: Res) -> list[Any]:
    ev, sat_ev = r["latency_events"], r["saturation_events"]
    window = r["saturation"]["cpu"].get("node_metrics", {}).get("counters", {})
    in_window = sum(v for k, v in window.items()
                    if k.startswith(EVENTS + "{") and 'type="offline.msg"' in k
                    and 'outcome="published"' in k)
    seconds = r["saturation"]["seconds"]
    on = r["config"] == "on"
    return [r["round"], r["config"], ev["stored"], ev["published"],
            ev["published"] - ev["stored"] if on else None, ev["retried"], ev["dropped"],
            r.get("queue_received", {}).get("total"),
            round(in_window / seconds, 1) if seconds else None,
            f"{fmt(sat_ev['backlog_at_phase_end'])} / {fmt(sat_ev['drain_s'])}" if on else None,
            ev["published_any_type"]]


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.events_bench", __doc__, cli.LOAD)
    p.add_argument("--rate", type=float,
                   help="latency phase msgs/s (default: the first events-off saturation / 2)")
    p.add_argument("--rounds", type=int, default=2,
                   help="rounds of events off, events on (default 2)")
    p.set_defaults(profile=False)  # chat_bench.saturation_phase reads it
    args = cli.parse(p, argv)
    cli.check_load_args(p, args)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


async def run(args: argparse.Namespace) -> Res:
    r = Run(args, "events")
    res: Res = {"runs": [], "rate": args.rate}
    for rnd in range(1, args.rounds + 1):
        for config in CONFIGS:
            out = await _run_reported(r, args, rnd, config, res["rate"])
            res["runs"].append(out)
            if res["rate"] is None and "latency" in out:
                res["rate"] = out["latency"]["target_per_s"]
    res["summary"] = summary(res["runs"])
    return res


async def _run_reported(r: Run, args: argparse.Namespace, rnd: int, config: str,
                        rate: float | None) -> Res:
    """``one_run``; a failure is reported and the next runs still go."""
    try:
        out = await one_run(r, args, rnd, config, rate)
    except Exception as exc:  # noqa: BLE001 - reported
        return {"round": rnd, "config": config, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    out["figures"] = figures(out)
    return out


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.events_bench", argv, parse_args, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
