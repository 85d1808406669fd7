"""1:1 chat benchmark: how close does one gateway node get to its MongoDB store?

Run from the repository root (it starts its own node, uses the local Redis /
RabbitMQ / MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.chat_bench                 # defaults: 50 pairs, window 32, 10 s
    .venv/bin/python -m bench.chat_bench --duration 5 --profile

Phases, all in one run:

1. **Raw store** (``--skip-raw`` to leave out). PyMongo's ``AsyncMongoClient``
   with the node's write concern (w=majority, j=true) writes what one message
   costs the node, in a scratch database: per batch ``insert_many`` of B
   ``messages`` docs, then ``insert_many`` of 2B ``boxes`` docs, same indexes,
   one batch at a time, for B in 1, 16, 64, 256 (each ~4 s or 20k messages).
   *msgs/s* = message docs per second (each message is 3 docs). The best B is
   the "raw store rate": an upper bound for the node, which does this plus
   Redis, WebSocket and JSON work. Reference rows: B=256 without secondary
   indexes; B=256 with w=1 and no journal; B=16 with ``retryWrites=true``
   (PyMongo's default; the node turns it off, its writes being idempotent).

   Caveat for SecantusDB (the local MongoDB-compatible server): it keeps a
   record of every retryable write for 30 minutes and scans (past 10,000
   records: sorts) them all on each write, so its per-command cost grows with
   everything written to it lately, by anyone. Absolute figures drift between
   runs; compare figures from the same run (the ratio), and see the
   retryWrites=true row for the size of that effect.
2. **Saturation**. P sender->receiver pairs on one node, each sender keeps W
   sends in flight (closed loop). After ``--warmup`` s, for ``--duration`` s:
   acks/s and deliveries/s (pushes received) of messages sent in that window
   (acks arriving while draining afterwards count), errors by code, and the
   CPU each process used (in cores; 1.0 = one core busy). If the load
   generator is near 1.0 core it, not the node, may be the limit.
3. **Fixed-rate latency**. Open loop at ``--rate`` msgs/s (default: half the
   saturation ack rate), spread evenly over the pairs; sends never wait for
   acks. Ack latency = send -> ack; delivery latency = send -> receiver's push
   (the send time travels in the body; one process, one clock). *send lag* is
   how late the generator was against its schedule: if large, distrust the rest.
4. **Ratio** = saturation acks/s / best raw msgs/s.

Output: a markdown report on stdout and everything as JSON in
``bench/out/chat-<UTC timestamp>.json`` (with the node's log beside it).
All traffic goes to 127.0.0.1; every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import secrets
import shlex
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson
from pymongo import AsyncMongoClient, WriteConcern
from pymongo.asynchronous.database import AsyncDatabase
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench import common
from gateway.auth import issue_token
from store.messages import INDEXES, ChatMessage, body_doc, box_docs

TEXT = "hello from the chat benchmark, a short line of text"
RAW_BATCHES = (1, 16, 64, 256)
RAW_SECONDS = 4.0
RAW_MAX_MSGS = 20_000
DRAIN_S = 10.0
LOOPBACK = ("127.0.0.1", "localhost", "::1")

Doc = dict[str, Any]
_fmt, _table = common.fmt, common.md_table


# -- 1. raw store --------------------------------------------------------------
def _message_docs(first_mid: int, n: int, pairs: int) -> tuple[list[Doc], list[Doc]]:
    """The documents the node writes for ``n`` messages (store/messages.py)."""
    bodies: list[Doc] = []
    boxes: list[Doc] = []
    for mid in range(first_mid, first_mid + n):
        msg = ChatMessage(mid, f"raw-s{mid % pairs}", f"raw-r{mid % pairs}", f"c{mid}",
                          {"t": time.perf_counter(), "m": 0, "text": TEXT})
        bodies.append(body_doc(msg))
        boxes += box_docs(msg, mid)
    return bodies, boxes


async def _fresh_collections(db: AsyncDatabase[Doc], indexes: bool) -> None:
    await db.drop_collection("messages")
    await db.drop_collection("boxes")
    await db.create_collection("messages")
    await db.create_collection("boxes")
    if indexes:
        for collection, keys, options in INDEXES:  # exactly the node's indexes
            await db[collection].create_index(keys, **options)


async def _raw_run(db: AsyncDatabase[Doc], batch: int, *, indexes: bool = True,
                   wc: WriteConcern | None = None, pairs: int = 50) -> dict[str, Any]:
    """Sequential batches for RAW_SECONDS or RAW_MAX_MSGS, as the node's Mongo batcher does."""
    await _fresh_collections(db, indexes)
    messages, boxes = db.messages, db.boxes
    if wc is not None:
        messages, boxes = messages.with_options(write_concern=wc), boxes.with_options(
            write_concern=wc)
    before, sent = common.cpu_snapshot(), 0
    while sent < RAW_MAX_MSGS and time.perf_counter() - before.wall < RAW_SECONDS:
        bodies, box_docs = _message_docs(1 << 40 | sent, batch, pairs)
        await messages.insert_many(bodies, ordered=False)
        await boxes.insert_many(box_docs, ordered=False)
        sent += batch
    after = common.cpu_snapshot()
    seconds = after.wall - before.wall
    wc_used = messages.write_concern.document
    return {"batch": batch, "indexes": indexes, "write_concern": wc_used, "messages": sent,
            "seconds": round(seconds, 3), "msgs_per_s": round(sent / seconds, 1),
            "docs_per_s": round(3 * sent / seconds, 1),
            "cpu": common.cpu_report(before, after, {}, top=3)}


