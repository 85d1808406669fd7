"""Presence events: ``presence.online`` when a user's first device connects on
any node, ``presence.offline`` once the last one has been gone for
``IM_PRESENCE_GRACE_S`` (a reconnect within it, on any node, makes neither).

Which node announces is settled in Redis (``store.presence_redis``): the node
whose ``SET NX`` creates the user's presence key announces online; a node
whose check finds no device on a live node deletes the key and announces
offline. Each node checks the users whose last local device left (one timer
loop, batched checks); the users of a node that died (its heartbeat lapsed
more than the grace ago) are checked by the survivors, who pop its set.
Nothing here is on a send's path or awaited by a connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping

from core.errors import Unavailable
from core.tasks import stop
from store.ports import PresenceStore, RouteStore

__all__ = ["PresenceQuery", "PresenceWatch"]

log = logging.getLogger("gateway.presence.watch")
CHUNK = 512  # users per Redis batch
RETRY_S = 1.0


class PresenceWatch:
    def __init__(self, node: str, store: PresenceStore,
                 announce: Callable[[str, bool, int], None], local: Callable[[str], int],
                 grace_s: float, *, enabled: bool = True,
                 observe: Callable[[int, float, float], None] | None = None) -> None:
        self.node = node
        self.observe = observe  # (users, 0, seconds) per arrival round trip
        self.store = store
        self.announce = announce  # (user, online, unix ms): events and watchers
        self.local = local  # this node's open connections of a user
        self.grace_s = grace_s
        self.enabled = enabled
        self._arrived: set[str] = set()
        self._due: dict[str, float] = {}  # user -> unix time to check (insertion = due order)
        self._live: dict[str, float] = {}  # node -> heartbeat expiry, from the last beat
        self._reaped: set[str] = set()
        self._orphans: list[str] = []  # taken from a dead node's set, check failed
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- from the registry (never await) -----------------------------------------
    def connected(self, user: str) -> None:
        if self.enabled:
            self._due.pop(user, None)
            self._arrived.add(user)
            self._wake.set()

    def last_left(self, user: str) -> None:
        """The user's last device on this node disconnected."""
        if self.enabled:
            self._due.pop(user, None)
            self._due[user] = time.time() + self.grace_s

    def beat(self, live: Mapping[str, float]) -> None:
        """Nodes' heartbeat expiries (every beat): dead ones are reaped."""
        self._live = dict(live)
        self._reaped &= set(live)
        if self.enabled and self._dead_to_reap(time.time()):
            self._wake.set()

    def _dead(self, now: float) -> list[str]:
        return [n for n, exp in self._live.items() if exp <= now and n != self.node]

    def _dead_to_reap(self, now: float) -> list[str]:
        return [n for n, exp in self._live.items()
                if exp < now - self.grace_s and n != self.node and n not in self._reaped]

    async def restore(self, users: list[str]) -> None:
        """Redis lost its data: the presence of this node's users again, unannounced."""
        if self.enabled:
            for i in range(0, len(users), CHUNK):
                await self.store.arrive(self.node, users[i:i + CHUNK], announce=False)

    # -- the loop ---------------------------------------------------------------------
    def start(self) -> None:
        if self.enabled:
            self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop(task)  # a cancel lost in redis-py's wait_for is asked again

    async def _run(self) -> None:
        while True:
            wait = min(self.grace_s, RETRY_S)
            if self._due:
                wait = max(0.0, min(wait, next(iter(self._due.values())) - time.time()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self._arrive()
                await self._check_due()
                await self._reap()
            except Unavailable as exc:
                log.warning("presence not checked (retried): %s", exc)
                await asyncio.sleep(RETRY_S)

    async def _arrive(self) -> None:
        while self._arrived:
            users = [self._arrived.pop() for _ in range(min(CHUNK, len(self._arrived)))]
            started = time.perf_counter()
            try:
                new = await self.store.arrive(self.node, users)
            except Unavailable:
                self._arrived.update(users)
                raise
            if self.observe is not None:
                self.observe(len(users), 0.0, time.perf_counter() - started)
            at = int(time.time() * 1000)
            for user in new:
                self.announce(user, True, at)

    async def _check_due(self) -> None:
        now = time.time()
        due: list[tuple[str, float]] = []
        for user, when in self._due.items():
            if when > now or len(due) >= CHUNK:
                break
            due.append((user, when))
        for user, _ in due:
            del self._due[user]
        gone = [(u, w) for u, w in due if self.local(u) == 0]
        if not gone:
            return
        try:
            ended = set(await self.store.depart([u for u, _ in gone], self._dead(now),
                                                node=self.node))
        except Unavailable:
            for user, when in gone:
                self._due.setdefault(user, when)
            raise
        for user, when in gone:
            if user in ended:
                self.announce(user, False, int((when - self.grace_s) * 1000))
        if self._due and next(iter(self._due.values())) <= now:
            self._wake.set()

    async def _reap(self) -> None:
        now = time.time()
        if self._orphans:
            users, self._orphans = self._orphans, []
            await self._end(users, now)
        for node in self._dead_to_reap(now):
            users = await self.store.take(node, CHUNK)
            if not users:
                self._reaped.add(node)
                continue
            log.info("presence of %d users of dead node %s checked", len(users), node)
            await self._end(users, now)
            self._wake.set()  # more may be left

    async def _end(self, users: list[str], now: float) -> None:
        try:
            ended = await self.store.depart(users, self._dead(now))
        except Unavailable:
            self._orphans.extend(users)
            raise
        at = int(now * 1000)
        for user in ended:
            self.announce(user, False, at)


class PresenceQuery:
    """Users' presence now: devices on live nodes (their routes) and last seen."""

    def __init__(self, routes: RouteStore,
                 live_routes: Callable[[Mapping[str, str], float], int]) -> None:
        self.routes = routes
        self.live_routes = live_routes

    async def devices(self, users: list[str]) -> list[tuple[int, int | None]]:
        """(devices connected to live nodes, unix s the last one left or None)."""
        now = time.time()
        routes, seen = await self.routes.lookup(users), await self.routes.last_seen(users)
        return [(self.live_routes(r, now), t)
                for r, t in zip(routes, seen, strict=True)]

    async def state(self, users: list[str]) -> dict[str, dict[str, object]]:
        """``{"online", "last_seen"}`` per user; ``last_seen`` (unix ms) is now while
        online, else when the last device left (kept 30 days), else None."""
        now_ms = int(time.time() * 1000)
        return {u: {"online": n > 0,
                    "last_seen": now_ms if n > 0 else (t * 1000 if t is not None else None)}
                for u, (n, t) in zip(users, await self.devices(users), strict=True)}
