"""The load of the failover phase (``bench.failover``): users that keep one send
in flight each and resend it, same ``cmid``, until acked.

``FoUser`` is one user (one WebSocket, what it sent, had acked and received);
``Failover`` connects the users, reconnects the dead node's clients round
robin over the nodes still up, paces and resends their sends, and at the end
syncs chosen users over HTTP (``GET /v1/sync?since=0``, every page).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from bench import common
from bench.load import dial
from gateway.auth import issue_token

ACK_TIMEOUT_S = 10.0  # resend a send not answered within this
SYNC_LIMIT = 200
SYNC_CONCURRENCY = 2  # final sync: requests in flight over the surviving nodes
SYNC_RETRIES = 4


@dataclass(eq=False)
class FoUser:
    """One failover client: one WebSocket, one send in flight."""

    name: str
    peer: str
    home: int
    token: str
    at: int = -1
    ws: ClientConnection | None = None
    gen: int = 0  # connections opened so far; 1 = the first
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    waiting: dict[int, asyncio.Future[dict[str, Any] | None]] = field(default_factory=dict)
    sent: int = 0  # distinct cmids put on the wire
    attempts: int = 0  # send frames, resends included
    acked: dict[str, tuple[int, int, float]] = field(default_factory=dict)  # cmid -> mid, gen, t
    got: dict[int, tuple[float | None, str, str]] = field(default_factory=dict)  # mid -> t,from,how
    dup_pushes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    timeouts: int = 0
    connects: list[tuple[float, int]] = field(default_factory=list)  # (t, node)
    closes: list[float] = field(default_factory=list)
    synced: set[int] | None = None  # every mid of the final sync's answer, if synced
    lost_sends: list[float] = field(default_factory=list)  # a send in flight lost its connection


class Failover:
    """The failover load: users, their connections, and the kill."""

    def __init__(self, ws_urls: list[str], secret: str, n_users: int, interval: float,
                 tag: str) -> None:
        self.ws_urls = ws_urls
        self.secret = secret
        self.interval = interval
        n = len(ws_urls)
        self.users = [FoUser(f"{tag}-u{i}", f"{tag}-u{(i + 1) % n_users}", i % n,
                             issue_token(secret, f"{tag}-u{i}", 3600)) for i in range(n_users)]
        self.up = [True] * n
        self._rr = itertools.count()
        self._rids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self.stopping = False  # no new sends
        self.closing = False  # no reconnects
        self.hard_deadline = math.inf
        self.connect_failures: Counter[str] = Counter()
        self.other: Counter[str] = Counter()
        self.acks: list[tuple[float, float, int]] = []  # (t, since first send, home node)
        self.pushes_at: list[float] = []

    # -- connections -----------------------------------------------------------
    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _next_up(self) -> int:
        alive = [i for i, up in enumerate(self.up) if up]
        return alive[next(self._rr) % len(alive)]

    async def connect(self, u: FoUser, node: int | None = None) -> None:
        """To ``node`` (the first connection), else round robin over the nodes up."""
        failures = 0
        while not self.closing and time.perf_counter() < self.hard_deadline:
            i = node if node is not None else self._next_up()
            try:
                ws = await dial(self.ws_urls[i], self.secret, u.name, open_timeout=5)
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.connect_failures[type(exc).__name__] += 1
                failures += 1
                if node is not None and failures >= 10:
                    raise RuntimeError(f"{u.name} cannot connect to node {node}") from exc
                await asyncio.sleep(0.1)
                continue
            u.ws, u.at, u.gen = ws, i, u.gen + 1
            u.connects.append((time.perf_counter(), i))
            u.ready.set()
            self._spawn(self._read(u, ws))
            return

    async def _read(self, u: FoUser, ws: ClientConnection) -> None:
        try:
            async for data in ws:
                f = orjson.loads(data)
                op = f.get("op")
                if op == "msg":
                    self._on_push(u, f)
                elif op in ("ack", "error") and (fut := u.waiting.pop(f.get("re"), None)):
                    if not fut.done():
                        fut.set_result(f)
                else:
                    self.other[f"{op}:{f.get('code')}" if op == "error" else str(op)] += 1
        except ConnectionClosed:
            pass
        finally:
            if u.ws is ws:
                u.ready.clear()
                u.closes.append(time.perf_counter())
                for fut in u.waiting.values():
                    if not fut.done():
                        fut.set_result(None)
                u.waiting.clear()
                if not self.closing:
                    self._spawn(self.connect(u))

    def _on_push(self, u: FoUser, f: dict[str, Any]) -> None:
        t = time.perf_counter()
        mid = f.get("mid")
        if not isinstance(mid, int) or f.get("to") != u.name:
            self.other["msg:unexpected"] += 1
            return
        if mid in u.got:
            u.dup_pushes += 1
            return
        u.got[mid] = (t, str(f.get("from")), "push")
        self.pushes_at.append(t)

    # -- sending ---------------------------------------------------------------
    async def pump(self, u: FoUser, first_due: float) -> None:
        due, k = first_due, 0
        while not self.stopping:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if self.stopping:
                return
            k += 1
            await self._deliver(u, f"c{k}", {"k": k, "t": time.perf_counter()})
            due = max(due + self.interval, time.perf_counter())

    async def _deliver(self, u: FoUser, cmid: str, body: dict[str, Any]) -> None:
        """Send until acked, resending the same cmid; give up at the hard deadline."""
        loop = asyncio.get_running_loop()
        first, t_first = True, 0.0
        while (left := self.hard_deadline - time.perf_counter()) > 0:
            try:
                await asyncio.wait_for(u.ready.wait(), left)
            except TimeoutError:
                return
            ws, gen = u.ws, u.gen
            assert ws is not None
            rid = next(self._rids)
            fut: asyncio.Future[dict[str, Any] | None] = loop.create_future()
            u.waiting[rid] = fut
            frame = {"op": "send", "id": rid, "to": u.peer, "cmid": cmid, "body": body}
            try:
                await ws.send(orjson.dumps(frame).decode())
            except ConnectionClosed:
                u.waiting.pop(rid, None)
                await asyncio.sleep(0.01)  # the reader notices and reconnects
                continue
            if first:
                u.sent, first, t_first = u.sent + 1, False, time.perf_counter()
            u.attempts += 1
            try:
                reply = await asyncio.wait_for(fut, min(ACK_TIMEOUT_S, max(0.01, left)))
            except TimeoutError:
                u.waiting.pop(rid, None)
                u.timeouts += 1
                continue
            if reply is None:  # connection lost: resend once reconnected
                u.lost_sends.append(time.perf_counter())
                continue
            if reply.get("op") == "ack":
                t = time.perf_counter()
                u.acked[cmid] = (int(reply["mid"]), gen, t)
                self.acks.append((t, t - t_first, u.home))
                return
            code = str(reply.get("code"))
            u.errors[code] += 1
            if code not in ("unavailable", "rate_limited"):
                return  # not worth retrying
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.closing = True
        conns = [u.ws for u in self.users if u.ws is not None]
        await asyncio.gather(*(ws.close() for ws in conns), return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- final sync --------------------------------------------------------------
    async def final_sync(self, users: list[FoUser], http_urls: list[str],
                         timeout_s: float) -> dict[str, Any]:
        """``GET /v1/sync?since=0``, all pages, for ``users``; adds what pushes missed
        and keeps every mid returned (``u.synced``) for the cross-check.

        ``since=0`` is older than any offline store's floor, so the node answers
        from the MongoDB boxes, which is slow on SecantusDB: few requests at a
        time, a 503 (the node's store timeout) is retried, every page is timed.
        """
        sem = asyncio.Semaphore(SYNC_CONCURRENCY)
        failures: Counter[str] = Counter()
        pages, retries = 0, 0
        page_s: list[float] = []

        async def get(client: httpx.AsyncClient, url: str, u: FoUser,
                      since: int) -> dict[str, Any]:
            nonlocal retries
            for attempt in range(SYNC_RETRIES + 1):
                t = time.perf_counter()
                r = await client.get(url, params={"since": since, "limit": SYNC_LIMIT},
                                     headers={"Authorization": f"Bearer {u.token}"})
                if r.status_code == 503 and attempt < SYNC_RETRIES:
                    retries += 1
                    await asyncio.sleep(1.0)
                    continue
                r.raise_for_status()
                page_s.append(time.perf_counter() - t)
                return dict(r.json())
            raise AssertionError("unreachable")

        async def one(client: httpx.AsyncClient, u: FoUser, base: str) -> None:
            nonlocal pages
            since, u.synced = 0, set()
            async with sem:
                for _ in range(1000):
                    page = await get(client, f"{base}/v1/sync", u, since)
                    pages += 1
                    for m in page["msgs"]:
                        u.synced.add(m["mid"])
                        if m.get("to") == u.name and m["mid"] not in u.got:
                            u.got[m["mid"]] = (None, str(m.get("from")), "sync")
                    if not page["more"]:
                        return
                    if page["next"] <= since:
                        failures["cursor did not move"] += 1
                        return
                    since = page["next"]

        started = time.perf_counter()
        async with httpx.AsyncClient(timeout=15, trust_env=False) as client:
            jobs = [one(client, u, http_urls[i % len(http_urls)]) for i, u in enumerate(users)]
            try:
                async with asyncio.timeout(timeout_s):
                    results = await asyncio.gather(*jobs, return_exceptions=True)
            except TimeoutError:
                results = [TimeoutError(f"final sync took over {timeout_s:.0f} s")]
        for r in results:
            if isinstance(r, BaseException):
                failures[f"{type(r).__name__}: {str(r).splitlines()[0][:100] if str(r) else ''}"
                         ] += 1
        return {"users": len(users), "pages": pages, "retries_after_503": retries,
                "seconds": round(time.perf_counter() - started, 2), "failures": dict(failures),
                "page_latency": common.latency_summary(page_s, (50, 99))}
