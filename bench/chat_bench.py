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
import time
from typing import Any

from pymongo import AsyncMongoClient, WriteConcern
from pymongo.asynchronous.database import AsyncDatabase

from bench import cli, common, report
from bench.cluster import Run, process_names
from bench.load import TEXT, Load, open_load, paced, run_phase, saturate
from bench.report import fmt, header_lines, load_section, md_table, profile_section
from bench.stats import latency_summary
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
    for name in ("messages", "boxes"):
        await db.drop_collection(name)
        await db.create_collection(name)
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
    meter, sent = common.Meter({}, top=3), 0
    while sent < RAW_MAX_MSGS and time.perf_counter() - meter.snap.wall < RAW_SECONDS:
        bodies, box_docs = message_docs(1 << 40 | sent, batch, pairs)
        await messages.insert_many(bodies, ordered=False)
        await boxes.insert_many(box_docs, ordered=False)
        sent += batch
    seconds, cpu = meter.stop()
    return {"batch": batch, "indexes": indexes, "write_concern": messages.write_concern.document,
            "messages": sent, "seconds": round(seconds, 3), "msgs_per_s": round(sent / seconds, 1),
            "docs_per_s": round(3 * sent / seconds, 1), "cpu": cpu}


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


# -- 2. saturation, 3. fixed-rate latency ------------------------------------------
async def saturation_phase(load: Load, args: argparse.Namespace,
                           nodes: list[NodeProcess]) -> dict[str, Any]:
    profile = (common.py_spy_later(nodes[0].pid, max(1, min(5, int(args.duration) - 1)),
                                   common.OUT_DIR / f"pyspy-{args.stamp}.txt", args.warmup)
               if args.profile and nodes else None)  # up to 5 s after the warm-up
    result, _ = await saturate(load, 1, process_names(nodes), nodes, args)
    if profile is not None:
        result["profile"] = await profile
    return result


async def latency_phase(load: Load, args: argparse.Namespace, rate: float,
                        nodes: list[NodeProcess]) -> dict[str, Any]:
    """Open loop: sender i sends at start + i / rate, then every pairs / rate s."""
    pairs, start = len(load.senders), time.perf_counter() + 0.05
    until = start + args.warmup + args.duration
    result, _ = await run_phase(load, 2, process_names(nodes), nodes, start + args.warmup,
                                until, lambda i, s: paced(s, start + i / rate, pairs / rate,
                                                          until))
    result["target_per_s"] = round(rate, 1)
    return result


