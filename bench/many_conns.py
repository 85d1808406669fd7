"""Many connections: 100,000 WebSockets held by several nodes on this machine,
every one pinging, with 1:1 and room traffic at a stated rate meanwhile.

Run from the repository root, under the benchmark lock (it starts its own nodes
on the local Redis, RabbitMQ and MongoDB-compatible server, and cleans up)::

    flock /tmp/bench.lock .venv/bin/python -m bench.many_conns \
        --mongo-url mongodb://127.0.0.1:27018                      # 100,000
    flock /tmp/bench.lock .venv/bin/python -m bench.many_conns --quick   # 3,000

The file-descriptor limit is per process (here 20,000, hard), so:

1. ``--nodes`` node processes (``bench.cluster.Run.start_nodes``), each holding
   at most ~15,000 connections, and ``--client-procs`` client processes
   (``bench.many_clients``), process ``i`` connecting from source address
   ``127.0.0.(2+i)`` (so ephemeral ports do not run out), each its share of
   the connections; connection ``g`` is user ``<prefix><g>`` with its own
   token, on node ``g % nodes``.
2. Warm-up: ``--warmup`` connections; each node's RSS is left to settle
   (sampled every 0.5 s until 5 samples in a row lie within 256 KiB, as
   ``bench.conn_memory``): the baseline.
3. Connect storm: all client processes open the rest at once,
   ``--concurrency`` handshakes in flight each (a failed attempt is retried,
   up to 4 tries; every retry and failure is counted by kind). Connect rate =
   connections / seconds of the ramp (overall, per process); handshake latency
   = TCP connect to ``101``. Meanwhile ``ss -ltn`` is sampled for each node's
   accept queue (Recv-Q against the listen backlog, Send-Q).
4. RSS settles again: bytes per connection = (RSS after - RSS at the
   baseline) / connections opened after it, per node (VmRSS; RssAnon too).
5. Hold ``--hold`` s (default 60: at least one round of the node's 20 s
   keepalive pings): every connection sends an app-level ``ping`` every
   ``--ping-every`` s at its own random phase (RTT to ``pong``); 1:1 sends at
   ``--chat-rate``/s over ``--chat-pairs`` pairs (sender and receiver on
   different nodes; ack latency = send -> ``ack``, delivery latency and lost
   messages checked at the receiver); ``--room-members`` connections across all
   nodes in one room, ``--room-rate`` ``room_send``/s into it, every member's
   deliveries counted. CPU of every process, the run-queue wait of each one's
   main thread (``/proc/PID/schedstat``: runnable, no CPU free) and each node's
   loop lag (``im_loop_lag_seconds``) over the hold; then RSS settles again:
   what the hold added per connection.
6. Checks: the clients' own count of open sockets, each node's
   ``im_connections`` gauge, its open descriptors; **dropped** = connections
   that closed (socket lost, or a close frame) before the benchmark told its
   clients to close: must be 0. Kernel facts (``/proc/net/sockstat``,
   ``TcpExt`` counters of ``/proc/net/netstat``) before and after. Once the
   clients closed: seconds until every node's gauge reads 0, then the nodes' stop.

Output: markdown on stdout, everything as JSON in
``bench/out/many-conns-<UTC stamp>.json``, logs beside it. All traffic goes to
127.0.0.x; every wait is bounded (``--max-seconds`` for the whole run); every
process started is stopped in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from bench import cli, common
from bench.cluster import Run
from bench.conn_memory import fd_count, settled_memory
from bench.many_clients import SECRET_ENV, TICK_S
from bench.report import cleanup_line, fmt, header_lines, lat, md_table, node_lines
from bench.stats import merge_counts, merge_hists, report_summary
from testkit.nodes import NodeProcess

FD_MARGIN = 500  # descriptors a process needs besides its connections
NETSTAT = ("ListenOverflows", "ListenDrops", "TCPReqQFullDrop", "TCPReqQFullDoCookies",
           "SyncookiesSent", "TCPBacklogDrop", "TCPTimeouts", "TCPSynRetrans",
           "TCPAbortOnTimeout", "TCPAbortOnMemory", "TCPMemoryPressures")
LAG = "im_loop_lag_seconds_bucket"


# -- kernel facts ----------------------------------------------------------------------
def sockstat() -> dict[str, dict[str, int]]:
    """``/proc/net/sockstat``: {"TCP": {"inuse": .., "tw": .., "mem": .. pages}, ...}."""
    out: dict[str, dict[str, int]] = {}
    for line in Path("/proc/net/sockstat").read_text().splitlines():
        kind, _, rest = line.partition(":")
        words = rest.split()
        out[kind] = {k: int(v) for k, v in zip(words[::2], words[1::2], strict=False)}
    return out


def netstat() -> dict[str, int]:
    """The ``TcpExt`` counters of ``NETSTAT`` (machine-wide)."""
    lines = [x.split() for x in Path("/proc/net/netstat").read_text().splitlines()]
    for head, values in zip(lines[::2], lines[1::2], strict=False):
        if head and head[0] == "TcpExt:":
            row = dict(zip(head[1:], values[1:], strict=False))
            return {k: int(row[k]) for k in NETSTAT if k in row}
    return {}


def schedstat(pids: list[int]) -> dict[int, tuple[float, float]]:
    """(seconds on a CPU, seconds runnable but waiting for one) of each process's main
    thread (the event loop's), from ``/proc/PID/schedstat``."""
    out: dict[int, tuple[float, float]] = {}
    for pid in pids:
        try:
            run, wait, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        except (OSError, ValueError):
            continue
        out[pid] = (int(run) / 1e9, int(wait) / 1e9)
    return out


def sched_delta(a: dict[int, tuple[float, float]], b: dict[int, tuple[float, float]],
                seconds: float) -> dict[str, dict[str, float]]:
    """Per pid over a window: ``cpu`` and ``runqueue`` (waiting for a CPU), both as
    fractions of the window's wall time."""
    return {str(pid): {"cpu": round((b[pid][0] - a[pid][0]) / seconds, 3),
                       "runqueue": round((b[pid][1] - a[pid][1]) / seconds, 3)}
            for pid in b if pid in a and seconds > 0}


def kernel_facts() -> dict[str, Any]:
    return {"sockstat": sockstat(), "netstat": netstat(), "t": time.time()}


def kernel_delta(a: dict[str, Any], b: dict[str, Any]) -> dict[str, int]:
    return {k: b["netstat"][k] - a["netstat"].get(k, 0) for k in b["netstat"]
            if b["netstat"][k] != a["netstat"].get(k, 0)}


async def mongo_ops(url: str) -> dict[str, int]:
    """The MongoDB-compatible server's ``opcounters`` (serverStatus; server-wide)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url, serverSelectionTimeoutMS=3000)
    try:
        return dict((await client.admin.command("serverStatus")).get("opcounters", {}))
    except PyMongoError:
        return {}
    finally:
        await client.close()


async def sample_listen_queues(ports: list[int], stop: asyncio.Event) -> dict[str, Any]:
    """Each port's listen backlog (``ss`` Send-Q) and the longest accept queue
    (Recv-Q) seen, sampled every 0.5 s until ``stop``."""
    seen: dict[int, dict[str, int]] = {p: {"backlog": 0, "max_queue": 0, "full": 0}
                                       for p in ports}
    samples = 0
    while not stop.is_set():
        proc = await asyncio.create_subprocess_exec(
            "ss", "-Hltn", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            out = b""
        samples += 1
        for line in out.decode().splitlines():
            w = line.split()
            if len(w) >= 4 and (port := int(w[3].rpartition(":")[2])) in seen:
                s, queue = seen[port], int(w[1])
                s["backlog"], s["max_queue"] = int(w[2]), max(s["max_queue"], queue)
                s["full"] += queue >= int(w[2])
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.5)
    return {"samples": samples, "ports": {str(p): s for p, s in seen.items()}}


def lag_over(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """A node's ``im_loop_lag_seconds`` over a window: timer firings, and how many
    were later than 10 / 50 / 250 ms (a GC pause or a long turn)."""
    def bucket(le: str) -> float:
        key = f'{LAG}{{le="{le}"}}'
        return after.get(key, 0.0) - before.get(key, 0.0)
    total = bucket("+Inf")
    return {"ticks": int(total), "over_10ms": int(total - bucket("0.01")),
            "over_50ms": int(total - bucket("0.05")), "over_250ms": int(total - bucket("0.25"))}


# -- the run -----------------------------------------------------------------------------
async def start_clients(args: argparse.Namespace, r: Run, urls: str, prefix: str
                        ) -> list[common.Child]:
    clients: list[common.Child] = []
    first = 0
    for i, n in enumerate(common.split(args.conns, args.client_procs)):
        clients.append(await common.Child.spawn(
            common.OUT_DIR / f"many-conns-{args.stamp}-clients{i}.log", "bench.many_clients",
            "--urls", urls, "--source-ip", f"127.0.0.{2 + i}", "--prefix", prefix,
            "--first", str(first), "--concurrency", str(args.concurrency),
            "--max-seconds", str(args.max_seconds + 120), **{SECRET_ENV: r.secret}))
        first += n
    for c in clients:
        await c.ask(None)  # ready
    return clients


async def settle_all(nodes: list[NodeProcess], timeout: float) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(settled_memory(x.pid, timeout) for x in nodes)))


def by_node(answers: list[dict[str, Any]], key: str, n: int) -> list[int]:
    return [sum(a[key].get(str(i), 0) for a in answers) for i in range(n)]


async def measure(args: argparse.Namespace, nodes: list[NodeProcess],
                  clients: list[common.Child], res: dict[str, Any]) -> None:
    """Steps 2-6 of the module docstring; results go into ``res`` as they come."""
    k, n = args.client_procs, len(nodes)
    res["kernel_start"] = kernel_facts()
    warm = await common.ask_all(clients, [{"cmd": "open", "count": c}
                                  for c in common.split(args.warmup, k)], 600)
    res["warmup"] = {"opened": sum(a["opened"] for a in warm),
                     "failed": sum(a["failed"] for a in warm)}
    common.say("many_conns", f"warm-up: {res['warmup']}; settling")
    before = await settle_all(nodes, args.settle_timeout)
    kern0, stop = kernel_facts(), asyncio.Event()
    sampler = asyncio.create_task(sample_listen_queues([x.ws_port for x in nodes], stop))
    pids = list(res["names"])
    meter, sched0, ops0 = (common.Meter(res["names"], top=12), schedstat(pids),
                           await mongo_ops(args.mongo_url))
    started = time.perf_counter()
    try:
        rest = await common.ask_all(clients, [{"cmd": "open", "count": c}
                                      for c in common.split(args.conns - args.warmup, k)], 900)
    finally:
        ramp_s = time.perf_counter() - started
        stop.set()
        res["listen_queues"] = await sampler
    _, ramp_cpu = meter.stop()
    ramp_cpu["sched"] = sched_delta(sched0, schedstat(pids), ramp_s)
    kern1, ops1 = kernel_facts(), await mongo_ops(args.mongo_url)
    opened = sum(a["opened"] for a in rest)
    res["connect"] = {
        "opened": opened, "failed": sum(a["failed"] for a in rest), "seconds": round(ramp_s, 2),
        "per_s": round(opened / ramp_s, 1) if ramp_s else None,
        "per_process": [{"opened": a["opened"], "seconds": a["seconds"], "per_s": a["per_s"],
                         "failed": a["failed"]} for a in rest],
        "attempt_errors": merge_counts([a["attempt_errors"] for a in warm + rest]),
        "handshake": report_summary(merge_hists([a["handshake"] for a in rest])),
        "cpu": ramp_cpu, "kernel": kernel_delta(kern0, kern1),
        "mongo_ops": {k: v - ops0.get(k, 0) for k, v in ops1.items() if v != ops0.get(k, 0)}}
    common.say("many_conns", f"connected {opened:,} in {ramp_s:.1f} s "
               f"({res['connect']['per_s']}/s), failed {res['connect']['failed']}; settling")
    after = await settle_all(nodes, args.settle_timeout)
    opened_per_node = by_node(rest, "by_node", n)
    res["kernel_connected"] = kernel_facts()
    gauges0 = await asyncio.gather(*(common.fetch_metrics(x.http_url) for x in nodes))
    res["nodes_connected"] = [
        {"name": x.name, "pid": x.pid, "ws_port": x.ws_port, "fds": fd_count(x.pid),
         "before": b, "after": a, "opened_after_baseline": o,
         "bytes_per_conn": round((a["VmRSS"] - b["VmRSS"]) / o) if o else None,
         "anon_bytes_per_conn": round((a["RssAnon"] - b["RssAnon"]) / o) if o else None,
         "im_connections": g.get("im_connections")}
        for x, b, a, o, g in zip(nodes, before, after, opened_per_node, gauges0, strict=True)]
    delta, delta_anon = (sum(a[key] - b[key] for b, a in zip(before, after, strict=True))
                         for key in ("VmRSS", "RssAnon"))
    res["memory"] = {"rss_delta_bytes": delta, "bytes_per_conn": round(delta / max(1, opened)),
                     "anon_bytes_per_conn": round(delta_anon / max(1, opened)),
                     "settled": all(m["stable"] for m in before + after),
                     "rss_total_mib": round(sum(a["VmRSS"] for a in after) / 2**20, 1)}
    common.say("many_conns", f"memory: {res['memory']['bytes_per_conn']} bytes/conn; holding "
               f"{args.hold:.0f} s")
    # -- the hold ----------------------------------------------------------------------
    until = time.time() + args.hold
    marker = secrets.token_hex(4)
    cmds = [{"cmd": "hold", "until": until, "ping_every": args.ping_every, "drain": 10.0,
             "chat_rate": args.chat_rate / k, "pairs": p, "room": f"{args.prefix_}room",
             "room_members": m, "room_rate": args.room_rate if i == 0 else 0.0,
             "marker": marker}
            for i, (p, m) in enumerate(zip(common.split(args.chat_pairs, k),
                                           common.split(args.room_members, k), strict=True))]
    m0 = await asyncio.gather(*(common.fetch_metrics(x.http_url) for x in nodes))
    meter, sched0 = common.Meter(res["names"], top=12), schedstat(pids)
    hold = await common.ask_all(clients, cmds, args.hold + 120)
    seconds, cpu = meter.stop()
    cpu["sched"] = sched_delta(sched0, schedstat(pids), seconds)
    m1 = await asyncio.gather(*(common.fetch_metrics(x.http_url) for x in nodes))
    res["hold"] = traffic(hold, args, seconds)
    res["hold"]["cpu"], res["hold"]["window"] = cpu, [until - args.hold, until]
    res["hold"]["node_metrics"] = [common.metrics_delta(a, b) for a, b in zip(m0, m1, strict=True)]
    held = await settle_all(nodes, args.settle_timeout / 2)
    for row, a, b, mem in zip(res["nodes_connected"], m0, m1, held, strict=True):
        row["loop_lag_in_hold"] = lag_over(a, b)
        row["cpu_cores_in_hold"] = cpu["by_pid"].get(str(row["pid"]))
        row["sched_in_hold"] = cpu["sched"].get(str(row["pid"]))
        row["after_hold"] = mem
        row["hold_bytes_per_conn"] = round((mem["VmRSS"] - row["after"]["VmRSS"])
                                           / max(1, int(b.get("im_connections", 1))))
        row["im_connections_after_hold"] = b.get("im_connections")
    states = await common.ask_all(clients, [{"cmd": "state"}] * k, 60)
    res["state"] = {"open": sum(s["open"] for s in states), "dropped": sum(s["dropped"]
                                                                          for s in states),
                    "open_by_node": by_node(states, "open_by_node", n),
                    "drops": merge_counts([s["drops"] for s in states]),
                    "client_rss_mib": [round(s["rss"] / 2**20, 1) for s in states]}
    res["kernel_end"] = kernel_facts()


def traffic(hold: list[dict[str, Any]], args: argparse.Namespace, seconds: float
            ) -> dict[str, Any]:
    """The hold's figures, summed over the client processes."""
    def total(key: str) -> int:
        return sum(h[key] for h in hold)

    def hist(key: str) -> dict[str, Any]:
        return report_summary(merge_hists([h[key] for h in hold]))

    joined, room_acked = total("joined"), total("room_acked")
    return {
        "seconds": round(seconds, 2),
        "ping": {"sent": total("pings_sent"), "ponged": total("pongs"),
                 "per_s": round(total("pings_sent") / args.hold, 1),
                 "overdue": total("ping_overdue"), "late": total("pong_late"),
                 "unanswered": total("ping_unanswered"), "rtt": hist("ping_rtt")},
        "chat": {"target_per_s": args.chat_rate, "sent": total("sent"), "acked": total("acked"),
                 "per_s": round(total("sent") / args.hold, 1),
                 "unanswered": total("unanswered"), "delivered": total("delivered"),
                 "lost": total("lost"), "duplicates": total("dup_deliveries"),
                 "errors": merge_counts([h["send_errors"] for h in hold]),
                 "ack": hist("ack_lat"), "delivery": hist("dlv_lat")},
        "room": {"members": total("room_members"), "joined": joined, "join": hist("join_lat"),
                 "sent": total("room_sent"), "acked": room_acked,
                 "unanswered": total("room_unanswered"), "delivered": total("room_got"),
                 "expected": room_acked * joined,
                 "missing": room_acked * joined - total("room_got"),
                 "ack": hist("room_ack_lat"), "delivery": hist("room_lat")},
        "client_loop_lag": hist("loop_lag"),
        "client_cpu_cores": [round(h["cpu_s"] / seconds, 3) for h in hold],
        "other_frames": merge_counts([h["other"] for h in hold])}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "many-conns")
    ns = r.namespace("")
    args.prefix_ = f"mc{secrets.token_hex(3)}-"
    res: dict[str, Any] = {"fd_limit": common.raise_fd_limit(), "namespace": ns}
    nodes: list[NodeProcess] = []
    clients: list[common.Child] = []
    try:
        async with asyncio.timeout(args.max_seconds):
            nodes = await r.start_nodes(ns, args.nodes, "node", **args.node_settings)
            urls = ",".join(x.ws_url for x in nodes)
            common.say("many_conns", f"{len(nodes)} nodes at {urls}")
            clients = await start_clients(args, r, urls, args.prefix_)
            res["names"] = {os.getpid(): "orchestrator (this process)",
                            **{x.pid: f"node {i} {x.name}" for i, x in enumerate(nodes)},
                            **{c.pid: f"clients {i} (127.0.0.{2 + i})"
                               for i, c in enumerate(clients)}}
            await measure(args, nodes, clients, res)
    except Exception as exc:  # noqa: BLE001 - reported, and the run still cleans up
        res["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        common.say("many_conns", f"FAILED: {res['error']}")
    finally:
        closes = await asyncio.gather(*(c.ask({"cmd": "close"}, 60) for c in clients),
                                      return_exceptions=True)
        res["closed_by_benchmark"] = [c if isinstance(c, dict) else repr(c) for c in closes]
        await asyncio.gather(*(c.stop(None, 15) for c in clients), return_exceptions=True)
        if nodes:
            res["disconnect"] = await disconnected(nodes, 120.0)
        started = time.perf_counter()
        await r.stop_nodes(nodes)
        res["nodes_stop_seconds"] = round(time.perf_counter() - started, 1)
        res["node_logs"] = r.nodes
        res["cleanup"] = await r.cleanup()
    finals = [c for c in res["closed_by_benchmark"] if isinstance(c, dict)]
    res["dropped"] = (sum(c["dropped"] for c in finals) if len(finals) == len(clients)
                      and clients else None)
    res["verdict"] = verdict(res, args)
    return res


async def disconnected(nodes: list[NodeProcess], timeout: float) -> dict[str, Any]:
    """After the clients closed: seconds until every node's ``im_connections`` is 0
    (every disconnect handled), polled every 0.5 s for at most ``timeout`` s."""
    started = time.perf_counter()
    gauges: list[float | None] = []
    for _ in range(int(timeout / 0.5)):
        got = await asyncio.gather(*(common.fetch_metrics(x.http_url) for x in nodes))
        gauges = [g.get("im_connections") for g in got]
        if all(g == 0 for g in gauges):
            break
        await asyncio.sleep(0.5)
    return {"seconds": round(time.perf_counter() - started, 1), "im_connections": gauges,
            "all_zero": all(g == 0 for g in gauges)}


def verdict(res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    checks: dict[str, bool] = {"ran": "error" not in res and "state" in res}
    if checks["ran"]:
        h, st, nc = res["hold"], res["state"], res["nodes_connected"]
        checks.update({
            "all connected": res["warmup"]["failed"] + res["connect"]["failed"] == 0,
            "all held (clients' count)": st["open"] == args.conns,
            "im_connections sums to it": sum(int(x["im_connections_after_hold"] or 0)
                                             for x in nc) == args.conns,
            "every node's gauge = its share": all(
                int(x["im_connections_after_hold"] or 0) == o
                for x, o in zip(nc, st["open_by_node"], strict=True)),
            "every ping answered": h["ping"]["unanswered"] == 0 and h["ping"]["overdue"] == 0,
            "1:1: all acked, none lost": h["chat"]["unanswered"] == 0 and h["chat"]["lost"] == 0
            and not h["chat"]["errors"] and h["chat"]["sent"] > 0,
            "room: every member got every message": h["room"]["missing"] == 0
            and h["room"]["joined"] == h["room"]["members"] and h["room"]["unanswered"] == 0})
    checks["none dropped"] = res.get("dropped") == 0
    return {"checks": checks, "passed": all(checks.values())}


# -- report ------------------------------------------------------------------------------
def ms(s: dict[str, Any]) -> str:
    return lat(s, "p50 p99 max")


def report(res: dict[str, Any]) -> str:
    s = res["settings"]
    lines = header_lines("Many connections", res)
    lines += [f"- {s['conns']:,} connections, {s['nodes']} nodes, {s['client_procs']} client "
              f"processes (127.0.0.2-{1 + s['client_procs']}), {s['concurrency']} handshakes in "
              f"flight per process; warm-up {s['warmup']:,}; hold {s['hold']:.0f} s: a ping every "
              f"{s['ping_every']:g} s per connection, 1:1 {s['chat_rate']:g} msgs/s over "
              f"{s['chat_pairs']} pairs, room of {s['room_members']:,} members at "
              f"{s['room_rate']:g} msgs/s; fd limit (soft, hard) {res['fd_limit']}", ""]
    if "error" in res:
        lines += [f"**Run failed:** `{res['error']}`", ""]
    if "hold" in res:
        c, m, h, st = res["connect"], res["memory"], res["hold"], res["state"]
        ping, chat, room, dis = h["ping"], h["chat"], h["room"], res.get("disconnect") or {}
        rows: list[list[Any]] = [
            ["connections held after the hold (clients' count)", f"{st['open']:,}"],
            ["dropped (closed before the benchmark closed them)", res.get("dropped")],
            ["node RSS per connection (all nodes; VmRSS / RssAnon bytes)",
             f"{fmt(m['bytes_per_conn'])} / {fmt(m['anon_bytes_per_conn'])}"
             + ("" if m["settled"] else " (RSS did not settle)")],
            ["node RSS total after connect (MiB)", m["rss_total_mib"]],
            ["connect rate (conns/s over the ramp)", f"{fmt(c['per_s'])} ({c['opened']:,} in "
             f"{fmt(c['seconds'])} s); per process "
             + ", ".join(fmt(p["per_s"]) for p in c["per_process"])],
            ["handshake p50 / p99 / max (ms)", ms(c["handshake"])],
            ["MongoDB server ops in the connect ramp (per connection)", ", ".join(
                f"{k} {v:,} ({v / max(1, c['opened']):.2f})"
                for k, v in c.get("mongo_ops", {}).items()) or "-"],
            ["connections failed / attempt errors", f"{c['failed'] + res['warmup']['failed']} / "
             + (", ".join(f"{k} {v}" for k, v in c["attempt_errors"].items()) or "none")],
            [f"ping RTT p50 / p99 / max (ms), {ping['rtt']['count']:,} pongs at "
             f"{fmt(ping['per_s'])}/s", ms(ping["rtt"])],
            ["pings unanswered / overdue / late pongs",
             f"{ping['unanswered']} / {ping['overdue']} / {ping['late']}"],
            [f"1:1 ack p50 / p99 / max (ms), {chat['acked']:,} acked at {fmt(chat['per_s'])}/s",
             ms(chat["ack"])],
            ["1:1 delivery p50 / p99 / max (ms)", ms(chat["delivery"])],
            ["1:1 unanswered / lost / duplicates / errors",
             f"{chat['unanswered']} / {chat['lost']} / {chat['duplicates']} / "
             + (", ".join(f"{k} {v}" for k, v in chat["errors"].items()) or "none")],
            ["room: joined, join p50 / p99 / max (ms)",
             f"{room['joined']:,} of {room['members']:,}; {ms(room['join'])}"],
            [f"room: {room['acked']} sends acked, deliveries / expected",
             f"{room['delivered']:,} / {room['expected']:,}"],
            ["room: ack, delivery p50 / p99 / max (ms)",
             f"{ms(room['ack'])}; {ms(room['delivery'])}"],
            ["client loop lag p50 / p99 / max (ms)", ms(h["client_loop_lag"])],
            ["machine CPU busy % in the hold / in the connect ramp",
             f"{h['cpu']['machine_busy_pct']} / {c['cpu']['machine_busy_pct']}"],
            ["client processes' CPU in the hold (cores)",
             ", ".join(fmt(x) for x in h["client_cpu_cores"])],
            ["after the benchmark closed all: seconds until every node's im_connections "
             "was 0; node stop (SIGTERM) seconds",
             f"{fmt(dis.get('seconds'))}{'' if dis.get('all_zero') else ' (NOT all zero)'}; "
             f"{fmt(res.get('nodes_stop_seconds'))}"]]
        lines += md_table(["figure", "value"], rows)
        lines += ["### Per node", ""]
        nrows: list[list[Any]] = []
        for i, x in enumerate(res["nodes_connected"]):
            lq = res["listen_queues"]["ports"].get(str(x.get("ws_port", "")), {})
            lag, sch = x["loop_lag_in_hold"], x.get("sched_in_hold") or {}
            ramp = c["cpu"]["sched"].get(str(x["pid"])) or {}
            nrows.append([
                f"{i} {x['name']}", f"{st['open_by_node'][i]:,} / "
                f"{int(x['im_connections_after_hold'] or 0):,} / {x['fds']:,}",
                f"{x['before']['VmRSS'] / 2**20:.1f} / {x['after']['VmRSS'] / 2**20:.1f} / "
                f"{x['after_hold']['VmRSS'] / 2**20:.1f}",
                f"{fmt(x['bytes_per_conn'])} / {fmt(x['anon_bytes_per_conn'])}",
                x["hold_bytes_per_conn"],
                f"{lq.get('max_queue')} / {lq.get('backlog')}; {lq.get('full')} of "
                f"{res['listen_queues']['samples']}",
                f"{fmt(ramp.get('cpu'))} / {fmt(ramp.get('runqueue'))}",
                f"{fmt(sch.get('cpu'))} / {fmt(sch.get('runqueue'))}",
                f"{lag['over_10ms']} / {lag['over_50ms']} / {lag['over_250ms']} of "
                f"{lag['ticks']}"])
        lines += md_table([
            "node", "open (clients) / im_connections / fds",
            "RSS base / connected / after hold (MiB)", "bytes/conn (VmRSS / anon)",
            "+bytes/conn in the hold", "accept queue max / backlog; samples full",
            "ramp: CPU / run-queue wait (share of wall)",
            "hold: CPU / run-queue wait", "hold: loop lag >10/50/250 ms of ticks"], nrows)
        lines += ["### Kernel", ""]
        k0, k1, ke = res["kernel_start"], res["kernel_connected"], res["kernel_end"]
        tcp = [k["sockstat"]["TCP"] for k in (k0, k1, ke)]
        lines += ["- TCP sockets (sockstat) at start / all connected / end of hold: "
                  + " / ".join(f"inuse {t['inuse']:,}, tw {t['tw']:,}, mem {t['mem']:,} pages"
                               for t in tcp),
                  "- TcpExt counters that moved during the connect ramp: "
                  + (", ".join(f"{k} +{v:,}" for k, v in c["kernel"].items()) or "none"),
                  "- ... over the whole run: "
                  + (", ".join(f"{k} +{v:,}" for k, v in kernel_delta(k0, ke).items())
                     or "none"),
                  "- busiest processes in the connect ramp (cores): "
                  + ", ".join(f"{p['what']} {p['cores']}" for p in c["cpu"]["top"][:8]),
                  "- busiest processes in the hold (cores): "
                  + ", ".join(f"{p['what']} {p['cores']}" for p in h["cpu"]["top"][:8]),
                  f"- drops by kind: {st['drops'] or 'none'}; frames nobody expected: "
                  f"{h['other_frames'] or 'none'}", ""]
    v = res["verdict"]
    lines += ["### Checks", ""] + [f"- {k}: {'yes' if ok else '**NO**'}"
                                   for k, ok in v["checks"].items()]
    lines += [""] + node_lines(res.get("node_logs", []))
    lines += ["", cleanup_line(res.get("cleanup", {}))]
    return "\n".join(lines)


# -- command line ------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.new_parser("bench.many_conns", __doc__, (
        ("--conns", int, 100_000, "connections in all, warm-up included"),
        ("--nodes", int, 7, "node processes"),
        ("--client-procs", int, 6, "client processes (source addresses 127.0.0.2, ...)"),
        ("--concurrency", int, 200, "handshakes in flight per client process"),
        ("--hold", float, 60.0, "seconds all are held with traffic"),
        ("--ping-every", float, 30.0, "seconds between one connection's pings"),
        ("--chat-rate", float, 100.0, "1:1 sends per second, in all"),
        ("--chat-pairs", int, 100, "1:1 sender -> receiver pairs, in all"),
        ("--room-members", int, 1000, "members of the room, over all nodes"),
        ("--room-rate", float, 2.0, "room_send per second into the room"),
        ("--settle-timeout", float, 60.0, "seconds RSS may take to settle"),
        ("--max-seconds", float, 840.0, "the whole run is cut off after this")))
    p.add_argument("--warmup", type=int, default=None,
                   help="connections before the memory baseline (default 100 per node)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a node setting (IM_KEY), e.g. --set events=none; repeatable")
    p.add_argument("--quick", action="store_true",
                   help="3,000 connections, 2 nodes, 2 client processes, 15 s hold")
    args = cli.parse(p, argv)
    if args.quick:
        args.conns, args.nodes, args.client_procs = 3000, 2, 2
        args.hold, args.ping_every = 15.0, min(args.ping_every, 5.0)
        args.room_members, args.chat_pairs = min(args.room_members, 300), min(args.chat_pairs,
                                                                               20)
        args.chat_rate = min(args.chat_rate, 50.0)
    if args.warmup is None:
        args.warmup = 100 * args.nodes
    args.node_settings = {}
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[a-z_]+", key):
            p.error(f"--set {item!r}: want key=value (a node setting, lower case)")
        args.node_settings[key] = value
    if min(args.nodes, args.client_procs, args.concurrency) < 1 or args.client_procs > 200:
        p.error("--nodes, --client-procs (<= 200) and --concurrency must be >= 1")
    if not 0 < args.warmup < args.conns or args.hold <= 0 or args.ping_every < TICK_S:
        p.error("need 0 < --warmup < --conns, --hold > 0, --ping-every >= 0.05")
    if args.room_members > args.conns // 2 or args.chat_pairs * 2 > args.conns // 2:
        p.error("--room-members and 2 x --chat-pairs must each be at most half of --conns")
    if min(args.chat_rate, args.room_rate) < 0 or args.room_rate > 10:
        p.error("rates must be >= 0; --room-rate at most 10/s (the node's per-user budget)")
    limit = common.raise_fd_limit()
    for what, n in (("node", args.nodes), ("client process", args.client_procs)):
        if -(-args.conns // n) + FD_MARGIN > limit:
            flag = "--nodes" if what == "node" else "--client-procs"
            p.error(f"{args.conns:,} connections over {n} {what}es exceed the fd limit "
                    f"{limit:,} per process: raise {flag}")
    return args


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.many_conns", argv, parse_args, run, report,
                    lambda res: not res["verdict"]["passed"])


if __name__ == "__main__":
    raise SystemExit(main())
