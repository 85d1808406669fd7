"""A chat soak with failover clients, for failure tests and the failover benchmark.

Each user holds one WebSocket (a ``Device``) to one endpoint and sends to the
next user in a ring on a fixed schedule, one send in flight, resending the
same ``cmid`` on ``unavailable``, a timeout or a lost connection. A user whose
connection closes reconnects at once, round robin over the endpoints still
``up``, and (``sync_on_connect``) syncs over HTTP from its cursor first, as a
real client does. What each user sees is recorded with its time
(``perf_counter``): connects, closes, acks, pushes. ``final_sync`` syncs users
at the end; ``counts`` says whether every acknowledged message reached its
receiver, by push or by sync.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.exceptions import InvalidHandshake

from testkit.device import Device, DeviceClosed, ws_url
from testkit.http import HttpUser, http_url
from testkit.poll import bounded
from testkit.tokens import issue_token

__all__ = ["Ack", "Endpoint", "Got", "Soak", "SoakUser"]

MAX_TRIES = 500  # sends of one cmid before giving up
SYNC_LIMIT = 200
SYNC_RETRIES = 4  # a 503 (a store timed out) is retried this often, a second apart


@dataclass
class Endpoint:
    """One node as the soak sees it; ``up`` false: never (re)connect there."""

    ws_url: str
    http_url: str
    up: bool = True

    @classmethod
    def of(cls, node: Any) -> Endpoint:
        """Of anything with ``ws_port`` and ``http_port`` (a Node, a NodeProcess)."""
        return cls(ws_url(node.ws_port), http_url(node.http_port))


@dataclass(frozen=True)
class Ack:
    mid: int
    gen: int  # the user's connection it came on: 1 = the first
    t: float


@dataclass(frozen=True)
class Got:
    t: float | None  # None: found by a sync
    sender: str
    how: str  # "push" or "sync"


@dataclass(eq=False)
class SoakUser:
    """One user: one connection at a time, one send in flight."""

    name: str
    peer: str  # whom it sends to
    home: int  # endpoint of its first connection
    token: str
    at: int = -1  # endpoint of its current connection
    device: Device | None = None
    gen: int = 0  # connections opened so far
    cursor: int = 0  # sync cursor
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    sent: int = 0  # distinct cmids put on the wire
    attempts: int = 0  # send frames, resends included
    acked: dict[str, Ack] = field(default_factory=dict)  # cmid -> its ack
    got: dict[int, Got] = field(default_factory=dict)  # mid -> how it arrived
    dup_pushes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    timeouts: int = 0
    connects: list[tuple[float, int]] = field(default_factory=list)  # (t, endpoint)
    closes: list[float] = field(default_factory=list)
    lost_sends: list[float] = field(default_factory=list)  # a send in flight lost its socket
    synced: set[int] | None = None  # every mid of its final sync's answer, once synced


class Soak:
    """The users, their connections and their sends (see the module docstring)."""

    def __init__(self, endpoints: list[Endpoint], users: list[str], secret: str, *,
                 interval: float = 0.125, ack_timeout: float = 5.0,
                 sync_on_connect: bool = True, sync_concurrency: int = 4) -> None:
        self.endpoints = endpoints
        self.interval = interval
        self.ack_timeout = ack_timeout
        self.sync_on_connect = sync_on_connect
        self.sync_concurrency = sync_concurrency
        n = len(endpoints)
        self.users = [SoakUser(u, users[(i + 1) % len(users)], i % n,
                               issue_token(secret, u, 7200)) for i, u in enumerate(users)]
        self.stopping = False  # no new sends
        self.closing = False  # no reconnects
        self.hard_deadline = math.inf  # no send is tried after this
        self.acks: list[tuple[float, float, int]] = []  # (t, since first send, home)
        self.pushes_at: list[float] = []
        self.sync_page_s: list[float] = []
        self.sync_failures: Counter[str] = Counter()
        self.connect_failures: Counter[str] = Counter()
        self.other: Counter[str] = Counter()  # frames nobody expected
        self.http = httpx.AsyncClient(timeout=15, trust_env=False)
        self._rr = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._pumps: list[asyncio.Task[None]] = []

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- connections -------------------------------------------------------------
    def _next_up(self) -> int:
        alive = [i for i, ep in enumerate(self.endpoints) if ep.up]
        if not alive:
            raise RuntimeError("no endpoint is up")
        return alive[next(self._rr) % len(alive)]

    async def connect(self, u: SoakUser, endpoint: int | None = None) -> None:
        """To ``endpoint`` (RuntimeError after 10 failures), else round robin over
        the endpoints up, until connected, closing or the hard deadline."""
        failures = 0
        while not self.closing and time.perf_counter() < self.hard_deadline:
            i = endpoint if endpoint is not None else self._next_up()
            try:
                dev = await Device.open(self.endpoints[i].ws_url, u.token, open_timeout=5,
                                        on_push=functools.partial(self._on_push, u),
                                        on_close=functools.partial(self._on_close, u))
            except (OSError, InvalidHandshake, TimeoutError) as exc:
                self.connect_failures[type(exc).__name__] += 1
                failures += 1
                if endpoint is not None and failures >= 10:
                    raise RuntimeError(f"{u.name} cannot connect to endpoint {i}") from exc
                await asyncio.sleep(0.1)
                continue
            u.device, u.at, u.gen = dev, i, u.gen + 1
            u.connects.append((time.perf_counter(), i))
            if self.sync_on_connect:
                await self.sync(u)
            u.ready.set()
            return

    async def connect_all(self, concurrency: int = 50) -> None:
        """Every user to its home endpoint."""
        async with asyncio.timeout(120):
            await bounded((self.connect(u, u.home) for u in self.users), concurrency)

    def _on_close(self, u: SoakUser, dev: Device) -> None:
        if u.device is not dev:
            return
        u.ready.clear()
        u.closes.append(time.perf_counter())
        if not self.closing:
            self._spawn(self.connect(u))

    def _on_push(self, u: SoakUser, f: dict[str, Any]) -> None:
        mid = f.get("mid")
        if f.get("op") != "msg" or not isinstance(mid, int):
            self.other[str(f.get("op"))] += 1
        elif f.get("to") != u.name:  # its own message, replayed after a broker outage
            self.other["msg from this user"] += 1
        elif mid in u.got:
            u.dup_pushes += 1
        else:
            t = time.perf_counter()
            u.got[mid] = Got(t, str(f.get("from")), "push")
            self.pushes_at.append(t)

    # -- sending -----------------------------------------------------------------
    async def deliver(self, u: SoakUser, cmid: str, body: Any = None) -> Ack | None:
        """Send ``cmid`` to ``u.peer`` until acked, resending the same cmid; None if
        refused for good, or at the hard deadline."""
        t_first = 0.0
        for _ in range(MAX_TRIES):
            left = self.hard_deadline - time.perf_counter()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(u.ready.wait(), min(left, 30))
            if not u.ready.is_set() or u.device is None:
                continue
            dev, gen = u.device, u.gen
            if not t_first:
                u.sent, t_first = u.sent + 1, time.perf_counter()
            u.attempts += 1
            try:
                reply = await dev.request("send", timeout=min(self.ack_timeout, max(0.01, left)),
                                          to=u.peer, cmid=cmid,
                                          body={"c": cmid} if body is None else body)
            except TimeoutError:
                u.timeouts += 1
                u.errors["timeout"] += 1
                continue
            except DeviceClosed:
                u.lost_sends.append(time.perf_counter())
                u.errors["lost"] += 1
                await asyncio.sleep(0.01)  # the reader notices and reconnects
                continue
            if reply.get("op") == "ack":
                t = time.perf_counter()
                ack = u.acked[cmid] = Ack(int(reply["mid"]), gen, t)
                self.acks.append((t, t - t_first, u.home))
                return ack
            code = str(reply.get("code"))
            u.errors[code] += 1
            if code not in ("unavailable", "rate_limited"):
                return None  # not worth retrying
            await asyncio.sleep(0.2)
        return None

    async def pump(self, u: SoakUser, first_due: float) -> None:
        """Sends ``u``'s messages (cmids ``<name>-<k>``), one every ``interval``."""
        due = first_due
        for k in itertools.count():
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            if self.stopping:
                return
            await self.deliver(u, f"{u.name}-{k}", {"k": k, "t": time.perf_counter()})
            due = max(due + self.interval, time.perf_counter())

    def start(self) -> float:
        """Every user's pump, spread over one interval; returns the start time."""
        t0 = time.perf_counter() + 0.05
        n = len(self.users)
        self._pumps = [asyncio.create_task(self.pump(u, t0 + self.interval * i / n))
                       for i, u in enumerate(self.users)]
        return t0

    async def stop(self, drain_s: float = 10.0) -> int:
        """No new sends; those in flight get ``drain_s`` to be acked. Returns how many
        pumps had to be cancelled."""
        self.stopping = True
        self.hard_deadline = time.perf_counter() + drain_s
        stuck: set[asyncio.Task[None]] = set()
        if self._pumps:
            _, stuck = await asyncio.wait(self._pumps, timeout=drain_s + 1)
        for t in stuck:
            t.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)
        self.hard_deadline = math.inf  # ``deliver`` works again, one message at a time
        return len(stuck)

    async def run(self, seconds: float, event: Callable[[], Awaitable[Any]] | None = None,
                  event_at: float = 0.0) -> None:
        """Connect, send for ``seconds`` (``event`` at ``event_at``), stop."""
        await self.connect_all()
        self.start()
        try:
            if event is not None:
                await asyncio.sleep(event_at)
                await event()
                await asyncio.sleep(max(0.0, seconds - event_at))
            else:
                await asyncio.sleep(seconds)
        finally:
            await self.stop()

    # -- syncing and counting ------------------------------------------------------
    async def sync(self, u: SoakUser, final: bool = False) -> None:
        """``GET /v1/sync`` from the user's cursor, every page, on its endpoint (or
        another one up); records what pushes missed. A 503 is retried."""
        ep = self.endpoints[u.at] if u.at >= 0 and self.endpoints[u.at].up else \
            self.endpoints[self._next_up()]
        http = HttpUser(ep.http_url, u.token, client=self.http)
        if final:
            u.synced = set()
        try:
            for _ in range(1000):
                page = await self._sync_page(http, u.cursor)
                if page is None:
                    u.errors["sync_failed"] += 1
                    return
                for m in page["msgs"]:
                    if u.synced is not None and final:
                        u.synced.add(m["mid"])
                    if m.get("to") == u.name and m["mid"] not in u.got:
                        u.got[m["mid"]] = Got(None, str(m.get("from")), "sync")
                moved, u.cursor = page["next"] > u.cursor, page["next"]
                if not page["more"] or not moved:
                    return
        except (httpx.HTTPError, OSError) as exc:
            self.sync_failures[type(exc).__name__] += 1
            u.errors["sync_failed"] += 1

    async def _sync_page(self, http: HttpUser, since: int) -> dict[str, Any] | None:
        for attempt in range(SYNC_RETRIES + 1):
            t = time.perf_counter()
            r = await http.get("/v1/sync", params={"since": since, "limit": SYNC_LIMIT})
            if r.status_code == 200:
                self.sync_page_s.append(time.perf_counter() - t)
                page: dict[str, Any] = r.json()
                return page
            self.sync_failures[f"status {r.status_code}"] += 1
            if r.status_code != 503 or attempt == SYNC_RETRIES:
                return None
            await asyncio.sleep(1.0)
        return None

    async def final_sync(self, users: list[SoakUser] | None = None,
                         timeout_s: float = 180) -> None:
        """Sync ``users`` (default: all), ``sync_concurrency`` at a time."""
        try:
            async with asyncio.timeout(timeout_s):
                await bounded((self.sync(u, final=True) for u in (
                    self.users if users is None else users)), self.sync_concurrency)
        except TimeoutError:
            self.sync_failures[f"final sync took over {timeout_s:.0f} s"] += 1

    def counts(self) -> dict[str, Any]:
        """Sent, acked, received (by push, else by sync), missing (acked, never
        received: each with sender, receiver, cmid, mid, connection), and the rest."""
        users = {u.name: u for u in self.users}
        missing: list[dict[str, Any]] = []
        paths: Counter[str] = Counter()
        acked_mids: set[int] = set()
        for u in self.users:
            r = users[u.peer]
            for cmid, ack in u.acked.items():
                acked_mids.add(ack.mid)
                got = r.got.get(ack.mid)
                if got is None:
                    missing.append({"from": u.name, "to": r.name, "cmid": cmid, "mid": ack.mid,
                                    "gen": ack.gen})
                else:
                    paths[got.how] += 1
        sent = sum(u.sent for u in self.users)
        return {
            "sent": sent, "acked": sum(len(u.acked) for u in self.users),
            "received": paths["push"] + paths["sync"], "by_push": paths["push"],
            "by_sync": paths["sync"], "missing": sorted(missing, key=lambda m: m["mid"]),
            "unacked_received": sum(1 for u in self.users for mid in u.got
                                    if mid not in acked_mids),
            "duplicate_pushes": sum(u.dup_pushes for u in self.users),
            "resends": sum(u.attempts for u in self.users) - sent,
            "ack_timeouts": sum(u.timeouts for u in self.users),
            "errors": dict(sum((u.errors for u in self.users), Counter())),
            "reconnects": sum(max(0, u.gen - 1) for u in self.users),
            "connect_failures": dict(self.connect_failures),
            "unexpected_frames": dict(self.other)}

    async def finish(self) -> dict[str, Any]:
        """Final sync of everyone, then the counts; closes the soak."""
        await self.final_sync()
        try:
            return self.counts()
        finally:
            await self.close()

    async def disconnect(self) -> None:
        """Close every connection, no reconnects; HTTP (``final_sync``) still works."""
        self.closing = True
        for t in self._pumps:
            t.cancel()
        await asyncio.gather(*(u.device.close() for u in self.users if u.device is not None),
                             return_exceptions=True)
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._pumps, *self._tasks, return_exceptions=True)

    async def close(self) -> None:
        await self.disconnect()
        await self.http.aclose()
