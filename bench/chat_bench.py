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
import os
import time
from typing import Any

from pymongo import AsyncMongoClient, WriteConcern
from pymongo.asynchronous.database import AsyncDatabase

from bench import cli, common
from bench.cluster import Run
from bench.load import (
    TEXT,
    Load,
    closed_loop,
    measure_window,
    open_load,
    paced,
    stop_pumps,
    summarise,
)
from bench.report import fmt, header_lines, load_section, md_table, profile_section
from store.messages_mongo import INDEXES, body_doc, box_docs
from store.records import ChatMessage
from testkit.nodes import NodeProcess

RAW_BATCHES = (1, 16, 64, 256)
RAW_SECONDS = 4.0
RAW_MAX_MSGS = 20_000

Doc = dict[str, Any]


# -- 1. raw store --------------------------------------------------------------
def message_docs(first_mid: int, n: int, pairs: int) -> tuple[list[Doc], list[Doc]]:
    """The documents the node writes for ``n`` messages (store/messages.py)."""
    bodies: list[Doc] = []
    boxes: list[Doc] = []
    for mid in range(first_mid, first_mid + n):
        msg = ChatMessage(mid, f"raw-s{mid % pairs}", f"raw-r{mid % pairs}", f"c{mid}",
                          {"t": time.perf_counter(), "m": 0, "text": TEXT})
        bodies.append(body_doc(msg))
        boxes += box_docs(msg, mid)
    return bodies, boxes


async def fresh_collections(db: AsyncDatabase[Doc], indexes: bool) -> None:
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
    await fresh_collections(db, indexes)
    messages, boxes = db.messages, db.boxes
    if wc is not None:
        messages, boxes = messages.with_options(write_concern=wc), boxes.with_options(
            write_concern=wc)
    before, sent = common.cpu_snapshot(), 0
    while sent < RAW_MAX_MSGS and time.perf_counter() - before.wall < RAW_SECONDS:
        bodies, box_docs = message_docs(1 << 40 | sent, batch, pairs)
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


def raw_client(mongo_url: str, retry_writes: bool = False) -> AsyncMongoClient[Doc]:
    """Like the node's client (store/mongo_client.py): w=majority, journaled, no retryWrites."""
    return AsyncMongoClient(mongo_url, w="majority", journal=True, retryWrites=retry_writes,
                            maxPoolSize=32, tz_aware=False, serverSelectionTimeoutMS=5000,
                            socketTimeoutMS=60_000)


async def raw_store_phase(mongo_url: str, db_name: str) -> dict[str, Any]:
    client, retrying = raw_client(mongo_url), raw_client(mongo_url, retry_writes=True)
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


# -- 2. saturation -------------------------------------------------------------------
async def saturation_phase(load: Load, args: argparse.Namespace, names: dict[int, str],
                           node: NodeProcess | None) -> dict[str, Any]:
    stats = load.begin_phase(1)
    opens_at = time.perf_counter() + args.warmup
    until = opens_at + args.duration
    pumps = [asyncio.create_task(closed_loop(s, args.window, until)) for s in load.senders]
    profile = _start_profile(args, node, args.warmup)
    seconds, cpu = await measure_window(load, names, node, opens_at, until)
    cpu["stuck_senders"] = await stop_pumps(pumps)
    result = summarise(stats, seconds, cpu, await load.drain())
    if profile is not None:
        result["profile"] = await profile
    return result


