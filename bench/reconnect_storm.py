"""Reconnect storm: a node killed under N connected users and started again on
the same ports; every user reconnects after a random delay within
``--spread`` s (the SDKs' jittered backoff) and syncs over HTTP.

Run from the repository root (it starts its own node on the local Redis,
RabbitMQ and MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.reconnect_storm                   # 10,000 users
    .venv/bin/python -m bench.reconnect_storm --users 20000 --clients 4

1. One node on fixed free ports; ``--clients`` processes of
   ``bench.many_clients`` open ``--users`` connections, one user each (a
   third of them in groups of 10, created over HTTP first, so the node has
   groups to load for them).
2. SIGKILL the node; wait until the clients saw every connection drop; start
   it again with the same settings and ports (a new node number; Redis and
   MongoDB keep what they had).
3. ``storm``: every client process re-dials its dropped connections, each
   after a uniform random delay in [0, ``--spread``], then ``GET /v1/sync``
   (a 503 asked again after 0.5 s). Measured: time from the restarted node's
   ready line to all reconnected and to all synced, handshakes per second over
   the storm, syncs answered ``unavailable`` (then served) and failed; the
   node's CPU; and from its ``/metrics`` (it started empty) the MongoDB
   commands it sent per reconnection, by collection.

Only 127.0.0.1; every wait is bounded; the node and the clients are stopped
in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import re
import time
from pathlib import Path
from typing import Any

from bench import cli, common
from bench.cluster import Run
from bench.group_support import create_group
from bench.many_clients import SECRET_ENV
from bench.report import cleanup_line, header_lines, md_table
from testkit.http import HttpUsers
from testkit.poll import bounded
from testkit.servers import free_port

log = functools.partial(common.say, "reconnect_storm")
_STORE = re.compile(r'im_store_command_seconds_count\{collection="([^"]+)",command="([^"]+)"')
_BATCH = re.compile(r'im_store_batch_size_(count|sum)\{stage="([^"]+)"\}')
CONNECT_STAGES = ("sanctions", "routes", "devices", "group_loads", "presence")


async def node_cpu(pid: int) -> float:
    """The process's user + system CPU seconds so far."""
    stat = await asyncio.to_thread(Path(f"/proc/{pid}/stat").read_text)
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def store_commands(metrics: dict[str, float]) -> dict[str, float]:
    """MongoDB commands by ``command collection`` from the node's samples."""
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if m := _STORE.match(name):
            key = f"{m.group(2)} {m.group(1)}"
            out[key] = out.get(key, 0.0) + value
    return out