def _raw_client(mongo_url: str, retry_writes: bool = False) -> AsyncMongoClient[Doc]:
    """Like the node's client (store/mongo_client.py): w=majority, journaled, no retryWrites."""
    return AsyncMongoClient(mongo_url, w="majority", journal=True, retryWrites=retry_writes,
                            maxPoolSize=32, tz_aware=False, serverSelectionTimeoutMS=5000,
                            socketTimeoutMS=60_000)


async def raw_store_phase(mongo_url: str, db_name: str) -> dict[str, Any]:
    client, retrying = _raw_client(mongo_url), _raw_client(mongo_url, retry_writes=True)
    try:
        db = client[db_name]
        runs = [await _raw_run(db, b) for b in RAW_BATCHES]
        refs = [await _raw_run(db, 256, indexes=False),
                await _raw_run(db, 256, wc=WriteConcern(w=1, j=False)),
                await _raw_run(retrying[db_name], 16)]
        refs[-1]["retry_writes"] = True
        await client.drop_database(db_name)
    finally:
        await client.close()
        await retrying.close()
    best = max(runs, key=lambda r: r["msgs_per_s"])
    return {"runs": runs, "reference": refs, "best_batch": best["batch"],
            "best_msgs_per_s": best["msgs_per_s"]}


# -- the load generator ------------------------------------------------------------
@dataclass
class PhaseStats:
    """Counts of one phase; only messages sent while ``open`` are counted."""

    phase: int
    open: bool = False
    sent: int = 0
    acks: int = 0
    deliveries: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ack_lat: list[float] = field(default_factory=list)
    dlv_lat: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)


