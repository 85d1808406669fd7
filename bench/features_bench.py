"""Chat-features benchmark: what presence watchers add to a login, and what a
``typing`` costs in a big group, each next to a plain send in the same run.

Run from the repository root (it starts 3 nodes in a fresh namespace, uses the
local Redis / RabbitMQ / MongoDB-compatible server, and cleans up)::

    .venv/bin/python -m bench.features_bench     # 1,000 watchers; 10,000 members, 1,000 online
    .venv/bin/python -m bench.features_bench --watchers 90 --cycles 3 --members 300 \\
        --online 90 --typings 3                  # a smoke run

Both phases run on the same 3 node processes (``IM_PRESENCE_GRACE_S`` =
``--grace``, otherwise the node's defaults; every device of user i connects to
node i % 3):

1. **Login with presence watchers.** ``--watchers`` users, spread evenly over
   the 3 nodes, each one device that ``presence_sub``s to user U. U connects
   to node 0, pings, waits ``PAUSE_S``, and disconnects, ``--cycles`` times
   (after one unmeasured warm-up cycle); each cycle waits for the offline
   frames before the next. Per login: time from U's connect starting to the
   LAST watcher's ``presence`` online frame, and to U's ``pong``; watchers
   reached (must be all, each once). Per logout: from the start of U's close
   to the last watcher's offline frame, **minus the grace** (the node checks
   a user at its due time: what is left is the check, the broker and the
   frames). Connect -> ``pong`` with watchers includes this process reading
   the watchers' online frames, which arrive at the same moment. Next to it,
   in the same run: the same cycles by a user nobody watches (connect ->
   ``pong``; after the close it waits as long as U's median logout took), and
   ``--sends`` 1:1 sends from U (on node 0) to a user on node 1, one at a
   time, each awaiting its ack: ack latency and delivery latency (push
   received, from ``body.t``). Node CPU (from /proc) over the watched cycles,
   the unwatched cycles and the sends, per operation (a login + logout cycle,
   a send), and over an idle window as long as the watched cycles (at most
   ``--idle-max`` s; watchers still connected): the ``net`` column subtracts
   that idle background from each window.
2. **Typing in a group** of ``--members`` members (one create + adds of <=
   1,000 over HTTP); ``--online`` of them connected (the owner included),
   spread evenly over the 3 nodes. ``typing`` reaches only the members online,
   and never the typer's own device: each typing and each group message is
   expected by ``--online`` - 1 devices. ``--typers`` online members (on
   nodes 0, 1, 2, ...) take turns: ``--typings`` typings, one every
   2.0 s / typers (at least 0.25 s; the same user types again only after
   2.1 s: the node lets one through per user, conversation and node per 2 s),
   each waiting until every online member has it (or ``--round-timeout``).
   Time from the typing frame sent to the LAST online member receiving it,
   and members reached. Next to it: ``--typings`` ``group_send``s to the same
   group by the same members at the same pace: ack latency and time to the
   last online member's ``group_msg``. One unmeasured group message per typer
   first (checks every member's device is bound to the group) and one
   unmeasured typing. Node CPU per typing and per group message, and over an
   idle window as long as the typing window.

Every latency is taken when this process's handler sees the frame: with
thousands of connections on a few cores the benchmark process itself can be
the limit (its queue of frames to read is part of "the last member"); its CPU
is reported per window, and the report says so when it was near a full core.

Output: markdown on stdout, JSON in ``bench/out/features-<UTC stamp>.json``,
the node logs beside it. Only 127.0.0.1; every wait is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from imgate_client.core import encode, make

from bench import cli, common
from bench import group_support as gs
from bench.cluster import NODES, Run, process_names
from bench.features_report import PEER, UNWATCHED, WATCHED, render
from bench.stats import latency_summary
from gateway.inbox.ops import TYPING_EVERY_S
from testkit.device import Device
from testkit.http import HttpUsers
from testkit.nodes import NodeProcess
from testkit.poll import bounded, until

TEXT = "hello from the features benchmark, a short line of text"
PAUSE_S = 0.2  # online between a login's pong and its logout
TYPER_GAP_S = TYPING_EVERY_S + 0.1  # one user's typings at least this far apart
MIN_GAP_S = 0.25
CONNECT_CONCURRENCY = 50
Frame = dict[str, Any]
log = functools.partial(common.say, "features_bench")


# -- who received the current round's frame --------------------------------------------
@dataclass
class Arrivals:
    """Devices that received the frame ``match`` accepts, and when (``perf_counter``
    in their push handler): the first per device; more are ``duplicates``, frames
    ``match`` refuses are ``stray`` (by op)."""

    match: Callable[[Frame], bool] = lambda f: False
    at: dict[int, float] = field(default_factory=dict)
    duplicates: int = 0
    stray: Counter[str] = field(default_factory=Counter)

    def expect(self, match: Callable[[Frame], bool]) -> None:
        self.match, self.at = match, {}

    def handler(self, i: int) -> Callable[[Frame], None]:
        def on_push(f: Frame) -> None:
            if not self.match(f):
                self.stray[str(f.get("op"))] += 1
            elif i in self.at:
                self.duplicates += 1
            else:
                self.at[i] = time.perf_counter()
        return on_push

    async def wait(self, expected: int, timeout: float) -> int:
        """Until ``expected`` devices have it (at most ``timeout`` s); how many do."""
        await until(lambda: len(self.at) >= expected, timeout, every=0.01)
        return len(self.at)

    def last(self, t0: float, skip: int | None = None) -> float | None:
        times = [t for i, t in self.at.items() if i != skip]
        return max(times) - t0 if times else None


def presence_frame(user: str, online: bool) -> Callable[[Frame], bool]:
    def match(f: Frame) -> bool:
        state = (f.get("users") or {}).get(user) if f.get("op") == "presence" else None
        return isinstance(state, dict) and state.get("online") is online
    return match


def summary(samples: list[float | None]) -> dict[str, Any]:
    return latency_summary([s for s in samples if s is not None])


# -- the benchmark ----------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Run(args, "features")
        self.ns = self.run.namespace("")
        self.nodes: list[NodeProcess] = []
        self.names: dict[int, str] = {}
        self.http: HttpUsers | None = None
        self.devices: list[Device] = []  # every device still open

    async def start(self) -> None:
        self.nodes = await self.run.start_nodes(self.ns, NODES, "node",
                                                presence_grace_s=self.args.grace)
        self.names = process_names(self.nodes)
        self.http = HttpUsers(self.nodes[0].http_url, self.run.secret)

    async def open(self, user: str, node: int,
                   on_push: Callable[[Frame], None] | None = None) -> Device:
        dev = await gs.open_device(self.nodes[node].ws_url, self.run.secret, user)
        self.devices.append(dev)
        if on_push is not None:
            dev.on_push = on_push
        return dev

    async def open_many(self, users: list[str], arr: Arrivals) -> list[Device]:
        """A device per user, user i on node i % 3, its pushes into ``arr`` as device i."""
        return await bounded((self.open(u, i % NODES, arr.handler(i))
                              for i, u in enumerate(users)), CONNECT_CONCURRENCY)

    async def close_devices(self, devs: list[Device]) -> None:
        await asyncio.gather(*(d.close() for d in devs))
        gone = {id(d) for d in devs}
        self.devices = [d for d in self.devices if id(d) not in gone]

    async def window(self, job: Awaitable[Any]) -> tuple[Any, float, dict[str, Any]]:
        """(``job``'s result, seconds, CPU of every process) over ``job``."""
        meter = common.Meter(self.names, top=6)
        out = await job
        seconds, cpu = meter.stop()
        return out, seconds, cpu

    async def idle(self, seconds: float) -> tuple[float, dict[str, Any]]:
        _, s, cpu = await self.window(asyncio.sleep(min(seconds, self.args.idle_max)))
        return s, cpu

    def cpu_per_op(self, seconds: float, cpu: dict[str, Any], n: int,
                   idle: dict[str, Any] | None) -> dict[str, Any]:
        """The nodes' CPU over a window of ``n`` operations: cores, ms per operation,
        and ms per operation net of ``idle``'s background (an idle window's CPU)."""
        pids = [str(node.pid) for node in self.nodes]
        cores = [cpu["by_pid"].get(p, 0.0) for p in pids]
        res: dict[str, Any] = {
            "seconds": round(seconds, 2), "ops": n, "node_cores": cores,
            "node_ms_per_op": [round(c * seconds * 1000 / n, 3) for c in cores] if n else None,
            "nodes_ms_per_op": round(sum(cores) * seconds * 1000 / n, 3) if n else None,
            "bench_cores": cpu["load_generator_cores"],
            "machine_busy_pct": cpu["machine_busy_pct"], "top": cpu["top"]}
        if idle is not None and n:
            idle_cores = sum(idle["by_pid"].get(p, 0.0) for p in pids)
            res["idle_nodes_cores"] = round(idle_cores, 3)
            res["nodes_net_ms_per_op"] = round((sum(cores) - idle_cores) * seconds * 1000 / n, 3)
        return res

    # -- 1. login with presence watchers ------------------------------------------------
    async def presence_phase(self) -> dict[str, Any]:
        a = self.args
        arr = Arrivals()
        t = time.perf_counter()
        watchers = await self.open_many([f"fb-w{i}" for i in range(a.watchers)], arr)
        subs = await bounded((d.request("presence_sub", 30, users=[WATCHED]) for d in watchers),
                             CONNECT_CONCURRENCY)
        bad = [r for r in subs if not presence_frame(WATCHED, False)(r)]
        if bad:
            raise RuntimeError(f"{len(bad)} presence_sub replies not 'offline': {bad[0]}")
        peer_got: list[float] = []
        peer = await self.open(PEER, 1 % NODES, functools.partial(delivered, peer_got))
        setup_s = time.perf_counter() - t
        log(f"presence: {a.watchers} watchers subscribed in {setup_s:.1f} s")
        try:
            first = await self.login(WATCHED, arr, a.watchers)
            cycles, w_s, w_cpu = await self.window(self.cycles(WATCHED, arr, a.watchers))
            log("presence: watched cycles done")
            settle = statistics.median(c["offline_close_s"] for c in cycles)
            await self.login(UNWATCHED, None, 0, settle)  # warm-up
            solo, s_s, s_cpu = await self.window(self.cycles(UNWATCHED, None, 0, settle))
            i_s, i_cpu = await self.idle(w_s)
            sends = await self.plain_sends(arr, peer, peer_got)
            log("presence: unwatched cycles, idle window and sends done")
        finally:
            await self.close_devices([*watchers, peer])
        n, send_s, send_cpu = a.cycles, sends.pop("seconds"), sends.pop("cpu")
        return {
            "watchers": a.watchers, "watchers_per_node": per_node(a.watchers),
            "setup_s": round(setup_s, 2), "first_cycle": first, "cycles": cycles,
            "unwatched_cycles": solo, "sends": sends,
            "online_last": summary([c["online_last_s"] for c in cycles]),
            "offline_last_minus_grace": summary(
                [c["offline_last_s"] - a.grace for c in cycles
                 if c["offline_last_s"] is not None]),
            "pong_watched": summary([c["pong_s"] for c in cycles]),
            "pong_unwatched": summary([c["pong_s"] for c in solo]),
            "online_reached_min": min(c["online_reached"] for c in cycles),
            "offline_reached_min": min(c["offline_reached"] for c in cycles),
            "duplicates": arr.duplicates, "stray": dict(arr.stray),
            "cpu": {"watched_cycle": self.cpu_per_op(w_s, w_cpu, n, i_cpu),
                    "unwatched_cycle": self.cpu_per_op(s_s, s_cpu, n, i_cpu),
                    "send": self.cpu_per_op(send_s, send_cpu, a.sends, i_cpu),
                    "idle": self.cpu_per_op(i_s, i_cpu, 0, None)}}

    async def cycles(self, user: str, arr: Arrivals | None, expected: int,
                     settle: float = 0.0) -> list[dict[str, Any]]:
        return [await self.login(user, arr, expected, settle) for _ in range(self.args.cycles)]

    async def login(self, user: str, arr: Arrivals | None, expected: int,
                    settle: float = 0.0) -> dict[str, Any]:
        """``user`` connects to node 0, pings, stays ``PAUSE_S``, disconnects; with
        watchers (``arr``) each waits for their frames, without for ``settle`` s."""
        a = self.args
        if arr is not None:
            arr.expect(presence_frame(user, True))
        t0 = time.perf_counter()
        dev = await self.open(user, 0)
        opened = time.perf_counter() - t0
        pong = await dev.request("ping", 10)
        pong_s = time.perf_counter() - t0
        if pong.get("op") != "pong":
            raise RuntimeError(f"ping: expected a pong, got {pong}")
        res: dict[str, Any] = {"open_s": opened, "pong_s": pong_s}
        if arr is not None:
            res["online_reached"] = await arr.wait(expected, a.round_timeout)
            res["online_last_s"] = arr.last(t0)
        await asyncio.sleep(PAUSE_S)
        if arr is not None:
            arr.expect(presence_frame(user, False))
        t1 = time.perf_counter()
        await self.close_devices([dev])
        res["close_s"] = time.perf_counter() - t1
        if arr is None:
            await asyncio.sleep(settle)
            return res
        res["offline_reached"] = await arr.wait(expected, a.grace + a.round_timeout)
        res["offline_last_s"] = arr.last(t1)
        res["offline_close_s"] = time.perf_counter() - t1
        return res

    async def plain_sends(self, arr: Arrivals, peer: Device, got: list[float]
                          ) -> dict[str, Any]:
        """U (node 0, watched: its login is awaited first) sends ``--sends`` 1:1
        messages to the peer (node 1), one at a time; then U leaves again."""
        a = self.args
        arr.expect(presence_frame(WATCHED, True))
        dev = await self.open(WATCHED, 0)
        await arr.wait(a.watchers, a.round_timeout)
        acks: list[float] = []
        errors: Counter[str] = Counter()

        async def sends() -> None:
            for i in range(a.sends):
                took, reply = await common.timed(gs.send(dev, PEER, f"s{i}", TEXT))
                if reply.get("op") == "ack":
                    acks.append(took)
                else:
                    errors[str(reply.get("code"))] += 1
            await until(lambda: len(got) >= len(acks), 10)

        _, seconds, cpu = await self.window(sends())
        arr.expect(presence_frame(WATCHED, False))
        await self.close_devices([dev])
        await arr.wait(a.watchers, a.grace + a.round_timeout)
        return {"to_node": 1 % NODES, "sent": a.sends, "acked": len(acks),
                "delivered": len(got), "errors": dict(errors),
                "ack": latency_summary(acks), "delivery": latency_summary(got),
                "seconds": seconds, "cpu": cpu}

    # -- 2. typing in a group --------------------------------------------------------------
    async def typing_phase(self) -> dict[str, Any]:
        a, http = self.args, self.http
        assert http is not None
        owner, members = "fb-go", [f"fb-g{i}" for i in range(a.members - 1)]
        t = time.perf_counter()
        group = await gs.create_group(http, owner, "features bench", members)
        create_s = time.perf_counter() - t
        log(f"typing: group of {a.members} created in {create_s:.1f} s")
        online = [owner, *members[:a.online - 1]]
        arr = Arrivals()
        t = time.perf_counter()
        devs = await self.open_many(online, arr)
        connect_s = time.perf_counter() - t
        log(f"typing: {a.online} members connected in {connect_s:.1f} s")
        try:
            return {"group": group, "members": a.members, "online": a.online,
                    "online_per_node": per_node(a.online), "expected_per_op": a.online - 1,
                    "create_s": round(create_s, 2), "connect_s": round(connect_s, 2),
                    **await self._typing_measure(group, online, devs, arr)}
        finally:
            await self.close_devices(devs)

    async def _typing_measure(self, group: str, online: list[str], devs: list[Device],
                              arr: Arrivals) -> dict[str, Any]:
        a, conv = self.args, f"g:{group}"
        expected, typers = a.online - 1, list(range(a.typers))
        gap = max(TYPING_EVERY_S / a.typers, MIN_GAP_S)
        last_typed: dict[int, float] = {}

        async def typing(k: int, j: int) -> dict[str, Any]:
            frame = encode(make("typing", conv=conv)).decode()
            await asyncio.sleep(max(0.0, last_typed.get(j, -math.inf) + TYPER_GAP_S
                                    - time.perf_counter()))
            arr.expect(lambda f: f.get("op") == "typing" and f.get("conv") == conv
                       and f.get("from") == online[j])
            t0 = last_typed[j] = time.perf_counter()
            await devs[j].send_raw(frame)
            reached = await arr.wait(expected, a.round_timeout)
            return {"typer": j, "reached": reached - (j in arr.at), "self_echo": j in arr.at,
                    "last_s": arr.last(t0, skip=j)}

        async def group_msg(k: int, j: int) -> dict[str, Any]:
            text = f"{TEXT} #{k}"
            arr.expect(lambda f: f.get("op") == "group_msg" and f.get("group") == group
                       and (f.get("body") or {}).get("text") == text)
            t0 = time.perf_counter()
            reply = await gs.group_send(devs[j], group, f"fb-{j}-{k}", text)
            ack_s = time.perf_counter() - t0
            reached = await arr.wait(expected, a.round_timeout)
            return {"sender": j, "acked": reply.get("op") == "ack",
                    "error": None if reply.get("op") == "ack" else reply.get("code"),
                    "ack_s": ack_s, "reached": reached - (j in arr.at),
                    "self_echo": j in arr.at, "last_s": arr.last(t0, skip=j)}

        async def paced(fire: Callable[[int, int], Awaitable[dict[str, Any]]],
                        n: int, start: int = 0) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            for k in range(start, start + n):
                began = time.perf_counter()
                out.append(await fire(k, typers[k % len(typers)]))
                await asyncio.sleep(max(0.0, began + gap - time.perf_counter()))
            return out

        warm = await paced(group_msg, len(typers), start=-len(typers))
        bad = [w for w in warm if w["reached"] < expected or not w["acked"]]
        if bad:
            raise RuntimeError(f"warm-up group messages not delivered to every online "
                               f"member: {bad[:3]}")
        warm_typing = await typing(-1, typers[0])
        log("typing: warm-up done (every online member has the group bound)")
        typings, t_s, t_cpu = await self.window(paced(typing, a.typings))
        sends, g_s, g_cpu = await self.window(paced(group_msg, a.typings))
        i_s, i_cpu = await self.idle(t_s)
        log("typing: typings, group messages and idle window done")
        return {
            "typers": len(typers), "gap_s": round(gap, 3), "warmup_group_msgs": warm,
            "warmup_typing": warm_typing, "typings": typings, "group_sends": sends,
            "typing_last": summary([r["last_s"] for r in typings]),
            "typing_reached_min": min(r["reached"] for r in typings),
            "group_ack": summary([r["ack_s"] for r in sends if r["acked"]]),
            "group_last": summary([r["last_s"] for r in sends]),
            "group_reached_min": min(r["reached"] for r in sends),
            "group_acked": sum(r["acked"] for r in sends),
            "self_echoes": sum(r["self_echo"] for r in (*typings, *sends)),
            "duplicates": arr.duplicates, "stray": dict(arr.stray),
            "cpu": {"typing": self.cpu_per_op(t_s, t_cpu, len(typings), i_cpu),
                    "group_send": self.cpu_per_op(g_s, g_cpu, len(sends), i_cpu),
                    "idle": self.cpu_per_op(i_s, i_cpu, 0, None)}}

    async def close(self) -> dict[str, Any]:
        await self.close_devices(list(self.devices))
        if self.http is not None:
            await self.http.aclose()
        if self.nodes:
            await self.run.stop_nodes(self.nodes)
        return await self.run.cleanup()


def delivered(got: list[float], f: Frame) -> None:
    """The peer's push handler: delivery latency of each ``msg`` (from ``body.t``)."""
    t = (f.get("body") or {}).get("t") if f.get("op") == "msg" else None
    if isinstance(t, float):
        got.append(time.perf_counter() - t)


def per_node(n: int) -> list[int]:
    return [len(range(i, n, NODES)) for i in range(NODES)]


# -- main ------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.features_bench", __doc__, (
        ("--watchers", int, 1000, "users watching U's presence, spread over the 3 nodes"),
        ("--cycles", int, 20, "measured logins + logouts of U (and of the unwatched user)"),
        ("--grace", float, 0.5, "the nodes' IM_PRESENCE_GRACE_S"),
        ("--sends", int, 50, "1:1 sends from U to a user on another node"),
        ("--members", int, 10000, "members of the typing group, owner included"),
        ("--online", int, 1000, "of them connected, spread over the 3 nodes"),
        ("--typings", int, 20, "measured typings (and as many group messages)"),
        ("--typers", int, 3, "online members taking turns to type and send"),
        ("--round-timeout", float, 15.0, "max seconds to wait for one operation's frames"),
        ("--idle-max", float, 60.0, "max seconds of each idle window")))
    args = cli.parse(p, argv)
    if min(args.watchers, args.cycles, args.sends, args.typings, args.typers) < 1 or \
            args.grace <= 0 or args.round_timeout <= 0 or args.idle_max <= 0:
        p.error("--watchers/--cycles/--sends/--typings/--typers >= 1; --grace, "
                "--round-timeout, --idle-max > 0")
    if not 2 <= args.online <= args.members or args.typers > args.online:
        p.error("2 <= --online <= --members, --typers <= --online")
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(args)
    res: dict[str, Any] = {"namespace": b.ns, "nodes": b.run.nodes}
    try:
        await b.start()
        res["node_names"] = [n.name for n in b.nodes]
        cycle_s = 3 + args.grace * 2 + args.watchers / 500
        res["presence"] = await common.reported(
            b.presence_phase(),
            120 + args.watchers / 10 + 2 * args.cycles * cycle_s + args.idle_max + args.sends)
        log("presence: " + (res["presence"].get("error") or "done"))
        res["typing"] = await common.reported(
            b.typing_phase(),
            120 + args.members / 200 + args.online / 10 + args.idle_max
            + (2 * args.typings + args.typers + 1) * (args.round_timeout / 5 + 3))
        log("typing: " + (res["typing"].get("error") or "done"))
    finally:
        res["cleanup"] = await b.close()
    return res


def failed(res: dict[str, Any]) -> bool:
    p, t = res.get("presence", {}), res.get("typing", {})
    if "error" in p or "error" in t or not p or not t:
        return True
    w, exp = int(p["watchers"]), int(t["expected_per_op"])
    worst: tuple[int, int] = (min(p["online_reached_min"], p["offline_reached_min"]),
                              min(t["typing_reached_min"], t["group_reached_min"]))
    return worst[0] < w or worst[1] < exp


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.features_bench", argv, parse_args, run, render, failed)


if __name__ == "__main__":
    raise SystemExit(main())