def _start_profile(args: argparse.Namespace, node: NodeProcess | None,
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
async def latency_phase(load: Load, args: argparse.Namespace, rate: float,
                        names: dict[int, str], node: NodeProcess | None
                        ) -> dict[str, Any]:
    stats = load.begin_phase(2)
    pairs = len(load.senders)
    start = time.perf_counter() + 0.05
    opens_at = start + args.warmup
    until = opens_at + args.duration
    pumps = [asyncio.create_task(paced(s, start + i / rate, pairs / rate, until))
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
    lines += md_table(["B", "what", "messages", "msgs/s", "docs/s", "CPU cores (top 3)"], rows)
    return lines + [f"Raw store rate (best B={raw['best_batch']}): "
                    f"**{fmt(raw['best_msgs_per_s'])} msgs/s**", ""]


def render(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = header_lines("Chat benchmark", res)
    lines += [f"- node: {res['node']['where']}, run namespace {res['namespace']}; pairs "
             f"{s['pairs']}, window {s['window']}, duration {s['duration']} s, "
             f"warmup {s['warmup']} s", ""]
    if res.get("raw"):
        lines += _raw_lines(res["raw"])
    lines += load_section("2. Saturation (closed loop)", res["saturation"])
    lines += profile_section(res["saturation"].get("profile"))
    lines += load_section("3. Fixed-rate latency (open loop)", res["latency"])
    lines += ["## 4. Summary", ""] + md_table(["figure", "value"], _summary_rows(res))
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
              f"{fmt(lat['acks_per_s'])} / {fmt(lat['target_per_s'])}"],
             ["latency run: ack p50 / p99 (ms)",
              f"{fmt(lat['ack_latency']['p50_ms'])} / {fmt(lat['ack_latency']['p99_ms'])}"]]
    logs = res["node"].get("log_findings")
    if logs:
        rows.append(["node log warnings / errors / tracebacks",
                     f"{logs['warnings']} / {logs['errors']} / {logs['tracebacks']}"])
    if res["load_other_frames"]:
        rows.append(["unexpected frames", res["load_other_frames"]])
    return rows


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("python -m bench.chat_bench", __doc__)
    p.add_argument("--rate", type=float, help="latency phase msgs/s (default: saturation/2)")
    p.add_argument("--skip-raw", action="store_true", help="leave out the raw store phase")
    p.add_argument("--node-url", help="ws://127.0.0.1:PORT/ws of a running node (needs --secret)")
    p.add_argument("--secret", help="that node's IM_AUTH_SECRET")
    cli.add_store_urls(p, amqp=False)
    p.add_argument("--profile", action="store_true",
                   help="py-spy the node for up to 5 s during saturation")
    args = p.parse_args(argv)
    if args.node_url and not args.secret:
        p.error("--node-url needs --secret")
    cli.check_load_args(p, args, [url for url in (args.node_url, args.mongo_url,
                                                  args.redis_url) if url])
    return args


async def _gateway_phases(args: argparse.Namespace, res: dict[str, Any], secret: str,
                          node: NodeProcess | None) -> None:
    url = args.node_url or (node.ws_url if node else "")
    names = {os.getpid(): "load generator (this process)"}
    if node is not None:
        names[node.pid] = "gateway node"
    load = await open_load([url], args.secret or secret, args.pairs, res["namespace"])
    try:
        res["saturation"] = await saturation_phase(load, args, names, node)
        rate = args.rate or max(1.0, res["saturation"]["acks_per_s"] / 2)
        res["latency"] = await latency_phase(load, args, rate, names, node)
    finally:
        res["load_other_frames"] = dict(load.other)
        await load.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "chat")
    ns = r.namespace("")
    res: dict[str, Any] = {
        "command": cli.command_line("bench.chat_bench", args.argv),
        "utc": args.stamp, "machine": common.machine_facts(), "code": args.code,
        "namespace": ns,
        "settings": {k: getattr(args, k) for k in ("pairs", "window", "duration", "warmup",
                                                   "rate", "node_url", "mongo_url", "profile")}}
    common.OUT_DIR.mkdir(parents=True, exist_ok=True)
    node: NodeProcess | None = None
    try:
        if not args.skip_raw:
            res["raw"] = await raw_store_phase(args.mongo_url, f"{ns}_raw")
        if not args.node_url:
            node = (await r.start_nodes(ns, 1, "node"))[0]
        res["node"] = {"where": args.node_url or f"started {node.name if node else ''}",
                       "pid": node.pid if node else None}
        await _gateway_phases(args, res, r.secret, node)
    finally:
        if node is not None:  # stop the node, note what it logged, drop our namespace
            await r.stop_nodes([node])
            res["node"] = {**res.get("node", {}), **r.nodes[0]}
        if args.node_url:  # someone else's node: only the raw phase's database is ours
            r.namespaces = [f"{ns}_raw"]
        res["cleanup"] = await r.cleanup()
    raw = res.get("raw")
    res["ratio"] = (round(res["saturation"]["acks_per_s"] / raw["best_msgs_per_s"], 3)
                    if raw and raw["best_msgs_per_s"] else None)
    return res


def main(argv: list[str] | None = None) -> int:
    res = cli.execute(parse_args(argv), argv, run, "chat")
    if res is None:
        return 130
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