class Load:
    """All connections of the benchmark, in this one process."""

    def __init__(self) -> None:
        self.stats = PhaseStats(0)
        self.senders: list[Sender] = []
        self.receivers: list[Receiver] = []
        self.other: Counter[str] = Counter()  # frames nobody expected (op -> count)

    def begin_phase(self, phase: int) -> PhaseStats:
        self.stats = PhaseStats(phase)
        return self.stats

    async def drain(self, timeout_s: float = DRAIN_S) -> dict[str, int]:
        """Wait for outstanding acks and pushes of the phase; report what never came."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if not self.inflight() and self.stats.deliveries >= self.stats.acks:
                break
            await asyncio.sleep(0.05)
        return {"unanswered": self.inflight(),
                "undelivered": max(0, self.stats.acks - self.stats.deliveries)}

    def inflight(self) -> int:
        return sum(len(s.inflight) for s in self.senders)

    async def close(self) -> None:
        conns = [*self.senders, *self.receivers]
        await asyncio.gather(*(c.ws.close() for c in conns), return_exceptions=True)
        for c in conns:
            c.reader.cancel()


class Sender:
    """One sending device: numbered requests, acks matched by ``re``."""

    def __init__(self, ws: ClientConnection, to: str, load: Load) -> None:
        self.ws, self.to, self.load = ws, to, load
        self.inflight: dict[int, tuple[float, PhaseStats | None]] = {}
        self.slots: asyncio.Semaphore | None = None  # closed-loop window, if any
        self._rid = 0
        self.reader = asyncio.create_task(self._read())

    async def send(self) -> None:
        self._rid += 1
        stats = self.load.stats if self.load.stats.open else None
        mark = stats.phase if stats is not None else -1
        t = time.perf_counter()
        self.inflight[self._rid] = (t, stats)
        frame = {"op": "send", "id": self._rid, "to": self.to, "cmid": f"c{self._rid}",
                 "body": {"t": t, "m": mark, "text": TEXT}}
        await self.ws.send(orjson.dumps(frame).decode())
        if stats is not None:
            stats.sent += 1

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in self.ws:
                self._on_frame(orjson.loads(data))

    def _on_frame(self, f: dict[str, Any]) -> None:
        op = f.get("op")
        entry = self.inflight.pop(f.get("re"), None) if op in ("ack", "error") else None
        if entry is None:
            key = f"{op}:{f.get('code')}" if op == "error" else str(op)
            self.load.other[key] += 1
            return
        if self.slots is not None:
            self.slots.release()
        t, stats = entry
        if stats is None:
            return
        if op == "ack":
            stats.acks += 1
            stats.ack_lat.append(time.perf_counter() - t)
        else:
            stats.errors[str(f.get("code"))] += 1


class Receiver:
    """One receiving device: counts pushes of the current phase."""

    def __init__(self, ws: ClientConnection, load: Load) -> None:
        self.ws, self.load = ws, load
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in self.ws:
                self._on_frame(orjson.loads(data))

    def _on_frame(self, f: dict[str, Any]) -> None:
        body = f.get("body")
        stats = self.load.stats
        if f.get("op") == "msg" and isinstance(body, dict) and body.get("m") == stats.phase:
            stats.deliveries += 1
            stats.dlv_lat.append(time.perf_counter() - body["t"])
        elif f.get("op") != "msg":
            self.load.other[str(f.get("op"))] += 1


async def dial(ws_url: str, secret: str, user: str, open_timeout: float = 15
               ) -> ClientConnection:
    """One WebSocket as ``user`` (a fresh token); no compression, no keepalive pings."""
    token = issue_token(secret, user, 3600)
    return await connect(f"{ws_url}?token={token}", compression=None, proxy=None,
                         ping_interval=None, open_timeout=open_timeout, close_timeout=2)


async def open_load(ws_url: str, secret: str, pairs: int, tag: str) -> Load:
    load = Load()
    receivers = await asyncio.gather(*(dial(ws_url, secret, f"{tag}-r{i}")
                                       for i in range(pairs)))
    senders = await asyncio.gather(*(dial(ws_url, secret, f"{tag}-s{i}") for i in range(pairs)))
    load.receivers = [Receiver(ws, load) for ws in receivers]
    load.senders = [Sender(ws, f"{tag}-r{i}", load) for i, ws in enumerate(senders)]
    return load


# -- measuring windows ----------------------------------------------------------------
@dataclass
class Meter:
    """CPU of every process (from /proc) and of this one (getrusage) over a window."""

    names: dict[int, str]
    snap: common.CpuSnapshot = field(default_factory=common.cpu_snapshot)
    own: float = field(default_factory=lambda: _own_cpu())

    def stop(self) -> tuple[float, dict[str, Any]]:
        after = common.cpu_snapshot()
        seconds = after.wall - self.snap.wall
        report = common.cpu_report(self.snap, after, self.names)
        report["load_generator_cores"] = round((_own_cpu() - self.own) / seconds, 3)
        return seconds, report


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def summarise(stats: PhaseStats, seconds: float, cpu: dict[str, Any],
              drain: dict[str, int]) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3), "sent": stats.sent, "acks": stats.acks,
        "deliveries": stats.deliveries,
        "sent_per_s": round(stats.sent / seconds, 1),
        "acks_per_s": round(stats.acks / seconds, 1),
        "deliveries_per_s": round(stats.deliveries / seconds, 1),
        "errors": dict(stats.errors), **drain,
        "ack_latency": common.latency_summary(stats.ack_lat),
        "delivery_latency": common.latency_summary(stats.dlv_lat),
        "send_lag": common.latency_summary(stats.lag),
        "cpu": cpu,
    }


async def measure_window(load: Load, names: dict[int, str], node: common.NodeProcess | None,
                         opens_at: float, closes_at: float) -> tuple[float, dict[str, Any]]:
    """Count the current phase between two perf_counter instants; CPU and node metrics."""
    await asyncio.sleep(max(0.0, opens_at - time.perf_counter()))
    metrics = await common.fetch_metrics(node.http_url) if node else {}
    meter, load.stats.open = Meter(names), True
    await asyncio.sleep(max(0.0, closes_at - time.perf_counter()))
    load.stats.open = False
    seconds, cpu = meter.stop()
    if node is not None:
        after = await common.fetch_metrics(node.http_url)
        cpu["node_metrics"] = common.metrics_delta(metrics, after)
    return seconds, cpu


async def stop_pumps(pumps: list[asyncio.Task[None]]) -> int:
    """Let the senders' loops end by themselves (bounded); returns how many had to be cancelled."""
    _, stuck = await asyncio.wait(pumps, timeout=DRAIN_S)
    for t in stuck:
        t.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    return len(stuck)


