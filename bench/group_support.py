"""Parts of ``bench.group_bench``: devices (``testkit.device``) that count
``group_msg`` pushes; the HTTP calls (``testkit.http``: one bearer token per
user); the store counters read around a measured window (Redis ``INFO
commandstats``, SecantusDB ``top`` of the namespace's database, document counts
of its collections, Redis clients of other processes), idle background
subtracted; CPU per operation; the naive per-member ``HINCRBY`` baseline; and
the report's table rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from pymongo import AsyncMongoClient

from bench import common
from bench.report import fmt, lat
from testkit.device import Device
from testkit.http import HttpError, HttpUsers
from testkit.poll import bounded
from testkit.tokens import issue_token

CHUNK = 1000  # members per create / add call (the API's limit)
COLLECTIONS = ("group_msgs", "boxes", "groups", "group_members")
REPLY_TIMEOUT_S = 30.0


# -- WebSocket ---------------------------------------------------------------------
@dataclass
class Pushes:
    """A device's push handler: ``group_msg`` pushes received while ``counting``
    (latency from body.t)."""

    counting: bool = False
    count: int = 0
    latency: list[float] = field(default_factory=list)

    def __call__(self, f: dict[str, Any]) -> None:
        if f.get("op") == "group_msg" and self.counting:
            self.count += 1
            t = (f.get("body") or {}).get("t")
            if isinstance(t, float):
                self.latency.append(time.perf_counter() - t)


async def open_device(ws_url: str, secret: str, user: str) -> Device:
    """A device of ``user`` counting its pushes into ``device.on_push`` (a ``Pushes``)."""
    return await Device.open(ws_url, issue_token(secret, user), on_push=Pushes(),
                             open_timeout=15, max_size=1 << 22)


def unexpected(dev: Device) -> dict[str, int]:
    """Pushes other than ``group_msg`` (op -> count)."""
    return {op: n for op, n in dev.counts.items() if op != "group_msg"}


async def group_send(dev: Device, group: str, cmid: str, text: str) -> dict[str, Any]:
    return await send(dev, "", cmid, text, group=group)


async def send(dev: Device, to: str, cmid: str, text: str, group: str = "") -> dict[str, Any]:
    """A 1:1 send to ``to``, or a ``group_send`` to ``group``; the reply."""
    where = {"group": group} if group else {"to": to}
    return await dev.request("group_send" if group else "send", REPLY_TIMEOUT_S, cmid=cmid,
                             body={"t": time.perf_counter(), "text": text}, **where)


async def send_twice(dev: Device, groups: list[str], text: str) -> None:
    """Two messages to each of ``groups``, up to 32 sends in flight."""
    for r in await bounded((group_send(dev, g, f"{g}-{k}", text) for g in groups
                            for k in range(2)), 32):
        check_ack(r, "group send")


def check_ack(reply: dict[str, Any], what: str) -> dict[str, Any]:
    if reply.get("op") != "ack":
        raise RuntimeError(f"{what}: expected an ack, got {reply}")
    return reply


# -- HTTP --------------------------------------------------------------------------------
async def timed_get(http: HttpUsers, user: str, path: str) -> tuple[float, bytes]:
    """(seconds, body) of one GET; raises unless 200."""
    took, r = await common.timed(http[user].get(path))
    if r.status_code != 200:
        raise HttpError(r)
    return took, r.content


async def create_group(http: HttpUsers, owner: str, name: str, members: list[str]) -> str:
    """A group of ``owner`` + ``members``: one create, then adds of <= CHUNK."""
    first, rest = members[:CHUNK - 1], members[CHUNK - 1:]
    group = (await http[owner].ok("POST", "/v1/groups",
                                  json={"name": name, "members": first}))["group"]
    for i in range(0, len(rest), CHUNK):
        await http[owner].ok("POST", f"/v1/groups/{group}/members",
                             json={"members": rest[i:i + CHUNK]})
    return str(group)


# -- store counters ----------------------------------------------------------------------
@dataclass
class Counters:
    """Counters at one moment."""

    wall: float
    redis: dict[str, int]  # command -> calls, server-wide (our own INFO left out)
    mongo: dict[str, int]  # "collection.kind" -> count, our database only (``top``)


def socket_ports(pids: list[int]) -> set[int]:
    """Local TCP ports of the sockets these processes hold (from /proc)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    return {port for port, _, ino in common.tcp_sockets() if ino in inodes}


