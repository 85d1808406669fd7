"""The attacker of ``bench.abuse``, in a process of its own (``python -m
bench.abuse --attacker-child``): its connections, its setup (presence watches,
new conversations) and its attack at every budget; and the pacing helpers both
sides use. Commands come as JSON lines on stdin, one JSON answer each."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import orjson
from websockets.exceptions import InvalidStatus

from bench import common
from bench.stats import latency_summary
from testkit.device import Device, DeviceClosed
from testkit.poll import bounded
from testkit.tokens import issue_token

TEXT = "a line of text, as people type them in a chat, neither short nor long"
ATTACK_TIMEOUT_S = 20.0  # one attacker request
SUB_BATCH = 500  # ids per presence_sub (the protocol's most)
Frame = dict[str, Any]

# -- pacing -------------------------------------------------------------------------------
async def paced(rate: float, until: float, job: Callable[[int], Awaitable[Any]]) -> int:
    """``job(i)`` one after another, started at most ``rate`` a second (no catching
    up after a slow one), until ``until`` (``perf_counter``); how many ran."""
    nxt, i = time.perf_counter(), 0
    while True:
        if (wait := nxt - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        if time.perf_counter() >= until:
            return i
        await job(i)
        i += 1
        nxt = max(nxt + 1 / rate, time.perf_counter())


async def launched(rate: float, until: float, job: Callable[[int], Awaitable[Any]],
                   inflight: int) -> int:
    """``job(i)`` as tasks started ``rate`` a second, at most ``inflight`` running
    (no catching up when held back), until ``until``; waits for the last ones."""
    sem = asyncio.Semaphore(inflight)
    tasks: set[asyncio.Task[None]] = set()

    async def one(i: int) -> None:
        try:
            await job(i)
        finally:
            sem.release()

    nxt, i = time.perf_counter(), 0
    while True:
        if (wait := nxt - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        if time.perf_counter() >= until:
            break
        await sem.acquire()
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
        nxt = max(nxt + 1 / rate, time.perf_counter())
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
    return i


async def loop_lag(until: float, out: list[float], every: float = 0.05) -> None:
    """How late this process's event loop wakes up (s), every ``every`` s."""
    while time.perf_counter() < until:
        t = time.perf_counter()
        await asyncio.sleep(every)
        out.append(time.perf_counter() - t - every)


class Calls:
    """Latencies (s) and failures of one measured call in one phase."""

    def __init__(self) -> None:
        self.lat: list[float] = []
        self.errors: Counter[str] = Counter()

    def summary(self) -> dict[str, Any]:
        s = latency_summary(self.lat, (50, 99))
        return {"n": s["count"], "p50_ms": s["p50_ms"], "p99_ms": s["p99_ms"],
                "max_ms": s["max_ms"], "errors": dict(self.errors)}


# -- the attacker (a child process) ---------------------------------------------------------
class Slot:
    """One of the attacker's connections, opened again when the node closes it."""

    def __init__(self, att: Attacker, i: int) -> None:
        self.att, self.i = att, i
        self.dev: Device | None = None
        self.lock = asyncio.Lock()

    async def open(self) -> Device:
        self.dev = await Device.open(self.att.ws_url, self.att.token, on_push=self.att.on_push,
                                     open_timeout=15, max_size=1 << 22)
        return self.dev

    async def device(self) -> Device:
        async with self.lock:
            if self.dev is not None and not self.dev.closed:
                return self.dev
            if self.dev is not None:
                self.att.closes[str(self.dev.close_code)] += 1
            for attempt in range(8):  # the node may not have counted the old one out yet
                try:
                    self.att.reopens += 1
                    return await self.open()
                except InvalidStatus as exc:  # 429: a per-user or per-connection cap
                    self.att.closes[f"handshake {exc.response.status_code}"] += 1
                    await asyncio.sleep(0.25 * (attempt + 1))
                except (OSError, TimeoutError):
                    await asyncio.sleep(0.25 * (attempt + 1))
            raise DeviceClosed(f"connection {self.i} could not be opened again")