# -- 2. saturation -------------------------------------------------------------------
async def _closed_loop(sender: Sender, window: int, until: float) -> None:
    sender.slots = asyncio.Semaphore(window)
    while (remaining := until - time.perf_counter()) > 0:
        try:
            await asyncio.wait_for(sender.slots.acquire(), remaining)
        except TimeoutError:
            return
        if time.perf_counter() >= until:
            return
        await sender.send()


async def saturation_phase(load: Load, args: argparse.Namespace, names: dict[int, str],
                           node: common.NodeProcess | None) -> dict[str, Any]:
    stats = load.begin_phase(1)
    opens_at = time.perf_counter() + args.warmup
    until = opens_at + args.duration
    pumps = [asyncio.create_task(_closed_loop(s, args.window, until)) for s in load.senders]
    profile = _start_profile(args, node, args.warmup)
    seconds, cpu = await measure_window(load, names, node, opens_at, until)
    cpu["stuck_senders"] = await stop_pumps(pumps)
    for s in load.senders:
        s.slots = None
    result = summarise(stats, seconds, cpu, await load.drain())
    if profile is not None:
        result["profile"] = await profile
    return result


def _start_profile(args: argparse.Namespace, node: common.NodeProcess | None,
                   delay: float) -> asyncio.Task[dict[str, Any]] | None:
    """py-spy the node for up to 5 s, starting ``delay`` s from now (after warmup)."""
    if not args.profile or node is None:
        return None
    out = common.OUT_DIR / f"pyspy-{args.stamp}.txt"
    seconds = max(1, min(5, int(args.duration) - 1))

    async def later() -> dict[str, Any]:
        await asyncio.sleep(delay)
        return await common.py_spy_record(node.pid, seconds, out)

    return asyncio.create_task(later())


# -- 3. fixed-rate latency ----------------------------------------------------------
async def _paced(sender: Sender, first: float, interval: float, until: float) -> None:
    """Open loop: send at first, first + interval, ... whatever the acks do."""
    due = first
    while due < until:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sender.load.stats.open:
            sender.load.stats.lag.append(max(0.0, time.perf_counter() - due))
        await sender.send()
        due += interval