class Probe:
    """Redis commandstats, SecantusDB ``top`` of our database, our documents, and
    Redis clients of other processes."""

    def __init__(self, redis_url: str, mongo_url: str, db_name: str) -> None:
        self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=30)
        self.mongo: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
            mongo_url, serverSelectionTimeoutMS=5000)
        self.db = self.mongo[db_name]

    async def counters(self) -> Counters:
        stats = await self.redis.info("commandstats")
        calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
        calls.pop("info", None)  # this probe's own INFO
        top = (await self.mongo.admin.command("top"))["totals"]
        prefix = self.db.name + "."
        ops = {f"{ns.removeprefix(prefix)}.{kind}": int(v["count"])
               for ns, d in top.items() if ns.startswith(prefix)
               for kind, v in d.items() if isinstance(v, dict) and kind != "total"}
        return Counters(time.perf_counter(), calls, ops)

    async def foreign_clients(self, seconds: float, pids: list[int]) -> list[str]:
        """Redis clients not of ``pids`` that ran a command or connected in the
        last ``seconds`` (CLIENT LIST ``idle`` / ``age``, whole seconds)."""
        ours, out = socket_ports(pids), []
        for c in await self.redis.client_list():
            with contextlib.suppress(KeyError, ValueError):
                port = int(c["addr"].rsplit(":", 1)[1])
                if port not in ours and min(int(c["idle"]), int(c["age"])) <= seconds:
                    out.append(f"{c['addr']} {c.get('cmd')}")
        return out

    async def docs(self) -> dict[str, int]:
        return {c: await self.db[c].count_documents({}) for c in COLLECTIONS}

    async def info(self) -> dict[str, Any]:
        server = await self.redis.info("server")
        status = await self.mongo.admin.command("serverStatus")
        return {"redis_version": server.get("redis_version"),
                "mongo_server": status.get("secantus") or {"version": status.get("version")}}

    async def close(self) -> None:
        await self.redis.aclose()
        await self.mongo.close()


def delta(before: Counters, after: Counters) -> dict[str, Any]:
    """Redis calls per command and our Mongo collections' counts between two readings."""
    redis = {k: v - before.redis.get(k, 0) for k, v in after.redis.items()}
    mongo = {k: v - before.mongo.get(k, 0) for k, v in after.mongo.items()}
    return {"seconds": after.wall - before.wall,
            "redis": {k: v for k, v in redis.items() if v},
            "mongo": {k: v for k, v in mongo.items() if v}}


def mongo_writes(ops: dict[str, float]) -> float:
    """Write commands (``top`` writeLock: insert, update, findAndModify, delete)."""
    return sum(v for k, v in ops.items() if k.endswith(".writeLock"))


async def idle_rates(probe: Probe, seconds: float) -> dict[str, Any]:
    """Per-second background counts over an idle window."""
    c0 = await probe.counters()
    await asyncio.sleep(seconds)
    d = delta(c0, await probe.counters())
    s = d["seconds"]
    return {"seconds": round(s, 2),
            "redis": {k: v / s for k, v in d["redis"].items()},
            "mongo": {k: v / s for k, v in d["mongo"].items()}}


def per_msg_costs(window: dict[str, Any], idle: dict[str, Any], n: int) -> dict[str, Any]:
    """Per message, background (idle rate x window length) subtracted."""
    s = window["seconds"]
    redis = {k: (v - idle["redis"].get(k, 0.0) * s) / n for k, v in window["redis"].items()}
    mongo = {k: (v - idle["mongo"].get(k, 0.0) * s) / n for k, v in window["mongo"].items()}
    top = sorted(redis.items(), key=lambda kv: -kv[1])[:8]
    return {"redis_raw": window["redis"], "mongo_raw": window["mongo"],
            "redis_cmds_per_msg": sum(redis.values()),
            "redis_background_per_msg": sum(idle["redis"].values()) * s / n,
            "redis_top_per_msg": [[k, round(v, 2)] for k, v in top],
            "mongo_ops_per_msg": {k: round(v, 3) for k, v in mongo.items() if v},
            "mongo_writes_per_msg": mongo_writes(mongo)}


# -- the naive design: one HINCRBY per member per message ----------------------------------
async def naive_hincrby(r: aioredis.Redis, prefix: str, group: str, members: list[str],
                        messages: int) -> list[float]:
    """Per message, one pipeline of ``HINCRBY <prefix>:unread:{member} g:<group> 1`` for
    every member; returns the seconds each message's pipeline took."""
    keys = [f"{prefix}:unread:{{{m}}}" for m in members]
    field_ = f"g:{group}"
    took: list[float] = []
    for _ in range(messages):
        t = time.perf_counter()
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.hincrby(k, field_, 1)
        await pipe.execute()
        took.append(time.perf_counter() - t)
    return took