class Attacker:
    """The main attacker: one token, several connections, every budget full."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.ws_url, self.http_url = cfg["ws_url"], cfg["http_url"]
        self.token = issue_token(cfg["secret"], cfg["user"], 4 * 3600)
        self.cfg = cfg
        self.slots = [Slot(self, i) for i in range(cfg["conns"])]
        self.groups: list[str] = []
        self.pushes: Counter[str] = Counter()
        # error frames matched to no waiting request: typing's (it has no id), and
        # late answers to requests that timed out here
        self.push_errors: Counter[str] = Counter()
        self.closes: Counter[str] = Counter()
        self.reopens = 0
        self.http = httpx.AsyncClient(timeout=ATTACK_TIMEOUT_S, trust_env=False,
                                      headers={"Authorization": f"Bearer {self.token}"},
                                      limits=httpx.Limits(max_connections=16))

    def on_push(self, f: Frame) -> None:
        op = str(f.get("op"))
        self.pushes[op] += 1
        if op == "error":
            self.push_errors[str(f.get("code"))] += 1

    async def open(self) -> dict[str, Any]:
        await asyncio.gather(*(s.open() for s in self.slots))
        extra: str
        try:  # one more than IM_MAX_CONNS_PER_USER
            dev = await Device.open(self.ws_url, self.token, open_timeout=15)
            extra = "opened"
            await dev.close()
        except InvalidStatus as exc:
            extra = f"refused {exc.response.status_code}"
        cursor: str | None = None
        for _ in range(1000):  # its groups, as a client lists them
            params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            page = (await self.http.get(f"{self.http_url}/v1/groups", params=params)).json()
            self.groups += [g["group"] for g in page["groups"]]
            if not (cursor := page.get("cursor")):
                break
        return {"conns": len(self.slots), "one_more_conn": extra, "groups": len(self.groups)}

    async def setup(self, watches: int, new_convs: int, extra: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        subs: Counter[str] = Counter()

        async def watch(slot: Slot, ids: list[str]) -> None:
            dev = await slot.device()
            for k in range(0, len(ids), SUB_BATCH):
                r = await dev.request("presence_sub", ATTACK_TIMEOUT_S, users=ids[k:k + SUB_BATCH])
                if r.get("op") != "presence":
                    subs[f"error {r.get('code')}"] += 1
                    continue
                for state in r["users"].values():
                    subs["hidden" if state.get("hidden") else "watched"] += 1

        shares = common.split(watches, len(self.slots))
        starts = [sum(shares[:i]) for i in range(len(shares))]
        await asyncio.gather(*(watch(s, [f"w{j}" for j in range(a, a + n)])
                               for s, a, n in zip(self.slots, starts, shares, strict=True)))
        watch_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        convs: Counter[str] = Counter()

        async def first_message(i: int) -> None:
            slot = self.slots[i % len(self.slots)]
            for attempt in range(5):
                try:
                    r = await (await slot.device()).request(
                        "send", ATTACK_TIMEOUT_S, to=f"n{i}", cmid=f"nc{i}", body=TEXT)
                except (TimeoutError, DeviceClosed) as exc:
                    convs[type(exc).__name__] += 1
                    return
                code = "ack" if r.get("op") == "ack" else str(r.get("code"))
                if code != "rate_limited" or attempt == 4:
                    convs[code] += 1
                    return
                await asyncio.sleep(0.2)

        await bounded((first_message(i) for i in range(new_convs + extra)), 16)
        return {"watches": {"asked": watches, **subs}, "watch_s": round(watch_s, 2),
                "new_convs": {"asked": new_convs + extra, **convs},
                "new_convs_s": round(time.perf_counter() - t1, 2)}

    async def attack(self, seconds: float, scale: float) -> dict[str, Any]:
        cfg = self.cfg
        until = time.perf_counter() + seconds
        answers: dict[str, Counter[str]] = {k: Counter() for k in (
            "group_send", "new_conv", "read", "presence_sub", "presence_unsub")}
        typings = Counter[str]()
        ack_lat: list[float] = []
        http: dict[str, Counter[str]] = {"groups": Counter(), "conversations": Counter()}
        pushes0, errors0 = Counter(self.pushes), Counter(self.push_errors)
        # One connection's budgets: every send also spends an op.
        new_conv = 1.0 * scale
        group = cfg["send_rate"] * scale - new_conv
        presence = 1.0 * scale  # cycles: an unsub and a sub each
        rest = cfg["op_rate"] * scale - cfg["send_rate"] * scale - 2 * presence
        typing = read = max(rest, 0.0) / 2
        fresh = iter(range(10**9))

        def note(kind: str, r: Frame, ok: str) -> None:
            answers[kind]["ok" if r.get("op") == ok else str(r.get("code"))] += 1

        async def request(slot: Slot, kind: str, op: str, ok: str, **fields: Any) -> None:
            try:
                r = await (await slot.device()).request(op, ATTACK_TIMEOUT_S, **fields)
            except (TimeoutError, DeviceClosed) as exc:
                answers[kind][type(exc).__name__] += 1
                return
            note(kind, r, ok)

        def conn_jobs(slot: Slot) -> list[Awaitable[int]]:
            n = len(self.groups) or 1
            offset = slot.i * (n // len(self.slots) or 1)

            async def group_send(i: int) -> None:
                if not self.groups:
                    return
                t = time.perf_counter()
                try:
                    r = await (await slot.device()).request(
                        "group_send", ATTACK_TIMEOUT_S, group=self.groups[(offset + i) % n],
                        cmid=f"g{slot.i}-{i}", body=TEXT)
                except (TimeoutError, DeviceClosed) as exc:
                    answers["group_send"][type(exc).__name__] += 1
                    return
                note("group_send", r, "ack")
                if r.get("op") == "ack":
                    ack_lat.append(time.perf_counter() - t)

            async def stranger(i: int) -> None:
                await request(slot, "new_conv", "send", "ack", to=f"x{slot.i}-{next(fresh)}",
                              cmid=f"x{slot.i}-{i}", body=TEXT)

            async def type_(i: int) -> None:
                try:
                    await (await slot.device()).send(
                        {"op": "typing", "conv": f"t{random.randrange(10**9)}"})
                    typings["sent"] += 1
                except DeviceClosed:
                    typings["DeviceClosed"] += 1

            async def read_(i: int) -> None:
                conv = (f"g:{random.choice(self.groups)}" if i % 2 and self.groups
                        else f"r{random.randrange(10**9)}")
                await request(slot, "read", "read", "ok", conv=conv,
                              mid=random.randrange(1, 2**52))

            async def resub(i: int) -> None:
                old = [f"p{slot.i}-{i - 1}-{k}" for k in range(SUB_BATCH)]
                if i:
                    await request(slot, "presence_unsub", "presence_unsub", "ok", users=old)
                await request(slot, "presence_sub", "presence_sub", "presence",
                              users=[f"p{slot.i}-{i}-{k}" for k in range(SUB_BATCH)])

            jobs: list[tuple[float, Callable[[], Awaitable[int]]]] = [
                (group, lambda: launched(group, until, group_send, cfg["max_inflight"])),
                (new_conv, lambda: launched(new_conv, until, stranger, 4)),
                (read, lambda: launched(read, until, read_, 16)),
                (typing, lambda: paced(typing, until, type_)),
                (presence, lambda: paced(presence, until, resub))]
            return [start() for rate, start in jobs if rate > 0]

        async def http_call(i: int) -> None:
            what = ("groups", "conversations")[i % 2]
            params = {"limit": 100} if what == "groups" else {"limit": 50}
            try:
                r = await self.http.get(f"{self.http_url}/v1/{what}", params=params)
                http[what][str(r.status_code)] += 1
            except httpx.HTTPError as exc:
                http[what][type(exc).__name__] += 1

        t0 = time.perf_counter()
        counts = await asyncio.gather(
            *(j for s in self.slots for j in conn_jobs(s)),
            launched(cfg["http_rate"] * scale, until, http_call, 16))
        took = time.perf_counter() - t0
        sent = sum(answers["group_send"].values())
        return {
            "seconds": round(took, 2), "per_conn_rates": {
                "group_send": group, "new_conv": new_conv, "typing": typing, "read": read,
                "presence_cycles": presence, "http_total": cfg["http_rate"] * scale},
            "started": int(sum(counts)), "answers": {k: dict(v) for k, v in answers.items()},
            "typing": dict(typings), "http": {k: dict(v) for k, v in http.items()},
            "group_send_per_s": round(sent / took, 1),
            "group_acks_per_s": round(answers["group_send"]["ok"] / took, 1),
            "group_send_ack": latency_summary(ack_lat, (50, 99)),
            "pushes_received": dict(self.pushes - pushes0),
            "error_pushes": dict(self.push_errors - errors0),
            "closed_by_node": dict(self.closes), "reopen_attempts": self.reopens}

    async def close(self) -> None:
        await asyncio.gather(*(s.dev.close() for s in self.slots if s.dev is not None))
        await self.http.aclose()


async def attacker_child() -> None:
    """``python -m bench.abuse --attacker-child``: commands as JSON lines on stdin
    (``open`` with the configuration, ``setup``, ``attack``), one JSON answer each."""
    att: Attacker | None = None
    async for line in common.stdin_lines():
        cmd = orjson.loads(line)
        try:
            if cmd["cmd"] == "open":
                att = Attacker(cmd)
                out = await att.open()
            elif att is None:
                out = {"error": "open first"}
            elif cmd["cmd"] == "setup":
                out = await att.setup(cmd["watches"], cmd["new_convs"], cmd["extra"])
            elif cmd["cmd"] == "attack":
                out = await att.attack(cmd["seconds"], cmd["scale"])
            else:
                out = {"error": f"unknown command {cmd['cmd']}"}
        except Exception as exc:  # noqa: BLE001 - answered
            out = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        common.emit(out)
    if att is not None:
        await att.close()
