"""Room fan-out benchmark: N subscribers in one room, one publisher; our node
against a bare ``websockets`` broadcast server and python-socketio, same client.

    .venv/bin/python -m bench.room_bench            # 1000 subscribers per node, 10 s phases
    .venv/bin/python -m bench.room_bench --quick    # 100 subscribers, 3 s phases

It starts every server and client itself (our nodes use the local Redis, RabbitMQ
and MongoDB-compatible server), uses 127.0.0.1 only, bounds every wait, and stops
and cleans up everything. Phases, each on fresh servers and subscriber processes
(``bench/room_client.py``, or with ``--client-impl c`` its C twin
``bench/room_client_c.py`` for ours and ws; the publisher is this process): ``ours`` (one node),
``ws`` and ``sio`` (``bench/room_baselines.py``), each **throughput** then
**paced**; then ``ours-3``: three nodes, ``--subscribers`` on each, publisher on
node 0, throughput.

- Throughput: ``--window`` room sends kept un-acked (ours: ``ok`` after the
  broker's confirm; ws: ``ok`` once ``broadcast()`` returned; sio: the event's ack
  once ``emit`` to the room returned); ours with ``IM_ROOM_RATE_CAP=0``. Paced:
  ``--rate`` sends/s; ours with its default cap (50/s per member) and window (25 ms).
- Over the measured window: published/s, deliveries/s (messages received by all
  subscribers, not the publisher), frames/s, latency (receive ``time.time()`` -
  the publisher's, in the body) p50/p99/max, CPU per process (1.0 = one core);
  after a drain, loss = acked sends x subscribers - received (whole phase).

Output: markdown on stdout; JSON in ``bench/out/room-<UTC stamp>.json``, logs beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import cli, common, report
from bench import room_client as rc
from bench.cluster import Run
from bench.report import cleanup_line, fmt, header_lines, md_table, node_lines
from bench.stats import hist_summary, int_keys, latency_summary, merge_counts
from testkit.nodes import NodeProcess

TARGETS = {"vs_sio": 10.0, "vs_ws": 2.0, "paced_p99_ms": 100.0, "three_vs_one": 2.0}


@dataclass
class Server:
    kind: str  # ours | ws | sio: the client protocol
    label: str
    urls: list[str] = field(default_factory=list)
    pids: dict[int, str] = field(default_factory=dict)
    nodes: list[NodeProcess] = field(default_factory=list)
    proc: common.Child | None = None
    sampled: int = 0  # subscribers that report latency


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Run(args, "room")  # namespaces, node exit codes and log findings, cleanup
        self.logs: list[dict[str, Any]] = []  # of the baseline and client processes

    def log_path(self, label: str) -> Path:
        return common.OUT_DIR / f"room-{self.args.stamp}-{label}.log"

    # -- servers --------------------------------------------------------------------------
    async def start_ours(self, label: str, n: int, cap: str | None) -> Server:
        ns = self.run.namespace(label.replace("-", "")[:12])
        server = Server("ours", label)
        server.nodes = await self.run.start_nodes(
            ns, n, label, room_send_rate=1_000_000, room_send_burst=1_000_000,
            **({"room_rate_cap": cap} if cap is not None else {}))
        server.urls = [x.ws_url for x in server.nodes]
        server.pids = {x.pid: f"node {i} ({label})" for i, x in enumerate(server.nodes)}
        return server

    async def start_baseline(self, label: str, mode: str) -> Server:
        proc, url = await common.Child.server(self.log_path(label), "bench.room_baselines", mode,
                                              "--max-seconds", str(int(self.args.max_child_s)))
        return Server(mode[:3], label, [url], {proc.pid: f"{label} server"}, proc=proc)

    async def stop_server(self, server: Server) -> None:
        if server.proc is not None:
            code = await server.proc.stop()  # EOF: the baseline stops
            self.logs.append({"what": f"{server.label} server", "exit_code": code,
                              "stderr": server.proc.tail()})
        await self.run.stop_nodes(server.nodes)

    # -- subscribers ------------------------------------------------------------------------
    async def start_clients(self, server: Server, total: int) -> list[common.Child]:
        a, procs = self.args, []
        per = math.ceil(total / a.client_procs)
        module = "bench.room_client" + ("_c" if client_impl(a, server.kind) == "c" else "")
        try:
            for i, first in enumerate(range(0, total, per)):
                procs.append(await common.Child.spawn(
                    self.log_path(f"{server.label}-client{i}"), module, "--kind",
                    server.kind, "--urls", ",".join(server.urls), "--first", str(first),
                    "--count", str(min(per, total - first)), "--tag", server.label.replace(
                        "-", ""), "--sample-every", str(a.sample_every), "--max-seconds",
                    str(int(a.max_child_s)), *(["--poll-us", str(a.client_poll_us)]
                                               if module.endswith("_c") else []),
                    ROOM_BENCH_SECRET=self.run.secret))
                server.pids[procs[-1].pid] = f"subscribers {i} ({server.label})"
            for c in procs:
                ready = await c.ask(None, 60 + total / 20)
                if ready.get("ev") != "ready":
                    raise RuntimeError(f"subscribers failed: {ready}")
                server.sampled += ready["sampled"]
        except BaseException:
            await self.stop_clients(server, procs)
            raise
        return procs

    async def stop_clients(self, server: Server, procs: list[common.Child]) -> None:
        codes = await asyncio.gather(*(c.stop({"cmd": "quit"}) for c in procs),
                                     return_exceptions=True)
        for i, (c, code) in enumerate(zip(procs, codes, strict=True)):
            self.logs.append({"what": f"{server.label} subscribers {i}", "exit_code": code,
                              "stderr": c.tail()})

    # -- one phase ----------------------------------------------------------------------------
    async def phase(self, label: str, mode: str, start: Any) -> dict[str, Any]:
        async with contextlib.AsyncExitStack() as stack:  # stopped in reverse order
            server: Server = await start()
            stack.push_async_callback(self.stop_server, server)
            subs = self.args.subscribers * len(server.urls)
            clients = await self.start_clients(server, subs)
            stack.push_async_callback(self.stop_clients, server, clients)
            url, user = server.urls[0], f"{label.replace('-', '')}-pub"
            conn = await rc.open_conn(server.kind, url, rc.conn_path(
                server.kind, url, user, self.run.secret), rc.Stats(1))
            stack.callback(conn.abort)
            r = await self.measure(server, clients, rc.Publisher(conn), mode, subs)
        return {"server": label, "kind": server.kind, "mode": mode, "nodes": len(server.urls),
                "subscribers": subs, "client_impl": client_impl(self.args, server.kind), **r}

    async def measure(self, server: Server, clients: list[common.Child], pub: rc.Publisher,
                      mode: str, subs: int) -> dict[str, Any]:
        a = self.args
        marker = f"~{os.urandom(4).hex()}~"
        pub.begin(marker)
        warmup, seconds = (a.warmup, a.seconds) if mode == "throughput" else (1.0, a.paced_seconds)
        rate = a.scale_rate if mode == "scale" else a.rate
        open_t = time.time() + 0.2 + warmup
        close_t = open_t + seconds
        for c in clients:
            await c.ask({"cmd": "phase", "marker": marker, "open": open_t, "close": close_t})
        names = {**server.pids, os.getpid(): "publisher (the benchmark process)"}
        sender = asyncio.create_task(pub.closed_loop(a.window, close_t) if mode == "throughput"
                                     else pub.paced(rate, close_t))
        try:
            win, cpu, deltas = await common.measure_window(
                names, server.nodes, open_t, close_t,
                lambda on: setattr(pub, "window_open", on), clock=time.time, top=8)
            done, _ = await asyncio.wait({sender}, timeout=10)  # acks may have stopped
            lags = sender.result() if done else None
        finally:
            sender.cancel()
        stats, drain_s = await self.drain(clients, pub, subs)
        received = sum(s["total"] for s in stats)
        hist = merge_counts([int_keys(s["hist"]) for s in stats])
        dlv, frames = sum(s["win"] for s in stats), sum(s["frames_win"] for s in stats)
        return {
            "seconds": round(win, 3), "published_per_s": round(pub.sent_win / win, 1),
            "deliveries_per_s": round(dlv / win, 1), "frames_per_s": round(frames / win, 1),
            "msgs_per_frame": round(dlv / frames, 2) if frames else None,
            "latency": hist_summary(hist, max(s["lat_max"] for s in stats)),
            "latency_hist": hist,
            "latency_sample": f"{server.sampled} of {subs} subscribers",
            "sent": pub.sent, "acked": pub.acked, "unacked": len(pub.inflight),
            "errors": dict(pub.errors), "publisher_echo": pub.echo, "publisher_stuck": not done,
            "expected": pub.acked * subs, "received": received,
            "loss": pub.acked * subs - received, "drain_s": drain_s,
            "per_socket_min_max": [min(s["got_min"] for s in stats),
                                   max(s["got_max"] for s in stats)],
            "short_sockets": sum(s["short"] for s in stats),
            "closed_sockets": sum(s["closed"] for s in stats),
            "client_other": merge_counts([s["other"] for s in stats]),
            "per_node_deliveries_per_s": [round(sum(s["url_win"][i] for s in stats) / win, 1)
                                          for i in range(len(server.urls))],
            "send_lag": latency_summary(lags) if lags else None,
            "ack_latency": latency_summary(pub.ack_lat) if pub.ack_lat else None,
            "cpu": cpu, "cores": cores_by_role(cpu, server.pids),
            "node_counters": [d["counters"] for d in deltas],
            "node_stages": [{k: v for k, v in d["histograms"].items()
                             if "room_stage" in k or "loop_lag" in k}
                            for d in deltas]}

    async def drain(self, clients: list[common.Child], pub: rc.Publisher,
                    subs: int) -> tuple[list[dict[str, Any]], float]:
        """Poll the subscribers until every acked message has arrived everywhere, nothing
        moved for 2 s with no send left un-acked, or ``--drain`` s passed."""
        t0 = still = time.perf_counter()
        last = -1
        while True:
            stats = [await c.ask({"cmd": "stats"}) for c in clients]
            got, now = sum(s["total"] for s in stats), time.perf_counter()
            if got != last:
                last, still = got, now
            if (got >= pub.acked * subs and not pub.inflight) \
                    or (now - still > 2 and not pub.inflight) or now - t0 > self.args.drain:
                return stats, round(now - t0, 2)
            await asyncio.sleep(0.25)


def client_impl(args: argparse.Namespace, kind: str) -> str:
    """The subscriber processes' implementation for server ``kind``: sio keeps Python's."""
    return "py" if kind == "sio" else args.client_impl


def cores_by_role(cpu: dict[str, Any], pids: dict[int, str]) -> dict[str, Any]:
    """Cores of the server(s), subscriber processes, publisher, and everything else."""
    by = {int(k): v for k, v in cpu["by_pid"].items()}
    busy = (cpu["machine_busy_pct"] or 0) / 100 * (os.cpu_count() or 1)
    return {"server": [by.get(p, 0.0) for p, n in pids.items() if not n.startswith("sub")],
            "clients": [by.get(p, 0.0) for p, n in pids.items() if n.startswith("sub")],
            "publisher": by.get(os.getpid(), 0.0), "machine_busy_pct": cpu["machine_busy_pct"],
            "others": round(max(0.0, busy - sum(by.values())), 2)}


# -- report -----------------------------------------------------------------------------------
def phase_row(r: dict[str, Any]) -> list[Any]:
    if "error" in r:
        return [r["server"], "**failed**: " + r["error"][:200]] + [None] * 10
    c, lat = r["cores"], r["latency"]
    hot = [f"{w} {x:.2f}" for w in ("server", "clients") for x in c[w] if x >= 0.9]
    return [r["server"], r["subscribers"], r["published_per_s"], r["deliveries_per_s"],
            r["frames_per_s"], report.lat(lat, "p50 p99 max"),
            f"{r['loss']:,} of {r['expected']:,}", " + ".join(f"{x:.2f}" for x in c["server"]),
            " + ".join(f"{x:.2f}" for x in c["clients"]), c["publisher"],
            c["others"], f"{c['machine_busy_pct']}%" + (f"; near 1 core: {', '.join(hot)}"
                                                       if hot else "")]


def targets(res: dict[str, Any]) -> list[list[Any]]:
    ph = {(r["server"], r["mode"]): r for r in res["phases"] if "error" not in r}

    def dps(server: str) -> float | None:
        return ph.get((server, "throughput"), {}).get("deliveries_per_s")

    def div(x: float | None, y: float | None) -> float | None:
        return round(x / y, 2) if x is not None and y else None

    paced = ph.get(("ours", "paced"))
    one, three = ph.get(("ours", "scale")), ph.get(("ours-3", "scale"))
    same_load = div(three["deliveries_per_s"], one["deliveries_per_s"]) if one and three else None
    rows = []
    for what, v, key in (
            ("ours / python-socketio, deliveries/s", div(dps("ours"), dps("sio")), "vs_sio"),
            ("ours / bare websockets broadcast, deliveries/s", div(dps("ours"), dps("ws")),
             "vs_ws"),
            (f"ours p99 latency at {res['settings']['rate']:g} msgs/s (ms)",
             paced["latency"]["p99_ms"] if paced else None, "paced_p99_ms"),
            ("ours 3 nodes / 1 node, deliveries/s, both saturated", div(dps("ours-3"),
             dps("ours")), "three_vs_one"),
            (f"ours 3 nodes / 1 node, deliveries/s, both offered {res['settings']['scale_rate']:g}"
             " msgs/s", same_load, "three_vs_one")):
        less = key == "paced_p99_ms"
        ok = None if v is None else (v < TARGETS[key] if less else v >= TARGETS[key])
        rows.append([what, v, f"{'<' if less else '>='} {TARGETS[key]:g}",
                     "-" if ok is None else ("met" if ok else "**not met**")])
    return rows


def notes(res: dict[str, Any]) -> list[str]:
    out = []
    for r in (r for r in res["phases"] if "error" not in r):
        odd = {**r["errors"], **r["client_other"]}
        node = merge_counts([{k[3:]: v for k, v in c.items() if "dropped" in k
                                 or "skipped" in k or "closed" in k} for c in r["node_counters"]])
        if odd or node or r["closed_sockets"] or r["short_sockets"] or r["unacked"] \
                or r["publisher_stuck"]:
            out.append(f"- {r['server']} {r['mode']}: closed sockets {r['closed_sockets']}, "
                       f"sockets short of the best-served one {r['short_sockets']}, unacked "
                       f"{r['unacked']}, publisher stuck {r['publisher_stuck']}; errors / "
                       f"client saw {odd or '-'}; node counters {node or '-'}")
    out += node_lines(res["nodes"], trouble_only=True)
    out.append(f"- subscriber processes: --client-impl {res['settings'].get('client_impl', 'py')}"
               f", --client-poll-us {res['settings'].get('client_poll_us', 0)}"
               " (the same client for every server measured here)")
    return out + [f"- {p['what']} exit {p['exit_code']}, stderr: {p['stderr'][-300:]!r}"
                  for p in res["logs"] if p["exit_code"] or p["stderr"].strip()]


def render(res: dict[str, Any]) -> str:
    s, v = res["settings"], res["versions"]
    lines = header_lines("Room fan-out benchmark", res, "; servers, subscriber processes, "
                         "the publisher, Redis, RabbitMQ and the store share these CPUs")
    impl = s.get("client_impl", "py")
    lines += [f"- one room; {s['subscribers']} subscribers per node in {s['client_procs']} "
              + ("processes in C (--client-impl c: bench/room_client_c.py, epoll)" if impl == "c"
                 else "processes in Python (--client-impl py: bench/room_client.py, uvloop)")
              + "; 1 publisher (the benchmark process); body ~100 B of JSON; uvloop in every "
              "Python process, no compression; latency: every message of "
              f"1 in {s['sample_every']} subscribers",
              f"- throughput: {s['window']} un-acked sends (acked by ours after the broker's "
              "confirm, by ws once broadcast() returned, by sio once emit() returned), "
              f"{s['warmup']} s warm-up, {s['seconds']} s measured; ours with "
              "IM_ROOM_RATE_CAP=0 (no per-member cap)",
              f"- paced: {s['rate']:g} msgs/s, {s['paced_seconds']} s measured after 1 s; ours "
              "with its default IM_ROOM_RATE_CAP (50/s) and IM_ROOM_WINDOW_MS (25)",
              f"- ours: RabbitMQ broker, IM_ROOM_SEND_RATE/BURST 1e6; ws: websockets "
              f"{v['websockets']} serve(compression=None), broadcast() per message; sio: "
              f"python-socketio {v['socketio']} AsyncServer on {s['sio_mode']}"
              f"{' (uvicorn)' if s['sio_mode'] == 'asgi' else ''}, enter_room + emit(room=)", ""]
    head = ["server", "subs", "published/s", "deliveries/s", "frames/s",
            "latency p50 / p99 / max (ms)", "loss (of expected)", "server CPU",
            "subscriber procs CPU", "publisher CPU", "other procs CPU", "machine busy"]
    for mode, title in (("throughput", "Throughput (closed loop)"),
                        ("paced", f"Paced, {s['rate']:g} msgs/s"),
                        ("scale", f"Same offered load, 1 node and 3 nodes: {s['scale_rate']:g} "
                                  "msgs/s, no cap")):
        rows = [phase_row(r) for r in res["phases"] if r["mode"] == mode]
        lines += [f"## {title}", ""] + md_table(head, rows) if rows else []
    lines += ["## Targets", ""] + md_table(["figure", "this run", "target", ""], targets(res))
    lines += [f"{r['server']} deliveries/s per node: "
              + ", ".join(fmt(x) for x in r["per_node_deliveries_per_s"]) + "\n"
              for r in res["phases"] if "error" not in r and r["nodes"] > 1]
    n = notes(res)
    lines += ["## Notes", ""] + n + [""] if n else []
    return "\n".join(lines + [cleanup_line(res.get("cleanup", {}))])


# -- main ----------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.room_bench", __doc__, (
        ("--subscribers", int, 1000, "per node"), ("--seconds", float, 10.0, "measured, "
         "throughput"), ("--warmup", float, 2.0, "throughput"), ("--window", int, 32,
         "un-acked sends, throughput"), ("--rate", float, 20.0, "msgs/s, paced"),
        ("--paced-seconds", float, None, "default: --seconds"),
        ("--drain", float, 10.0, "max s to wait for stragglers"),
        ("--client-procs", int, 2, "subscriber processes"),
        ("--sample-every", int, 10, "1 in N subscribers gives latency"),
        ("--scale-rate", float, 200.0, "msgs/s offered to 1 node and to 3 nodes; 0: skip")))
    p.add_argument("--servers", default="ours,ws,sio", help="a subset of ours,ws,sio")
    p.add_argument("--skip-three", action="store_true", help="leave out the 3-node phase")
    p.add_argument("--modes", default="throughput,paced",
                   help="the one-node phases to run: a subset of throughput,paced")
    p.add_argument("--sio-mode", choices=("aiohttp", "asgi"), default="aiohttp",
                   help="python-socketio on aiohttp (default), or its ASGI app on uvicorn")
    p.add_argument("--client-impl", choices=("py", "c"), default="py",
                   help="subscriber processes: bench.room_client (Python) or bench.room_client_c "
                   "(C, epoll; ours and ws only)")
    p.add_argument("--client-poll-us", type=int, default=0,
                   help="C subscribers: poll epoll every N us instead of sleeping in it (no "
                   "wake-up for the server's writes to pay; up to N us more latency); 0: sleep")
    p.add_argument("--quick", action="store_true",
                   help="100 subscribers, 3 s phases, 1 s warm-up, 5 s drain")
    args = cli.parse(p, argv)
    if args.quick:
        args.subscribers, args.seconds, args.warmup, args.drain = 100, 3.0, 1.0, 5.0
    args.paced_seconds = args.paced_seconds or args.seconds
    args.servers = [x for x in args.servers.split(",") if x]
    args.modes = [x for x in args.modes.split(",") if x]
    if set(args.modes) - {"throughput", "paced"} or not args.modes:
        p.error("--modes is a non-empty subset of throughput,paced")
    if set(args.servers) - {"ours", "ws", "sio"} or min(
            args.subscribers, args.window, args.client_procs, args.sample_every) < 1:
        p.error("--servers is a subset of ours,ws,sio; counts must be >= 1")
    if args.client_impl == "c" and "sio" in args.servers:
        p.error("--client-impl c speaks ours and ws only: leave sio out of --servers "
                "(e.g. --servers ours,ws), or use --client-impl py")
    args.max_child_s = 900 + 3 * (args.seconds + args.paced_seconds + args.drain)
    common.raise_fd_limit()
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from importlib.metadata import version
    b = Bench(args)
    res: dict[str, Any] = {
        "phases": [], "client_impl": args.client_impl, "nodes": b.run.nodes, "logs": b.logs,
        "namespaces": b.run.namespaces,
        "versions": {"websockets": version("websockets"), "socketio": version("python-socketio")}}
    plan: list[tuple[str, str, Any]] = []
    for name in args.servers:
        for mode in args.modes:
            plan.append((name, mode, (lambda m=mode: b.start_ours(
                f"ours-{m}", 1, "0" if m == "throughput" else None)) if name == "ours" else
                (lambda m=mode, x=name: b.start_baseline(
                    f"{x}-{m}", "ws" if x == "ws" else f"sio-{args.sio_mode}"))))
    if "ours" in args.servers and not args.skip_three:
        plan.append(("ours-3", "throughput", lambda: b.start_ours("ours3-throughput", 3, "0")))
        if args.scale_rate > 0:
            plan.append(("ours", "scale", lambda: b.start_ours("ours-scale", 1, "0")))
            plan.append(("ours-3", "scale", lambda: b.start_ours("ours3-scale", 3, "0")))
    budget = 240 + args.subscribers + args.warmup + args.seconds + args.paced_seconds + args.drain
    try:
        for name, mode, start in plan:
            r = {"server": name, "mode": mode, **await common.reported(b.phase(name, mode, start),
                                                                       budget)}
            res["phases"].append(r)
            common.say("room_bench", f"{name} {mode}: "
                       f"{r.get('deliveries_per_s', r.get('error'))} deliveries/s")
    finally:
        if b.run.namespaces:
            res["cleanup"] = await b.run.cleanup()
    return res


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.room_bench", argv, parse_args, run, render,
                    lambda res: any("error" in r for r in res["phases"]))


if __name__ == "__main__":
    raise SystemExit(main())