# -- report rows -----------------------------------------------------------------------
def flatness(res: dict[str, Any]) -> dict[str, Any]:
    """The two biggest read-diffusion sizes: Redis cmds/msg and Mongo writes/msg within 10%."""
    rows = sorted((r for r in res["sizes"] if r.get("mode") == "read" and "error" not in r),
                  key=lambda r: r["size"])[-2:]
    if len(rows) < 2:
        return {"verdict": "n/a (fewer than two sizes above the threshold)"}
    lo, hi = rows
    ratios = {k: (hi[k] / lo[k] if lo[k] else None)
              for k in ("redis_cmds_per_msg", "mongo_writes_per_msg", "mongo_docs_per_msg")}
    flat = all(r is not None and 0.9 <= r <= 1.1 for k, r in ratios.items()
               if k != "mongo_docs_per_msg")
    noisy = [r["size"] for r in rows if r["foreign_clients"]]
    return {"sizes": [lo["size"], hi["size"]], "ratios": ratios, "noisy_sizes": noisy,
            "verdict": ("yes" if flat else "no") + (" (other Redis clients were active: "
                                                    "Redis counts uncertain)" if noisy else "")}


def _quiet(r: dict[str, Any]) -> str:
    n, tries = len(r["foreign_clients"]), len(r["attempts"])
    if n:
        return f"NO: {n} other clients ({tries} tries)"
    return "yes" + (f" (try {tries})" if tries > 1 else "")


def cost_rows(res: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in res["sizes"]:
        if "error" in r:
            rows.append([r["size"], "error: " + r["error"][:80]] + ["-"] * 7)
            continue
        nv = r["naive"]
        rows.append([r["size"], f"{r['mode']} diffusion",
                     lat(r["ack"]),
                     round(r["redis_cmds_per_msg"], 1), round(r["mongo_writes_per_msg"], 2),
                     round(r["mongo_docs_per_msg"], 2), round(nv["hincrby_per_msg"], 1),
                     nv["time"]["mean_ms"], _quiet(r)])
    return rows


def reaction_rows(sizes: list[dict[str, Any]]) -> list[list[Any]]:
    rows = []
    for r in sizes:
        x = r["reactions"]
        if "error" in x:
            rows.append([r["size"], "error: " + str(x["error"])[:80]] + ["-"] * 8)
            continue
        ops = ", ".join(f"{k} {v:g}" for k, v in x["mongo_ops_per_msg"].items())
        rows.append([r["size"], f"{r['mode']} diffusion", lat(x["latency"]),
                     round(x["redis_cmds_per_msg"], 1),
                     ", ".join(f"{k} {v:g}" for k, v in x["redis_top_per_msg"][:5]),
                     round(x["mongo_writes_per_msg"], 2), ops,
                     f"{r['redis_cmds_per_msg']:.1f} / {r['mongo_writes_per_msg']:.2f}",
                     f"{x['ok']}/{x['reactions']}", _quiet(x)])
    return rows


def _cpu(entries: list[dict[str, Any]], prefix: str) -> float:
    return next((c["ms_per_op"] for c in entries if c["what"].startswith(prefix)), 0.0)


def detail_rows(res: dict[str, Any]) -> list[list[Any]]:
    rows = []
    for r in (r for r in res["sizes"] if "error" not in r):
        p, cpu = r["pushes"], r["cpu_ms_per_msg"]
        ops = ", ".join(f"{k.removesuffix('.writeLock')} {v:g}"
                        for k, v in r["mongo_ops_per_msg"].items() if k.endswith(".writeLock"))
        rows.append([r["size"], r["ack"]["mean_ms"], r["ack"]["max_ms"], r["first_send_ms"],
                     _cpu(cpu, "gateway node"), _cpu(cpu, "secantus"),
                     ", ".join(f"{k} {v:g}" for k, v in r["redis_top_per_msg"][:5]), ops,
                     f"{p['received']}/{p['expected']}",
                     lat(p["latency"]),
                     f"{r['acked']}/{r['messages']}, seq " + (
                         "ok" if r["seq_contiguous"] else "GAPS"), r["setup_s"]])
    return rows


def conv_rows(conv: dict[str, Any]) -> list[list[Any]]:
    def finds(u: dict[str, Any]) -> int:
        return sum(v for k, v in u["cold_mongo"].items() if k.endswith(".queries"))

    return [[f"{u['groups']} groups, {u['one_to_one']} 1:1", u["rows"], u["bytes"],
             f"{fmt(u['cold_ms'])} ({finds(u)} Mongo finds)",
             u["latency"]["p50_ms"], u["latency"]["p99_ms"], u["latency"]["max_ms"],
             u["latency"]["mean_ms"], round(u["redis_cmds_per_call"], 1),
             _cpu(u["cpu_ms_per_call"], "gateway node"),
             ("yes" if u["total_unread_ok"] else f"NO {u['wrong_totals']}")
             + f" ({u['expected_total_unread']})", _quiet(u)] for u in conv.get("users", [])]
