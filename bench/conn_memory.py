"""Idle connection memory: what one open, idle WebSocket costs a node, next to a
bare ``websockets`` server measured the same way in the same run.

Run from the repository root (it starts its own node on the local Redis,
RabbitMQ and MongoDB-compatible server, and cleans up after itself)::

    .venv/bin/python -m bench.conn_memory              # 15,000 connections
    .venv/bin/python -m bench.conn_memory --quick      # 2,000

For each server (our node, then the bare server of ``bench.room_baselines idle``):

1. Start it as a subprocess, and ``--clients`` client processes
   (``bench.many_clients``, from 127.0.0.1), each holding its share of the
   connections, so every process stays under the file-descriptor limit (the
   soft RLIMIT_NOFILE is raised to the hard one first; children inherit it).
2. Open ``--warmup`` connections (lazy imports, first-use allocations and
   pool growth happen here), let the server's RSS settle (sampled every
   0.5 s until 5 samples in a row lie within 256 KiB), and take that as the
   baseline.
3. Open the rest, ``--concurrency`` handshakes at a time over all clients,
   each connection as its own user with its own token. Hold them
   ``--hold`` s (the default spans one keepalive ping round, as both servers
   ping every 20 s), let RSS settle again.
4. Check they are really open: the clients' own count, a pinged sample
   (``--ping-sample``) that must all pong, the server's open file
   descriptors, and for the node its ``im_connections`` gauge.
5. Bytes per connection = (RSS after - RSS at baseline) / connections opened
   after the baseline (a node started with ``--workers``: summed over its
   worker processes, as are its CPU and descriptors). RSS is VmRSS from
   /proc/PID/status; RssAnon (the
   heap) is reported too.

Targets (issue): at most 16 KiB per idle connection on a node, and 15,000
connections held by one node (the file-descriptor limit is 20,000 per
process). Output: a markdown report on stdout, everything as JSON in
``bench/out/conn-memory-<UTC timestamp>.json``, the servers' logs beside it.
All traffic goes to 127.0.0.1; every wait is bounded; every subprocess is
stopped in ``finally`` blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from bench import cli, common
from bench.cluster import Run
from bench.many_clients import SECRET_ENV
from bench.report import fmt, header_lines, md_table, node_lines
from bench.stats import merge_counts

TARGET_BYTES = 16 * 1024
TARGET_CONNECTIONS = 15_000
FD_MARGIN = 500  # descriptors a process needs besides its connections


# -- /proc ---------------------------------------------------------------------------
def tree(pid: int) -> list[int]:
    """``pid`` and, for a node started with workers, its worker processes (its
    children running ``gateway serve``): what the server's figures sum over."""
    found = [pid]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and b"gateway\0serve" in cmd:
            found.append(int(entry.name))
    return found