# -- 5. the store alone, paced -------------------------------------------------------
async def store_paced_phase(mongo_url: str, db_name: str, rate: float, batches: list[int],
                            seconds: float) -> list[dict[str, Any]]:
    """What the node's Mongo stage writes per batch (bodies, then box entries), one
    batch at a time, paced at ``rate`` msgs/s, for each batch size: per-batch latency.
    The floor of the node's ack latency at that rate (``--store-paced``)."""
    client = raw_client(mongo_url)
    db = client[db_name]
    out: list[dict[str, Any]] = []
    try:
        for batch in batches:
            await fresh_collections(db, indexes=True)
            lat: list[float] = []
            mid, end = 1 << 41, time.perf_counter() + seconds
            while time.perf_counter() < end:
                bodies, boxes = message_docs(mid, batch, 50)
                mid += batch
                t = time.perf_counter()
                await db.messages.insert_many(bodies, ordered=False)
                await db.boxes.insert_many(boxes, ordered=False)
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, batch / rate - (time.perf_counter() - t)))
            out.append({"batch": batch, "rate": round(rate, 1),
                        "latency": latency_summary(lat, (50, 95, 99))})
    finally:
        await client.drop_database(db_name)
        await client.close()
    return out


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
    if res.get("store_paced"):
        lines += [f"## 5. The store alone, paced at {fmt(res['latency']['target_per_s'])} "
                  f"msgs/s (the node's mean Mongo batch in the latency run: "
                  f"{fmt(res['store_paced_mean_batch'])})", ""]
        lines += md_table(["B", "per-batch latency p50 / p95 / p99 / max (ms)"],
                          [[x["batch"], report.lat(x["latency"], "p50 p95 p99 max")]
                           for x in res["store_paced"]]) + [""]
    lines += ["## 4. Summary", ""] + md_table(["figure", "value"], _summary_rows(res))
    return "\n".join(lines + ([f"Node log: `{res['node']['log']}`"]
                              if res["node"].get("log") else []))


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
             ["latency run: ack p50 / p99 (ms)", report.lat(lat["ack_latency"])]]
    logs = res["node"].get("log_findings")
    if logs:
        rows.append(["node log warnings / errors / tracebacks",
                     f"{logs['warnings']} / {logs['errors']} / {logs['tracebacks']}"])
    if res["load_other_frames"]:
        rows.append(["unexpected frames", res["load_other_frames"]])
    return rows


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.chat_bench", __doc__, cli.LOAD)
    p.add_argument("--rate", type=float, help="latency phase msgs/s (default: saturation "
                   "x --rate-fraction)")
    p.add_argument("--rate-fraction", type=float, default=0.5,
                   help="latency phase rate as a fraction of saturation (published: 0.333)")
    p.add_argument("--store-paced", action="store_true",
                   help="5. the store alone, paced at the latency run's rate in the node's "
                   "mean Mongo batch size (and B=1, and twice it): its own p99 to compare")
    p.add_argument("--skip-raw", action="store_true", help="leave out the raw store phase")
    p.add_argument("--node-url", help="ws://127.0.0.1:PORT/ws of a running node (needs --secret)")
    p.add_argument("--secret", help="that node's IM_AUTH_SECRET")
    p.add_argument("--profile", action="store_true",
                   help="py-spy the node for up to 5 s during saturation")
    args = cli.parse(p, argv)
    if args.node_url and not args.secret:
        p.error("--node-url needs --secret")
    cli.check_load_args(p, args)
    return args


async def _gateway_phases(args: argparse.Namespace, res: dict[str, Any], secret: str,
                          nodes: list[NodeProcess]) -> None:
    url = args.node_url or nodes[0].ws_url
    load = await open_load([url], args.secret or secret, args.pairs, res["namespace"])
    try:
        res["saturation"] = await saturation_phase(load, args, nodes)
        rate = args.rate or max(1.0, res["saturation"]["acks_per_s"] * args.rate_fraction)
        res["latency"] = await latency_phase(load, args, rate, nodes)
    finally:
        res["load_other_frames"] = dict(load.other)
        await load.close()
    if args.store_paced:
        nm = res["latency"]["cpu"].get("node_metrics") or {}
        mean_b = nm.get("mean_batch_size", {}).get("mongo", 1.0)
        res["store_paced"] = await store_paced_phase(
            args.mongo_url, f"{res['namespace']}_paced", rate,
            sorted({1, max(1, round(mean_b)), max(1, round(2 * mean_b))}),
            max(args.duration, 4.0))
        res["store_paced_mean_batch"] = mean_b


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "chat")
    ns = r.namespace("")
    res: dict[str, Any] = {"namespace": ns}
    nodes: list[NodeProcess] = []
    try:
        if not args.skip_raw:
            res["raw"] = await raw_store_phase(args.mongo_url, f"{ns}_raw")
        if not args.node_url:
            nodes = await r.start_nodes(ns, 1, "node")
        res["node"] = {"where": args.node_url or f"started {nodes[0].name}",
                       "pid": nodes[0].pid if nodes else None}
        await _gateway_phases(args, res, r.secret, nodes)
    finally:
        if nodes:  # stop the node, note what it logged, drop our namespace
            await r.stop_nodes(nodes)
            res["node"] = {**res.get("node", {}), **r.nodes[0]}
        if args.node_url:  # someone else's node: only the raw phase's database is ours
            r.namespaces = [f"{ns}_raw"]
        res["cleanup"] = await r.cleanup()
    raw = res.get("raw")
    res["ratio"] = (round(res["saturation"]["acks_per_s"] / raw["best_msgs_per_s"], 3)
                    if raw and raw["best_msgs_per_s"] else None)
    return res


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.chat_bench", argv, parse_args, run, render)


if __name__ == "__main__":
    raise SystemExit(main())
