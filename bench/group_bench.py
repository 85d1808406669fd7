"""Group benchmark: the cost of one group message for 10, 1,000 and 10,000 members
(flat above the write-diffusion threshold?) next to the naive per-member
``HINCRBY`` design, and ``GET /v1/conversations`` for a user in 500 groups.

Run from the repository root (it starts its own node in a fresh namespace, uses
the local Redis / RabbitMQ / MongoDB-compatible server, and cleans up)::

    .venv/bin/python -m bench.group_bench                 # sizes 10 1000 10000, 200 msgs
    .venv/bin/python -m bench.group_bench --quick         # sizes 10 200 1000, 30 msgs

1. **Cost per message**, per ``--sizes`` N: a group of N members (owner
   included; one create + adds of <= 1,000 over HTTP); the owner sends over
   WebSocket, ``--listeners`` members are connected and count their pushes.
   ``--warmup-msgs`` sends (the first reported as *first send*), then
   ``--messages`` sends one at a time, each waiting for its ack. Over those:
   ack latency; Redis commands = delta of ``INFO commandstats`` calls summed
   over all commands (commands run inside Lua count as well as the EVALSHA;
   our own INFO left out), server-wide, so an idle window of the same length
   right after (at most ``--idle-max`` s, scaled) gives the background (the
   node's heartbeat), which is subtracted; Redis clients of other processes
   active in either window (CLIENT LIST, matched to our processes' sockets in
   /proc) make the attempt *noisy*, and it is repeated (``--attempts``), the
   quietest kept. Mongo writes = write commands on the node's database (the
   ``writeLock`` counts of SecantusDB's ``top``: insert, update,
   findAndModify, delete; an ``insert_many`` of 10 documents is 1); Mongo
   docs = growth of ``group_msgs`` + ``boxes``. CPU per message from /proc.
   **Naive baseline**, same run, same Redis: per message one pipeline of
   ``HINCRBY <prefix>:unread:{member} g:G 1`` per member in a throwaway key
   prefix (deleted after each size): HINCRBY calls and time per message.
   **Cost per reaction** (``--reactions``, 0: none), per size, the same way:
   the connected members react to one message in turn, one call at a time,
   each adding then removing its emoji (every call changes the state).
2. **Conversations**: a user in ``--groups`` groups of 3, each with 2 messages
   from another member (unread 2 and a last message each); a baseline user
   with no group and ``--peers`` 1:1 conversations (2 messages each).
   ``GET /v1/conversations`` (node default limit: 100 rows) ``--repeat``
   times per user, sequentially, after 5 warm-up calls (the first is *cold*);
   ``total_unread`` is checked on every answer.

Output: markdown on stdout, JSON in ``bench/out/group-<UTC stamp>.json``, the
node's log beside it. Only 127.0.0.1; every phase is bounded in time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
from collections import Counter
from typing import Any

import orjson

from bench import cli, common
from bench import group_support as gs
from bench.cluster import Run
from bench.report import cleanup_line, fmt, header_lines, md_table, node_lines
from bench.stats import latency_summary
from gateway.config import Settings
from testkit.device import Device
from testkit.http import HttpUsers
from testkit.namespace import drop_namespace
from testkit.nodes import NodeProcess
from testkit.poll import bounded

TEXT = "hello from the group benchmark, a short line of text"
CONV_WARMUP = 5
log = functools.partial(common.say, "group_bench")


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Run(args, "group")
        self.ns = self.run.namespace("")
        self.naive_prefix = self.run.base + "nv"
        self.node: NodeProcess | None = None
        self.http: HttpUsers | None = None
        self.probe = gs.Probe(args.redis_url, args.mongo_url, self.ns)
        self.names = {os.getpid(): "load generator (this process)"}

    async def start(self) -> None:
        self.node = (await self.run.start_nodes(self.ns, 1, "node",
                                                group_write_diffusion_max=self.args.wd_max))[0]
        self.names[self.node.pid] = "gateway node"
        self.http = HttpUsers(self.node.http_url, self.run.secret)

    async def devices(self, users: list[str]) -> list[Device]:
        assert self.node is not None
        return list(await asyncio.gather(*(gs.open_device(self.node.ws_url, self.run.secret, u)
                                           for u in users)))

    async def drop_naive(self) -> Any:
        a = self.args
        return (await drop_namespace(self.naive_prefix, redis_url=a.redis_url,
                                     mongo_url=a.mongo_url))["redis_keys"]

    # -- 1. cost per message -------------------------------------------------------
    async def size_phase(self, size: int) -> dict[str, Any]:
        a, http = self.args, self.http
        assert http is not None and self.node is not None
        owner, members = f"o{size}", [f"m{size}-{i}" for i in range(size - 1)]
        mode = "write" if size <= a.wd_max else "read"
        t = time.perf_counter()
        group = await gs.create_group(http, owner, f"bench {size}", members)
        setup_s = time.perf_counter() - t
        sender, *listeners = await self.devices([owner, *members[:a.listeners]])
        try:
            return await self._measure(size, mode, group, setup_s, sender, listeners, members)
        finally:
            await asyncio.gather(*(d.close() for d in (sender, *listeners)))
            await self.drop_naive()

    async def _measure(self, size: int, mode: str, group: str, setup_s: float, sender: Device,
                       listeners: list[Device], members: list[str]) -> dict[str, Any]:
        first: float | None = None
        mid = 0
        for i in range(max(1, self.args.warmup_msgs)):
            t = time.perf_counter()
            mid = int(gs.check_ack(await gs.group_send(sender, group, f"w{i}", TEXT),
                                   "warm-up send")["mid"])
            first = first or time.perf_counter() - t
        await asyncio.sleep(0.3)  # the warm-up's pushes
        tries = await self.quietest(lambda k: self._attempt(k, group, sender, listeners))
        res = {"size": size, "mode": mode, "group": group, "setup_s": round(setup_s, 2),
               "first_send_ms": first and round(first * 1000, 2), **tries}
        res["naive"] = await self._naive(group, [f"o{size}", *members], res["idle"])
        if self.args.reactions:
            res["reactions"] = await self.quietest(
                lambda k: self._react_attempt(k, mid, [sender, *listeners]))
        return res

    async def _react_attempt(self, k: int, mid: int, devs: list[Device]) -> dict[str, Any]:
        """``--reactions`` reactions on one message (the last warm-up send: a
        popular message), one at a time, each waiting for its answer: the
        connected members in turn, each adding then removing its emoji, so every
        call changes the state (a repeat would cost less)."""
        n = self.args.reactions
        meter, c0 = common.Meter(self.names, top=5), await self.probe.counters()
        lat: list[float] = []
        errors: Counter[str] = Counter()
        for i in range(n):
            dev, turn = devs[i % len(devs)], i // len(devs)
            took, reply = await common.timed(dev.request(
                "react", mid=mid, emoji=f"r{k}", on=turn % 2 == 0))
            if reply.get("op") == "ok":
                lat.append(took)
            else:
                errors[str(reply.get("code"))] += 1
        c1, (cpu_s, cpu) = await self.probe.counters(), meter.stop()
        window = gs.delta(c0, c1)
        idle = await gs.idle_rates(self.probe, min(window["seconds"], self.args.idle_max))
        return {"reactions": n, "ok": len(lat), "errors": dict(errors),
                "latency": latency_summary(lat, mean=True), "idle": idle,
                **gs.per_msg_costs(window, idle, n),
                "cpu_ms_per_reaction": common.ms_per_op(cpu_s, cpu, n),
                "foreign_clients": await self.foreign(time.perf_counter() - c0.wall)}

    async def quietest(self, attempt: Any) -> dict[str, Any]:
        """Up to ``--attempts`` runs of ``attempt(k)`` until one saw no foreign Redis
        client; the one with the fewest, and how many each attempt saw."""
        tries: list[dict[str, Any]] = []
        for k in range(self.args.attempts):
            tries.append(await attempt(k))
            if not tries[-1]["foreign_clients"]:
                break
        best = min(tries, key=lambda t: len(t["foreign_clients"]))
        return {**best, "attempts": [len(t["foreign_clients"]) for t in tries]}

    async def _attempt(self, k: int, group: str, sender: Device, listeners: list[Device]
                       ) -> dict[str, Any]:
        n = self.args.messages
        for d in listeners:
            d.on_push = gs.Pushes(counting=True)
        docs0 = await self.probe.docs()
        meter, c0 = common.Meter(self.names, top=5), await self.probe.counters()
        lat: list[float] = []
        errors: Counter[str] = Counter()
        seqs: list[int] = []
        for i in range(n):
            took, reply = await common.timed(gs.group_send(sender, group, f"a{k}m{i}", TEXT))
            if reply.get("op") == "ack":
                lat.append(took)
                seqs.append(int(reply["seq"]))
            else:
                errors[str(reply.get("code"))] += 1
        c1, (cpu_s, cpu) = await self.probe.counters(), meter.stop()
        docs1 = await self.probe.docs()
        await asyncio.sleep(0.5)  # pushes still on their way
        pushes: list[gs.Pushes] = [d.on_push for d in listeners]  # type: ignore[misc]
        for p in pushes:
            p.counting = False
        window = gs.delta(c0, c1)
        idle = await gs.idle_rates(self.probe, min(window["seconds"], self.args.idle_max))
        res = {"messages": n, "acked": len(lat), "errors": dict(errors),
               "seq_contiguous": bool(seqs) and seqs == list(range(seqs[0], seqs[0] + n)),
               "ack": latency_summary(lat, mean=True),
               "window_s": round(window["seconds"], 3), "idle": idle,
               **gs.per_msg_costs(window, idle, n),
               "docs_per_msg": {c: (docs1[c] - docs0[c]) / n for c in docs0},
               "cpu_ms_per_msg": common.ms_per_op(cpu_s, cpu, n),
               "foreign_clients": await self.foreign(time.perf_counter() - c0.wall)}
        res["mongo_docs_per_msg"] = (res["docs_per_msg"]["group_msgs"]
                                     + res["docs_per_msg"]["boxes"])
        push_lat = [x for p in pushes for x in p.latency]
        res["pushes"] = {"listeners": len(listeners), "expected": n * len(listeners),
                         "received": sum(p.count for p in pushes),
                         "latency": latency_summary(push_lat),
                         "unexpected_frames": {k: v for d in (sender, *listeners)
                                               for k, v in gs.unexpected(d).items()}}
        return res

    async def foreign(self, seconds: float) -> list[str]:
        return await self.probe.foreign_clients(seconds, list(self.names))

    async def _naive(self, group: str, members: list[str], idle: dict[str, Any]
                     ) -> dict[str, Any]:
        n = self.args.messages
        c0 = await self.probe.counters()
        took = await gs.naive_hincrby(self.probe.redis, self.naive_prefix, group, members, n)
        d = gs.delta(c0, await self.probe.counters())
        bg = sum(idle["redis"].values()) * d["seconds"]
        return {"redis_cmds_per_msg": (sum(d["redis"].values()) - bg) / n,
                "hincrby_per_msg": d["redis"].get("hincrby", 0) / n,
                "foreign_clients": await self.foreign(d["seconds"]),
                "time": latency_summary(took, mean=True)}

    # -- 2. conversations ----------------------------------------------------------
    async def conversations_phase(self) -> dict[str, Any]:
        a, http = self.args, self.http
        assert http is not None
        main, base, helpers = "cv-main", "cv-base", min(10, a.groups)
        t = time.perf_counter()
        groups = list(enumerate(await bounded((gs.create_group(
            http, f"cvh{i % helpers}", f"cv {i}", [main, f"cvx{i % helpers}"])
            for i in range(a.groups)), 8)))
        senders = await self.devices([f"cvh{j}" for j in range(helpers)])
        peers = await self.devices([f"cvp{j}" for j in range(a.peers)])
        try:
            await asyncio.gather(*(gs.send_twice(d, [g for i, g in groups if i % helpers == j],
                                                 TEXT) for j, d in enumerate(senders)))
            for k in range(2):
                for r in await asyncio.gather(*(gs.send(p, base, f"b{k}", TEXT) for p in peers)):
                    gs.check_ack(r, "1:1 send")
        finally:
            await asyncio.gather(*(d.close() for d in (*senders, *peers)))
        setup_s = time.perf_counter() - t
        await asyncio.sleep(1.0)
        idle = await gs.idle_rates(self.probe, min(5.0, a.idle_max))
        out = [await self._conv_block(main, a.groups, 0, 2 * a.groups, idle),
               await self._conv_block(base, 0, a.peers, 2 * a.peers, idle)]
        return {"setup_s": round(setup_s, 2), "idle": idle, "users": out}

    async def _conv_block(self, user: str, groups: int, convs: int, expected: int,
                          idle: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None
        c0 = await self.probe.counters()
        cold, _ = await gs.timed_get(self.http, user, "/v1/conversations")
        first = gs.delta(c0, await self.probe.counters())
        for _ in range(CONV_WARMUP - 1):
            await gs.timed_get(self.http, user, "/v1/conversations")
        best = await self.quietest(lambda _k: self._conv_attempt(user, expected, idle))
        return {"user": user, "groups": groups, "one_to_one": convs,
                "cold_ms": round(cold * 1000, 2), "cold_mongo": first["mongo"],
                "cold_redis_cmds": sum(first["redis"].values()), **best}

    async def _conv_attempt(self, user: str, expected: int, idle: dict[str, Any]
                            ) -> dict[str, Any]:
        assert self.http is not None
        n = self.args.repeat
        meter, c0 = common.Meter(self.names, top=5), await self.probe.counters()
        lat: list[float] = []
        sizes: list[int] = []
        wrong: list[int] = []
        rows = 0
        for _ in range(n):
            took, body = await gs.timed_get(self.http, user, "/v1/conversations")
            lat.append(took)
            sizes.append(len(body))
            doc = orjson.loads(body)
            rows = len(doc["conversations"])
            if doc["total_unread"] != expected:
                wrong.append(doc["total_unread"])
        d, (cpu_s, cpu) = gs.delta(c0, await self.probe.counters()), meter.stop()
        bg = sum(idle["redis"].values()) * d["seconds"]
        return {"calls": n, "rows": rows, "bytes": max(sizes),
                "latency": latency_summary(lat, mean=True),
                "expected_total_unread": expected,
                "total_unread_ok": not wrong, "wrong_totals": sorted(set(wrong))[:5],
                "redis_cmds_per_call": (sum(d["redis"].values()) - bg) / n,
                "redis_top_per_call": sorted(((c, round(v / n, 2)) for c, v in
                                              d["redis"].items()), key=lambda kv: -kv[1])[:4],
                "mongo_ops_per_call": {c: round(v / n, 3) for c, v in d["mongo"].items()},
                "cpu_ms_per_call": common.ms_per_op(cpu_s, cpu, n),
                "foreign_clients": await self.foreign(time.perf_counter() - c0.wall)}

    async def close(self) -> dict[str, Any]:
        if self.http is not None:
            await self.http.aclose()
        if self.node is not None:
            await self.run.stop_nodes([self.node])
        naive = await self.drop_naive()
        await self.probe.close()
        return {**await self.run.cleanup(), "naive_prefix_keys": naive}


# -- report ------------------------------------------------------------------------
def render(res: dict[str, Any]) -> str:
    s, f, conv = res["settings"], res["flat"], res.get("conversations", {})
    lines = header_lines("Group benchmark", res)
    lines += [f"- node: {res.get('node_name', '-')}, namespace {res['namespace']}, "
              f"IM_GROUP_WRITE_DIFFUSION_MAX={s['wd_max']}; Redis "
              f"{res.get('servers', {}).get('redis_version')}, Mongo server "
              f"{res.get('servers', {}).get('mongo_server')}",
              f"- {s['messages']} messages per size, one at a time (each waits for its ack), "
              f"after {s['warmup_msgs']} warm-up sends; {s['listeners']} members connected "
              "per group", "- Redis cmds = `INFO commandstats` calls, Lua-internal calls included, "
              "server-wide minus an idle window's background; *Redis quiet* = no other "
              "process's Redis client was active (else the counts include theirs). Mongo "
              "writes = write commands on the node's database (SecantusDB `top`), Mongo docs = "
              "new `group_msgs` + `boxes` documents", "", "## 1. Cost of one group message", ""]
    lines += md_table(["size", "mode", "ack p50/p99 ms", "Redis cmds/msg", "Mongo writes/msg",
                       "Mongo docs/msg", "naive HINCRBY cmds/msg", "naive ms/msg",
                       "Redis quiet"],
                      gs.cost_rows(res))
    lines += [f"**Flat above the threshold: {f['verdict']}**" + (
        f" ({f['sizes'][0]:,} vs {f['sizes'][1]:,} members: Redis cmds/msg x"
        f"{fmt(f['ratios']['redis_cmds_per_msg'])}, Mongo writes/msg x"
        f"{fmt(f['ratios']['mongo_writes_per_msg'])}, Mongo docs/msg x"
        f"{fmt(f['ratios']['mongo_docs_per_msg'])}; flat = within 10%)" if "sizes" in f
        else ""), ""]
    lines += md_table(["size", "ack mean ms", "ack max ms", "first send ms", "node CPU ms/msg",
                       "store CPU ms/msg", "Redis top cmds/msg", "Mongo writes/msg by collection",
                       "pushes recv/exp", "push p50/p99 ms", "acked", "setup s"],
                      gs.detail_rows(res))
    react = [r for r in res["sizes"] if "reactions" in r]
    if react:
        lines += ["## 1b. Cost of one reaction (the same message, connected members in "
                  "turn, each adding then removing its emoji)", ""]
        lines += md_table(["size", "mode", "answer p50/p99 ms", "Redis cmds/reaction",
                           "Redis top cmds/reaction", "Mongo writes/reaction",
                           "Mongo ops/reaction", "group send: Redis cmds / Mongo writes",
                           "ok", "Redis quiet"], gs.reaction_rows(react))
    lines += ["## 2. GET /v1/conversations", ""]
    lines += [f"error: {conv['error']}", ""] if "error" in conv else []
    lines += md_table(["user", "rows", "bytes", "cold ms (1st call)", "p50 ms", "p99 ms", "max ms",
                       "mean ms", "Redis cmds/call", "node CPU ms/call", "total_unread ok",
                       "Redis quiet"],
                      gs.conv_rows(conv))
    lines += ["## Node", ""] + node_lines(res.get("nodes", []))
    return "\n".join(lines + [f"- {cleanup_line(res.get('cleanup', {}))}"])


# -- main ----------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.new_parser("bench.group_bench", __doc__, (
        ("--messages", int, 200, "measured sends per size"),
        ("--warmup-msgs", int, 5, "unmeasured sends first"),
        ("--listeners", int, 3, "members connected per group"),
        ("--idle-max", float, 15.0, "max seconds of each idle window"),
        ("--attempts", int, 3, "tries of a measurement while other Redis clients are busy"),
        ("--groups", int, 500, "groups of the conversations user"),
        ("--peers", int, 20, "1:1 conversations of the baseline user"),
        ("--repeat", int, 200, "GET /v1/conversations calls per user"),
        ("--reactions", int, 100, "measured reactions per size (0: none)")))
    p.add_argument("--sizes", type=int, nargs="+", default=[10, 1000, 10000],
                   help="group sizes, owner included (default 10 1000 10000)")
    p.add_argument("--wd-max", type=int, default=Settings.group_write_diffusion_max,
                   help="the node's IM_GROUP_WRITE_DIFFUSION_MAX (default: node default, "
                   f"{Settings.group_write_diffusion_max})")
    p.add_argument("--quick", action="store_true",
                   help="sizes 10 200 1000, 30 messages, 50 groups, 30 calls")
    args = cli.parse(p, argv)
    if args.quick:
        args.sizes, args.messages, args.groups, args.repeat = [10, 200, 1000], 30, 50, 30
    if min(args.sizes) < 2 or max(args.sizes) > Settings.group_max_members or min(
            args.messages, args.repeat, args.groups, args.peers, args.attempts) < 1 or min(
            args.listeners, args.warmup_msgs, args.wd_max, args.reactions) < 0 \
            or args.idle_max <= 0:
        p.error("sizes 2..100000; --messages/--repeat/--groups/--peers/--attempts >= 1; "
                "--listeners/--warmup-msgs/--wd-max >= 0; --idle-max > 0")
    args.listeners = min(args.listeners, min(args.sizes) - 1)
    return args


async def run(args: argparse.Namespace) -> dict[str, Any]:
    b = Bench(args)
    res: dict[str, Any] = {"namespace": b.ns, "sizes": [], "nodes": b.run.nodes}
    try:
        res["servers"] = await b.probe.info()
        await b.start()
        assert b.node is not None
        res["node_name"], res["node_log"] = b.node.name, str(b.node.log_path)
        for size in args.sizes:
            budget = 300 + size / 20 + args.messages * (1 + size / 2000) + args.idle_max
            r = {"size": size, **await common.reported(b.size_phase(size), budget)}
            res["sizes"].append(r)
            log(f"size {size}: " + (r.get("error") or f"ack p50 {r['ack']['p50_ms']} ms, "
                f"redis {r['redis_cmds_per_msg']:.1f}/msg, mongo writes "
                f"{r['mongo_writes_per_msg']:.2f}/msg"))
        res["conversations"] = await common.reported(
            b.conversations_phase(), 300 + args.groups * 0.5 + args.repeat * 2)
        log("conversations: done")
    finally:
        res["cleanup"] = await b.close()
    res["flat"] = gs.flatness(res)
    return res


def main(argv: list[str] | None = None) -> int:
    return cli.main("bench.group_bench", argv, parse_args, run, render, lambda res: any(
        "error" in r for r in res["sizes"]) or "error" in res.get("conversations", {}))


if __name__ == "__main__":
    raise SystemExit(main())