def proc_memory(pid: int) -> dict[str, int]:
    """VmRSS, RssAnon, RssFile and VmHWM in bytes, summed over ``tree(pid)``."""
    out: dict[str, int] = {}
    for one in tree(pid):
        for line in Path(f"/proc/{one}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                out[key] = out.get(key, 0) + int(value.split()[0]) * 1024
    return out


def fd_count(pid: int) -> int:
    return sum(len(os.listdir(f"/proc/{one}/fd")) for one in tree(pid))


async def settled_memory(pid: int, timeout_s: float, window: int = 5,
                         tolerance: int = 256 * 1024) -> dict[str, Any]:
    """Sample every 0.5 s until ``window`` samples in a row lie within ``tolerance``."""
    samples: list[dict[str, int]] = []
    deadline = time.monotonic() + timeout_s
    while True:
        samples.append(proc_memory(pid))
        last = [s["VmRSS"] for s in samples[-window:]]
        stable = len(last) == window and max(last) - min(last) <= tolerance
        if stable or time.monotonic() > deadline:
            return {**samples[-1], "stable": stable, "samples": len(samples)}
        await asyncio.sleep(0.5)


# -- one server ------------------------------------------------------------------------
def cpu_s(pid: int) -> float:
    """User + system CPU seconds so far (/proc), summed over ``tree(pid)``."""
    used = 0
    for one in tree(pid):
        fields = Path(f"/proc/{one}/stat").read_text().rsplit(")", 1)[1].split()
        used += int(fields[11]) + int(fields[12])
    return used / os.sysconf("SC_CLK_TCK")


async def idle_cpu_us(pid: int, seconds: float, held_now: int) -> dict[str, Any]:
    """The server's CPU over ``seconds`` of idle connections (one keepalive round
    at the default 20): its user + system time from /proc, per connection-second."""
    if seconds <= 0:
        return {}

    def cpu() -> float:
        return cpu_s(pid)

    c0, t0 = cpu(), time.perf_counter()
    await asyncio.sleep(seconds)
    c1, t1 = cpu(), time.perf_counter()
    used, wall = c1 - c0, t1 - t0
    return {"seconds": round(wall, 2), "cpu_s": round(used, 3), "cores": round(used / wall, 4),
            "us_per_conn_s": round(used / wall / held_now * 1e6, 3) if held_now else None}


async def measure(kind: str, pid: int, ws_url: str, http_url: str | None,
                  args: argparse.Namespace, secret: str) -> dict[str, Any]:
    """Steps 1-5 of the module docstring against one started server (``http_url``: the
    node's, for its ``im_connections`` gauge)."""
    k = args.clients
    per_client_conc = max(1, -(-args.concurrency // k))
    prefix = f"cm{secrets.token_hex(4)}"
    clients: list[common.Child] = []

    async def on_all(cmd: str, counts: list[int] | None = None) -> list[dict[str, Any]]:
        key = "sample" if cmd == "ping" else "count"
        return await common.ask_all(clients, [{"cmd": cmd, key: n} for n in counts or [0] * k],
                                    600)
    try:
        for i in range(k):
            clients.append(await common.Child.spawn(
                common.OUT_DIR / f"conn-memory-{args.stamp}-{kind}-clients{i}.log",
                "bench.many_clients", "--urls", ws_url, "--source-ip", "127.0.0.1", "--prefix",
                f"{prefix}-{i}-", "--concurrency", str(per_client_conc), "--tries", "3",
                **{SECRET_ENV: secret}))
            await clients[-1].ask(None)  # ready
        fds0 = fd_count(pid)
        warm = await on_all("open", common.split(args.warmup, k))
        warm_open = sum(r["open"] for r in warm)
        before = await settled_memory(pid, args.settle_timeout)
        fds_before = fd_count(pid)
        started, cpu0 = time.perf_counter(), cpu_s(pid)
        rest = await on_all("open", common.split(args.connections - args.warmup, k))
        open_s, open_cpu = time.perf_counter() - started, cpu_s(pid) - cpu0
        opened_after = sum(r["opened"] for r in rest)
        await asyncio.sleep(max(0.0, args.hold - (time.perf_counter() - started)))
        after = await settled_memory(pid, args.settle_timeout)
        idle_cpu = await idle_cpu_us(pid, args.idle_cpu, held_now=args.connections)
        fds_after = fd_count(pid)
        states = await on_all("state")
        pings = await on_all("ping", common.split(args.ping_sample, k))
        # (With workers, the API port answers for one of them: no single gauge.)
        gauge = (await common.fetch_metrics(http_url)).get("im_connections") \
            if http_url and len(tree(pid)) == 1 else None
    finally:
        await asyncio.gather(*(c.stop({"cmd": "close"}, 30) for c in clients),
                             return_exceptions=True)
    held = sum(s["open"] for s in states)
    sampled, ponged = sum(p["sampled"] for p in pings), sum(p["ponged"] for p in pings)
    failed = sum(r["failed"] for r in warm + rest)
    verified = (held == args.connections and ponged == sampled and failed == 0
                and fds_after - fds0 >= args.connections
                and (gauge is None or int(gauge) == args.connections))
    delta = after["VmRSS"] - before["VmRSS"]
    per_conn = delta / opened_after if opened_after else None
    return {
        "server": kind, "pid": pid, "ws_url": ws_url,
        "connections": args.connections, "warmup_open": warm_open,
        "opened_after_baseline": opened_after, "failed": failed,
        "attempt_errors": merge_counts([r["attempt_errors"] for r in warm + rest]),
        "open_seconds": round(open_s, 2),
        "open_per_s": round(opened_after / open_s, 1) if open_s else None,
        "open_cpu_s": round(open_cpu, 2),
        "open_per_cpu_s": round(opened_after / open_cpu, 1) if open_cpu else None,
        "memory_before": before, "memory_after": after,
        "fds": {"at_start": fds0, "before": fds_before, "after": fds_after},
        "client_state": held, "ping": {"sampled": sampled, "ponged": ponged,
                                       "p50_ms": [p["p50_ms"] for p in pings]},
        "im_connections": gauge, "verified": verified,
        "idle_cpu": idle_cpu,
        "rss_delta_bytes": delta, "bytes_per_conn": round(per_conn) if per_conn else None,
        "anon_bytes_per_conn": round((after["RssAnon"] - before["RssAnon"]) / opened_after)
        if opened_after else None,
    }


# -- the run ---------------------------------------------------------------------------
async def run(args: argparse.Namespace) -> dict[str, Any]:
    r = Run(args, "conn-memory")
    ns = r.namespace("")
    results: dict[str, Any] = {"fd_limit": resource.getrlimit(resource.RLIMIT_NOFILE),
                               "namespace": ns, "servers": {}}
    try:
        for kind in args.servers:
            if kind == "node":
                node = (await r.start_nodes(ns, 1, "node"))[0]
                pid, url, http = node.pid, node.ws_url, node.http_url
            else:  # websockets' serve, the handler awaits wait_closed()
                bare, url = await common.Child.server(
                    common.OUT_DIR / f"conn-memory-{args.stamp}-{kind}.log",
                    "bench.room_baselines", "idle")
                pid, http = bare.pid, None
            try:
                common.say("conn_memory", f"{kind}: pid {pid} at {url}")
                res = await measure(kind, pid, url, http, args, r.secret)
            finally:
                if kind == "node":
                    await r.stop_nodes([node])
                    res.update(exit_code=r.nodes[-1]["exit_code"], log=str(node.log_path),
                               log_findings=r.nodes[-1]["log_findings"])
                else:
                    res.update(exit_code=await bare.stop(), log=str(bare.log_path))
            results["servers"][kind] = res
            common.say("conn_memory", f"{kind}: {res['bytes_per_conn']} bytes/conn, "
                       f"verified={res['verified']}")
    finally:
        if "node" in args.servers:
            results["cleanup"] = (await r.cleanup())[ns]
    results["verdict"] = verdict(results, args)
    return results


def verdict(results: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    node, bare = results["servers"].get("node"), results["servers"].get("bare")
    out: dict[str, Any] = {}
    if node and bare and node["bytes_per_conn"] and bare["bytes_per_conn"]:
        out["ratio_node_to_bare"] = round(node["bytes_per_conn"] / bare["bytes_per_conn"], 2)
    if node and node["bytes_per_conn"]:
        out["memory_target_met"] = node["verified"] and node["bytes_per_conn"] <= TARGET_BYTES
        before = node["memory_before"]["VmRSS"] - node["warmup_open"] * node["bytes_per_conn"]
        out["projected_rss_mib_at_15000"] = round(
            (before + TARGET_CONNECTIONS * node["bytes_per_conn"]) / 2**20, 1)
        if args.connections >= TARGET_CONNECTIONS:
            out["connections_target_met"] = node["verified"]
        else:
            out["connections_target_met"] = None  # not tried at this size
    hard = results["fd_limit"][1]
    out["fd_limit_allows_15000"] = hard >= TARGET_CONNECTIONS + FD_MARGIN
    return out


# -- report ----------------------------------------------------------------------------
def report(res: dict[str, Any]) -> str:
    lines = header_lines("Idle connection memory", res)
    s = res["settings"]
    lines += [f"- {s['connections']:,} connections per server from {s['clients']} client "
              f"processes, {s['warmup']:,} of them before the baseline; held {s['hold']} s; "
              f"fd limit (soft, hard) {res['fd_limit']}", ""]
    rows = []
    for r in res["servers"].values():
        mb, ma = r["memory_before"], r["memory_after"]
        check = (f"{r['client_state']:,} open, {r['ping']['ponged']}/{r['ping']['sampled']} "
                 f"pong, fds +{r['fds']['after'] - r['fds']['at_start']:,}"
                 + (f", im_connections {int(r['im_connections']):,}"
                    if r["im_connections"] is not None else ""))
        rows.append([r["server"], r["opened_after_baseline"], r["open_per_s"],
                     r.get("open_per_cpu_s"), "yes" if r["verified"] else "NO", check,
                     mb["VmRSS"] / 2**20, ma["VmRSS"] / 2**20, r["bytes_per_conn"],
                     (r["bytes_per_conn"] or 0) / 1024, r["anon_bytes_per_conn"],
                     "yes" if mb["stable"] and ma["stable"] else "no"])
    lines += md_table(["server", "conns after baseline", "opened/s",
                       "opened per server CPU-second", "verified", "checks",
                       "RSS before (MiB)", "RSS after (MiB)", "bytes/conn", "KiB/conn",
                       "anon bytes/conn", "RSS settled"], rows)
    lines += md_table(["server", "idle window (s)", "CPU (cores)", "CPU per connection-second "
                       "(us)"], [[r["server"], r["idle_cpu"].get("seconds"),
                                 r["idle_cpu"].get("cores"), r["idle_cpu"].get("us_per_conn_s")]
                                for r in res["servers"].values() if r.get("idle_cpu")])
    v = res["verdict"]
    yes_no = {True: "met", False: "NOT met", None: "not tried at this size"}
    if "ratio_node_to_bare" in v:
        lines.append(f"- node / bare websockets: {v['ratio_node_to_bare']}x per connection")
    if "memory_target_met" in v:
        allows = "allows" if v["fd_limit_allows_15000"] else "does NOT allow"
        lines.append(f"- target <= 16 KiB per idle connection on the node: "
                     f"{yes_no[v['memory_target_met']]}")
        lines.append(f"- target 15,000 connections on one node: "
                     f"{yes_no[v['connections_target_met']]} (RSS projected at 15,000: "
                     f"{fmt(v['projected_rss_mib_at_15000'])} MiB; hard fd limit "
                     f"{res['fd_limit'][1]:,} {allows} it)")
    if node := res["servers"].get("node"):
        lines += node_lines([{"name": "node", **node}])
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = cli.new_parser("bench.conn_memory", __doc__, (
        ("--connections", int, TARGET_CONNECTIONS, "idle connections per server, warm-up included"),
        ("--clients", int, 3, "client processes"),
        ("--concurrency", int, 200, "handshakes at once, in all"),
        ("--idle-cpu", float, 20.0, "seconds the server's CPU is measured with every "
         "connection open and idle (0: not measured)"),
        ("--hold", float, 25.0, "seconds from the first connection after the baseline to the "
                                "measurement; 25: one keepalive ping round"),
        ("--settle-timeout", float, 60.0, "seconds RSS may take to settle"),
        ("--ping-sample", int, 300, "connections pinged at the end"),
        ("--servers", str, "node,bare", "which to measure, in order")))
    p.add_argument("--quick", action="store_true", help="2,000 connections, 10 s hold")
    p.add_argument("--warmup", type=int, default=None,
                   help="connections opened before the baseline (default 5%%, at least 100)")
    args = cli.parse(p, argv)
    if args.quick:
        args.connections = 2000
        args.hold = min(args.hold, 10.0)
    if args.warmup is None:
        args.warmup = max(100, args.connections // 20)
    args.servers = [s.strip() for s in args.servers.split(",") if s.strip()]
    if not set(args.servers) <= {"node", "bare"} or not args.servers:
        p.error("--servers takes node and/or bare")
    if not 0 < args.warmup < args.connections or args.clients < 1 or args.concurrency < 1:
        p.error("need 0 < --warmup < --connections, --clients >= 1, --concurrency >= 1")
    limit = common.raise_fd_limit()
    workers = (os.cpu_count() or 1) if args.workers == "auto" else max(1, int(args.workers))
    per_process = -(-args.connections // workers)  # the workers share them
    if per_process + FD_MARGIN > limit:
        p.error(f"{args.connections} connections need more than the fd limit {limit} "
                "allows one server process (--workers N spreads them)")
    if -(-args.connections // args.clients) + FD_MARGIN > limit:
        p.error("too few --clients for the fd limit")
    return args


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.conn_memory", argv, parse_args, run, report, lambda res: not all(
        r["verified"] for r in res["servers"].values()))


if __name__ == "__main__":
    sys.exit(main())
