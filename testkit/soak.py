"""A chat soak with failover clients, for failure tests and the failover benchmark.

Each user is an SDK client (``imgate_client.Client``) and sends to the next user
in a ring on a fixed schedule, one send in flight. The client does what a real
one does: it reconnects (jittered backoff, here round robin over the endpoints
still ``up``), writes a send in flight again with the same ``cmid`` after a
reconnect, an ack timeout or ``unavailable``, and (``sync_on_connect``) syncs
over HTTP from its cursor after every connect, delivering each mid once. The
soak records what each user sees, with its time (``perf_counter``), from the
client's events: connects (``Connected``), closes and the sends they cut
(``ConnectionLost``), acks (``Ack``: attempts, refusals, timeouts), messages
(``Message``, by push or sync). ``final_sync`` reads users' stored messages at
the end; ``counts`` says whether every acknowledged message reached its
receiver, by push or by sync.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from imgate_client import (
    Client,
    ClientStopped,
    Connected,
    Connection,
    ConnectionLost,
    Event,
    HttpError,
    Message,
    Push,
    SendTimeout,
    ServerError,
    SyncFailed,
)

from testkit.device import ws_url
from testkit.http import http_url
from testkit.poll import bounded
from testkit.tokens import issue_token

__all__ = ["Ack", "Endpoint", "Got", "Soak", "SoakUser"]

SEND_TIMEOUT_S = 600.0  # one send's bound when no stop set a deadline
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
    """One user: an SDK client (one connection at a time), one send in flight."""

    name: str
    peer: str  # whom it sends to
    home: int  # endpoint of its first connection
    token: str
    client: Client = field(init=False, repr=False)
    order: list[int] = field(default_factory=list)  # client's URL index -> endpoint
    at: int = -1  # endpoint of its current connection
    sent: int = 0  # distinct cmids handed to the client
    attempts: int = 0  # send frames, resends included (of the sends answered)
    acked: dict[str, Ack] = field(default_factory=dict)  # cmid -> its ack
    got: dict[int, Got] = field(default_factory=dict)  # mid -> how it arrived
    errors: Counter[str] = field(default_factory=Counter)
    timeouts: int = 0  # resends after an ack timeout
    connects: list[tuple[float, int]] = field(default_factory=list)  # (t, endpoint)
    closes: list[float] = field(default_factory=list)
    lost_sends: list[float] = field(default_factory=list)  # a send in flight lost its socket
    synced: set[int] | None = None  # every mid of its final sync's answer, once synced
    conns: list[Connection] = field(default_factory=list, repr=False)  # every one set up

    @property
    def gen(self) -> int:
        """Connections opened so far."""
        return self.client.connects

    @property
    def cursor(self) -> int:
        return self.client.cursor

    @property
    def msg_pushes(self) -> int:
        """``msg`` frames pushed to it, duplicates included."""
        return sum(c.counts["msg"] for c in self.conns)


class Soak:
    """The users, their clients and their sends (see the module docstring)."""

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
        for u in self.users:
            u.order = [(u.home + k) % n for k in range(n)]  # its home first
            u.client = Client(
                [endpoints[i].ws_url for i in u.order],
                http_urls=[endpoints[i].http_url for i in u.order], token=u.token,
                on_event=functools.partial(self._on_event, u), sync_on_connect=sync_on_connect,
                sync_limit=SYNC_LIMIT, ack_timeout=ack_timeout, send_timeout=SEND_TIMEOUT_S,
                refresh_ahead=None, http_timeout=15.0,
                next_url=functools.partial(self._next_url, u))
        self.stopping = False  # no new sends
        self.hard_deadline = math.inf  # no send is waited for after this
        self.acks: list[tuple[float, float, int]] = []  # (t, since first send, home)
        self.pushes_at: list[float] = []
        self.sync_page_s: list[float] = []
        self.sync_failures: Counter[str] = Counter()
        self.connect_failures: Counter[str] = Counter()
        self.other: Counter[str] = Counter()  # events nobody expected
        self._rr = itertools.count()
        self._deadlines: set[asyncio.Timeout] = set()  # of the sends waiting
        self._pumps: list[asyncio.Task[None]] = []

    # -- connections -------------------------------------------------------------
    def _next_up(self) -> int | None:
        alive = [i for i, ep in enumerate(self.endpoints) if ep.up]
        return alive[next(self._rr) % len(alive)] if alive else None

    def _next_url(self, u: SoakUser, index: int) -> int:
        """The client's next URL: round robin (shared by all users) over those up."""
        i = self._next_up()
        return index + 1 if i is None else u.order.index(i)

    async def connect_all(self, concurrency: int = 50) -> None:
        """Every user to its home endpoint (the client's first URL), synced."""
        async with asyncio.timeout(120):
            await bounded((u.client.connect(timeout=120) for u in self.users), concurrency)

    def _on_event(self, u: SoakUser, ev: Event) -> None:
        t = time.perf_counter()
        if isinstance(ev, Message):
            self._on_message(u, ev, t)
        elif isinstance(ev, Connected):
            u.at = u.order[u.client.urls.index(ev.url)]
            u.connects.append((t, u.at))
            if u.client.connection is not None:
                u.conns.append(u.client.connection)
        elif isinstance(ev, ConnectionLost):
            if not ev.opened:
                self.connect_failures[ev.reason.partition("(")[0]] += 1
                return
            u.closes.append(t)
            for _ in range(ev.unanswered):
                u.lost_sends.append(t)
                u.errors["lost"] += 1
        elif isinstance(ev, SyncFailed):
            self.sync_failures[f"sync after connect: {ev.error.partition('(')[0]}"] += 1
            u.errors["sync_failed"] += 1
        elif isinstance(ev, Push):
            self.other[ev.op] += 1

    def _on_message(self, u: SoakUser, ev: Message, t: float) -> None:
        if ev.op != "msg":
            self.other[ev.op] += 1
        elif ev.frame.get("to") != u.name:  # its own message, replayed after a broker outage
            self.other["msg from this user"] += 1
        elif ev.mid not in u.got:  # the client delivers each mid once
            u.got[ev.mid] = Got(t if ev.via == "push" else None, ev.sender, ev.via)
            if ev.via == "push":
                self.pushes_at.append(t)

    # -- sending -----------------------------------------------------------------
    async def deliver(self, u: SoakUser, cmid: str, body: Any = None) -> Ack | None:
        """Send ``cmid`` to ``u.peer`` until acked (the client resends the same cmid);
        None if refused for good, or at the hard deadline."""
        loop = asyncio.get_running_loop()
        t_first = time.perf_counter()
        u.sent += 1
        try:
            async with asyncio.timeout(None) as deadline:
                self._deadlines.add(deadline)
                if self.hard_deadline < math.inf:
                    deadline.reschedule(loop.time() + self.hard_deadline - t_first)
                try:
                    a = await u.client.send(u.peer, {"c": cmid} if body is None else body,
                                            cmid=cmid)
                finally:
                    self._deadlines.discard(deadline)
        except SendTimeout as exc:
            u.attempts += exc.attempts
            u.errors["timeout"] += 1
            return None
        except TimeoutError:  # the hard deadline
            u.errors["deadline"] += 1
            return None
        except ServerError as exc:
            u.attempts += 1
            u.errors[exc.code] += 1
            return None
        except ClientStopped:
            return None
        t = time.perf_counter()
        u.attempts += a.attempts
        u.timeouts += a.timeouts
        if a.timeouts:
            u.errors["timeout"] += a.timeouts
        if a.refusals:
            u.errors["refused, retried"] += a.refusals
        ack = u.acked[cmid] = Ack(a.mid, u.gen, t)
        self.acks.append((t, t - t_first, u.home))
        return ack

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
        at = asyncio.get_running_loop().time() + drain_s
        for d in self._deadlines:
            d.reschedule(at)
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

    # -- the final check -------------------------------------------------------------
    async def sync(self, u: SoakUser, final: bool = False) -> None:
        """``GET /v1/sync`` from the user's cursor, every page (the client's node
        first, then the others); records every mid answered (``synced``, when
        ``final``) and what pushes missed. A 503 is retried."""
        if final:
            u.synced = set()
        since = u.cursor
        try:
            for _ in range(1000):
                page = await self._sync_page(u, since)
                if page is None:
                    u.errors["sync_failed"] += 1
                    return
                for m in page["msgs"]:
                    if u.synced is not None and final:
                        u.synced.add(m["mid"])
                    if m.get("to") == u.name and m["mid"] not in u.got:
                        u.got[m["mid"]] = Got(None, str(m.get("from")), "sync")
                moved, since = page["next"] > since, page["next"]
                if not page["more"] or not moved:
                    return
        except (OSError, TimeoutError, ValueError) as exc:
            self.sync_failures[type(exc).__name__] += 1
            u.errors["sync_failed"] += 1

    async def _sync_page(self, u: SoakUser, since: int) -> dict[str, Any] | None:
        for attempt in range(SYNC_RETRIES + 1):
            t = time.perf_counter()
            try:
                page: dict[str, Any] = await u.client.http(
                    "GET", "/v1/sync", params={"since": since, "limit": SYNC_LIMIT})
            except HttpError as exc:
                self.sync_failures[f"status {exc.status}"] += 1
                if exc.status != 503 or attempt == SYNC_RETRIES:
                    return None
                await asyncio.sleep(1.0)
                continue
            self.sync_page_s.append(time.perf_counter() - t)
            return page
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
            # msg frames pushed beyond the mids delivered by push (the client drops them)
            "duplicate_pushes": sum(max(0, u.msg_pushes - sum(
                1 for g in u.got.values() if g.how == "push")) for u in self.users),
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
        """Close every client, no reconnects; HTTP (``final_sync``) still works."""
        for t in self._pumps:
            t.cancel()
        await asyncio.gather(*(u.client.close() for u in self.users), return_exceptions=True)
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def close(self) -> None:
        await self.disconnect()  # closes the clients' HTTP connections too