async def latency_phase(load: Load, args: argparse.Namespace, rate: float,
                        names: dict[int, str], node: common.NodeProcess | None
                        ) -> dict[str, Any]:
    stats = load.begin_phase(2)
    pairs = len(load.senders)
    start = time.perf_counter() + 0.05
    opens_at = start + args.warmup
    until = opens_at + args.duration
    pumps = [asyncio.create_task(_paced(s, start + i / rate, pairs / rate, until))
             for i, s in enumerate(load.senders)]
    seconds, cpu = await measure_window(load, names, node, opens_at, until)
    cpu["stuck_senders"] = await stop_pumps(pumps)
    result = summarise(stats, seconds, cpu, await load.drain())
    result["target_per_s"] = round(rate, 1)
    return result


# -- 4. report -----------------------------------------------------------------------
def _raw_lines(raw: dict[str, Any]) -> list[str]:
    rows = []
    for r in raw["runs"] + raw["reference"]:
        what = "node's docs + indexes" if r["indexes"] else "no secondary indexes"
        if r["write_concern"].get("w") == 1:
            what = "indexes, w=1 no journal"
        if r.get("retry_writes") is True:
            what = "indexes, retryWrites=true (PyMongo's default)"
        top = ", ".join(f"{p['what'][:28]} {p['cores']:.2f}" for p in r["cpu"]["top"])
        rows.append([r["batch"], what, r["messages"], r["msgs_per_s"], r["docs_per_s"], top])
    lines = ["## 1. Raw store (AsyncMongoClient, sequential batches)", ""]
    lines += _table(["B", "what", "messages", "msgs/s", "docs/s", "CPU cores (top 3)"], rows)
    return lines + [f"Raw store rate (best B={raw['best_batch']}): "
                    f"**{_fmt(raw['best_msgs_per_s'])} msgs/s**", ""]


def _load_lines(title: str, r: dict[str, Any]) -> list[str]:
    a, d, lag = r["ack_latency"], r["delivery_latency"], r["send_lag"]
    rows = [["window (s)", r["seconds"]], ["sent/s", r["sent_per_s"]],
            ["acks/s", r["acks_per_s"]], ["deliveries/s", r["deliveries_per_s"]],
            ["errors", ", ".join(f"{k}={v}" for k, v in r["errors"].items()) or "none"],
            ["unanswered / undelivered after drain", f"{r['unanswered']} / {r['undelivered']}"],
            ["ack latency p50/p95/p99/max (ms)",
             " / ".join(_fmt(a[k]) for k in ("p50_ms", "p95_ms", "p99_ms", "max_ms"))],
            ["delivery latency p50/p99/max (ms)",
             " / ".join(_fmt(d[k]) for k in ("p50_ms", "p99_ms", "max_ms"))]]
    if "target_per_s" in r:
        rows.insert(1, ["target rate/s", r["target_per_s"]])
        rows.append(["send lag p99/max (ms)", f"{_fmt(lag['p99_ms'])} / {_fmt(lag['max_ms'])}"])
    rows += _cpu_rows(r["cpu"]) + _node_metric_rows(r["cpu"].get("node_metrics"))
    return [f"## {title}", ""] + _table(["", "value"], rows)


def _node_metric_rows(nm: dict[str, Any] | None) -> list[list[Any]]:
    if not nm:
        return []
    batches = ", ".join(f"{k} {v}" for k, v in sorted(nm["mean_batch_size"].items()))
    wanted = ("im_sends_total", "im_errors_total", "im_push_skipped_total", "im_pushes_total")
    counters = ", ".join(f"{k.removeprefix('im_')}={v}" for k, v in nm["counters"].items()
                         if k.startswith(wanted))
    return [["node: mean store batch size in window", batches or "-"],
            ["node: counters in window", counters or "-"]]