def batches(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """Per batching stage of the node: round trips (batches) and items."""
    out: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        if m := _BATCH.match(name):
            kind, stage = m.group(1), m.group(2)
            out.setdefault(stage, {})["batches" if kind == "count" else "items"] = value
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "storm")
    ns = r.namespace("")
    ports = {"ws_port": free_port(), "http_port": free_port()}
    res: dict[str, Any] = {"namespace": ns, "ports": ports}
    clients: list[common.Child] = []
    node = None
    try:
        node = (await r.start_nodes(ns, 1, "node", **ports))[0]
        prefix = "st"
        users = [f"{prefix}{g}" for g in range(args.users)]
        http = HttpUsers(node.http_url, r.secret)
        try:
            grouped = users[:args.users // 3]
            await bounded((create_group(http, grouped[i], f"g{i}", grouped[i + 1:i + 10])
                           for i in range(0, len(grouped) - 9, 10)), 16)
        finally:
            await http.aclose()
        k = args.clients
        for i in range(k):
            first = sum(common.split(args.users, k)[:i])
            clients.append(await common.Child.spawn(
                common.OUT_DIR / f"storm-{args.stamp}-clients{i}.log", "bench.many_clients",
                "--urls", node.ws_url, "--source-ip", "127.0.0.1", "--prefix", prefix,
                "--first", str(first), "--concurrency", str(max(1, args.concurrency // k)),
                "--tries", "10", **{SECRET_ENV: r.secret}))
            await clients[-1].ask(None)
        opened = await common.ask_all(clients, [{"cmd": "open", "count": n}
                                                for n in common.split(args.users, k)], 900)
        res["opened"] = sum(o["opened"] for o in opened)
        log(f"{res['opened']} connections open; killing the node")
        node.kill()
        await node.wait(30)
        for _ in range(300):
            states = await common.ask_all(clients, [{"cmd": "state"}] * k, 30)
            if sum(s["open"] for s in states) == 0:
                break
            await asyncio.sleep(0.1)
        res["dropped"] = sum(s["dropped"] for s in states)
        t = time.perf_counter()
        node = (await r.start_nodes(ns, 1, "node-again", **ports))[0]
        res["restart_s"] = round(time.perf_counter() - t, 2)
        cpu0, t0 = await node_cpu(node.pid), time.perf_counter()
        storms = await common.ask_all(clients, [{"cmd": "storm", "http": node.http_url,
                                                 "spread": args.spread}] * k, 900)
        wall = time.perf_counter() - t0
        res["node_cpu_s"] = round(await node_cpu(node.pid) - cpu0, 2)
        res["storm_wall_s"] = round(wall, 2)
        res["clients"] = storms
        reconnected = sum(s["reconnected"] for s in storms)
        res["reconnected"], res["synced"] = reconnected, sum(s["synced"] for s in storms)
        res["sync_unavailable_answers"] = sum(s["sync_unavailable_answers"] for s in storms)
        res["sync_failed"] = sum(s["sync_failed"] for s in storms)
        res["seconds_to_all_synced"] = max((s["seconds_to_all"] or 0) for s in storms)
        res["seconds_to_all_reconnected"] = max((s["seconds_to_all_reconnected"] or 0)
                                                for s in storms)
        res["sync_errors"] = {k: sum(s["sync_errors"].get(k, 0) for s in storms)
                              for s0 in storms for k in s0["sync_errors"]}
        metrics = await common.fetch_metrics(node.http_url)
        commands = store_commands(metrics)
        res["connect_batches"] = {
            stage: {**b, "per_reconnect": round(b.get("batches", 0) / max(1, reconnected), 4),
                    "mean_batch": round(b.get("items", 0) / max(1, b.get("batches", 1)), 1)}
            for stage, b in sorted(batches(metrics).items()) if stage in CONNECT_STAGES}
        res["store_commands"] = commands
        res["store_commands_per_reconnect"] = {key: round(v / max(1, reconnected), 3)
                                               for key, v in sorted(commands.items())}
    finally:
        await asyncio.gather(*(c.stop({"cmd": "close"}, 60) for c in clients),
                             return_exceptions=True)
        if node is not None:
            await r.stop_nodes([node])
        res["cleanup"] = (await r.cleanup()).get(ns, {})
    return res


def render(res: dict[str, Any]) -> str:
    lines = header_lines("Reconnect storm", res)
    lines += md_table(["users", "dropped", "reconnected", "synced", "sync 503s (asked again)",
                       "sync transport errors (asked again)", "sync failed",
                       "to all reconnected (s)", "to all synced (s)", "node CPU (s)",
                       "node restart (s)"],
                      [[res.get("opened"), res.get("dropped"), res.get("reconnected"),
                        res.get("synced"), res.get("sync_unavailable_answers"),
                        res.get("sync_errors"), res.get("sync_failed"),
                        res.get("seconds_to_all_reconnected"),
                        res.get("seconds_to_all_synced"), res.get("node_cpu_s"),
                        res.get("restart_s")]])
    lines += ["MongoDB commands per reconnection (the restarted node's, storm and syncs):", ""]
    lines += md_table(["command collection", "per reconnection"],
                      [[k, v] for k, v in res.get("store_commands_per_reconnect", {}).items()])
    lines += ["Redis round trips of the connect path (the node's batching stages: each "
              "batch is one pipeline):", ""]
    lines += md_table(["stage", "round trips", "items", "items per round trip",
                       "round trips per reconnection"],
                      [[k, b.get("batches"), b.get("items"), b.get("mean_batch"),
                        b.get("per_reconnect")]
                       for k, b in res.get("connect_batches", {}).items()])
    return "\n".join(lines + [f"- {cleanup_line(res.get('cleanup', {}))}"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.reconnect_storm", __doc__, (
        ("--users", int, 10_000, "connected users when the node is killed"),
        ("--clients", int, 3, "client processes"),
        ("--concurrency", int, 400, "handshakes at once, over all clients"),
        ("--spread", float, 5.0, "each user reconnects after a random delay up to this (s)")))
    args = cli.parse(p, argv)
    if args.users < 10 or args.clients < 1 or args.spread < 0:
        p.error("--users >= 10, --clients >= 1, --spread >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.reconnect_storm", argv, parse_args, run, render,
                    lambda res: res.get("reconnected") != res.get("opened"))


if __name__ == "__main__":
    raise SystemExit(main())