def _cpu_rows(cpu: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = [["machine CPU busy %", cpu["machine_busy_pct"]],
                             ["load generator CPU (cores)", cpu["load_generator_cores"]]]
    rows += [[f"CPU cores: {p['what']} (pid {p['pid']})", p["cores"]] for p in cpu["top"]]
    return rows


def _profile_lines(prof: dict[str, Any] | None) -> list[str]:
    if not prof:
        return []
    if "skipped" in prof:
        return [f"py-spy: {prof['skipped']}", ""]
    lines = [f"## Node profile (py-spy, {prof['samples']} samples of "
             f"{prof['expected_if_always_busy']} if always busy)", ""]
    rows = [[s["pct"], s["fn"], i["pct"], i["fn"]]
            for s, i in zip(prof["self"], prof["inclusive"], strict=False)]
    return lines + _table(["self %", "function", "incl %", "function"], rows)


def render(res: dict[str, Any]) -> str:
    m, s = res["machine"], res["settings"]
    lines = ["# Chat benchmark", "", f"`{res['command']}`", "",
             f"- machine: {m['nproc']} CPUs, {m['cpu_model']}, Python {m['python']}, "
             f"kernel {m['kernel']}, load avg at start {m['loadavg_at_start'][0]:.2f}",
             f"- code: commit {res['code']['commit']}, uncommitted changes in "
             f"{len(res['code']['uncommitted_in_gateway_router_store'])} gateway/router/store "
             "files",
             f"- node: {res['node']['where']}, run namespace {res['namespace']}; pairs "
             f"{s['pairs']}, window {s['window']}, duration {s['duration']} s, "
             f"warmup {s['warmup']} s", ""]
    if res.get("raw"):
        lines += _raw_lines(res["raw"])
    lines += _load_lines("2. Saturation (closed loop)", res["saturation"])
    lines += _profile_lines(res["saturation"].get("profile"))
    lines += _load_lines("3. Fixed-rate latency (open loop)", res["latency"])
    lines += ["## 4. Summary", ""] + _table(["figure", "value"], _summary_rows(res))
    lines += [f"Results: `{res['json']}`"]
    if res["node"].get("log"):
        lines[-1] += f"; node log: `{res['node']['log']}`"
    return "\n".join(lines)


def _summary_rows(res: dict[str, Any]) -> list[list[Any]]:
    sat, lat = res["saturation"], res["latency"]
    rows: list[list[Any]] = [["gateway saturation acks/s", sat["acks_per_s"]]]
    if sat["cpu"]["top"]:
        busiest = sat["cpu"]["top"][0]
        rows.append(["busiest process during saturation (cores)",
                     f"{busiest['what']} ({busiest['cores']:.2f})"])
    if res.get("raw"):
        rows += [["raw store msgs/s (best B)", res["raw"]["best_msgs_per_s"]],
                 ["ratio gateway / raw", res["ratio"]]]
    rows += [["latency run: achieved / target msgs/s",
              f"{_fmt(lat['acks_per_s'])} / {_fmt(lat['target_per_s'])}"],
             ["latency run: ack p50 / p99 (ms)",
              f"{_fmt(lat['ack_latency']['p50_ms'])} / {_fmt(lat['ack_latency']['p99_ms'])}"]]
    logs = res["node"].get("log_findings")
    if logs:
        rows.append(["node log warnings / errors / tracebacks",
                     f"{logs['warnings']} / {logs['errors']} / {logs['tracebacks']}"])
    if res["load_other_frames"]:
        rows.append(["unexpected frames", res["load_other_frames"]])
    return rows


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.chat_bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=50, help="sender->receiver pairs (default 50)")
    p.add_argument("--window", type=int, default=32, help="in-flight sends per sender")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per phase")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    p.add_argument("--rate", type=float, help="latency phase msgs/s (default: saturation/2)")
    p.add_argument("--skip-raw", action="store_true", help="leave out the raw store phase")
    p.add_argument("--node-url", help="ws://127.0.0.1:PORT/ws of a running node (needs --secret)")
    p.add_argument("--secret", help="that node's IM_AUTH_SECRET")
    p.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    p.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the node for up to 5 s during saturation")
    args = p.parse_args(argv)
    if args.node_url and not args.secret:
        p.error("--node-url needs --secret")
    for url in (args.node_url, args.mongo_url, args.redis_url):
        if url and urlsplit(url).hostname not in LOOPBACK:
            p.error(f"{url}: only 127.0.0.1 is allowed")
    if min(args.pairs, args.window) < 1 or args.duration <= 0 or args.warmup < 0:
        p.error("--pairs and --window must be >= 1, --duration > 0, --warmup >= 0")
    return args


def _node_env(args: argparse.Namespace, ns: str, secret: str) -> dict[str, str]:
    return {"IM_NAMESPACE": ns, "IM_WS_PORT": "0", "IM_HTTP_PORT": "0",
            "IM_SEND_RATE": "1000000", "IM_SEND_BURST": "1000000", "IM_AUTH_SECRET": secret,
            "IM_MONGO_URL": args.mongo_url, "IM_REDIS_URL": args.redis_url}


async def _gateway_phases(args: argparse.Namespace, res: dict[str, Any],
                          node: common.NodeProcess | None) -> None:
    url = args.node_url or (node.ws_url if node else "")
    secret = args.secret or res.pop("_secret")
    names = {os.getpid(): "load generator (this process)"}
    if node is not None:
        names[node.pid] = "gateway node"
    load = await open_load(url, secret, args.pairs, res["namespace"])
    try:
        res["saturation"] = await saturation_phase(load, args, names, node)
        rate = args.rate or max(1.0, res["saturation"]["acks_per_s"] / 2)
        res["latency"] = await latency_phase(load, args, rate, names, node)
    finally:
        res["load_other_frames"] = dict(load.other)
        await load.close()


def _redacted(argv: list[str]) -> list[str]:
    """The command line without the value of ``--secret``."""
    out = list(argv)
    for i, a in enumerate(out):
        if a == "--secret" and i + 1 < len(out):
            out[i + 1] = "***"
        elif a.startswith("--secret="):
            out[i] = "--secret=***"
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns = common.new_namespace()
    res: dict[str, Any] = {
        "command": ".venv/bin/python -m bench.chat_bench " + shlex.join(_redacted(args.argv)),
        "utc": args.stamp, "machine": common.machine_facts(), "code": args.code,
        "namespace": ns,
        "settings": {k: getattr(args, k) for k in ("pairs", "window", "duration", "warmup",
                                                   "rate", "node_url", "mongo_url", "profile")},
        "_secret": secrets.token_hex(32)}
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    node: common.NodeProcess | None = None
    try:
        if not args.skip_raw:
            res["raw"] = await raw_store_phase(args.mongo_url, f"{ns}_raw")
        if not args.node_url:
            log = common.OUT_DIR / f"node-{args.stamp}.log"
            node = common.NodeProcess(_node_env(args, ns, res["_secret"]), log)
            await node.start()
        res["node"] = {"where": args.node_url or f"started {node.name if node else ''}",
                       "pid": node.pid if node else None}
        await _gateway_phases(args, res, node)
    finally:
        res.pop("_secret", None)
        await _finish(args, res, node, ns)
    return res


async def _finish(args: argparse.Namespace, res: dict[str, Any],
                  node: common.NodeProcess | None, ns: str) -> None:
    """Stop the node, drop our databases and keys, note what the node logged."""
    if node is not None:
        res.setdefault("node", {})["exit_code"] = await node.stop()
        res["node"]["log"] = str(node.log_path)
        res["node"]["log_findings"] = common.log_findings(node.log_path)
    try:
        dbs = [f"{ns}_raw"] + ([] if args.node_url else [ns])
        await common.drop_databases(args.mongo_url, dbs)
        if not args.node_url:
            res["cleanup_redis_keys"] = await common.delete_redis_keys(args.redis_url, ns)
            amqp = os.environ.get("IM_AMQP_URL") or common.DEFAULT_AMQP_URL  # the node's
            res["cleanup_exchanges"] = await common.delete_exchanges(amqp, ns)
    except Exception as exc:  # noqa: BLE001 - reported, the results still matter
        res["cleanup_error"] = repr(exc)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv
    args.stamp = common.utc_stamp()
    args.code = common.code_version()
    res = common.run_loop(run(args))
    raw = res.get("raw")
    res["ratio"] = (round(res["saturation"]["acks_per_s"] / raw["best_msgs_per_s"], 3)
                    if raw and raw["best_msgs_per_s"] else None)
    res["json"] = str(common.write_json(res, args.stamp, "chat"))
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
