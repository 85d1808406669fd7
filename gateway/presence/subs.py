"""Presence subscriptions (``presence_sub`` / ``presence_unsub``): which local
devices watch which users, the broker bindings that bring those users'
changes here, and the cap on how many users one user watches.

Broker cost is bounded per node: a change is published to its user's
presence shard (``router.routing.presence_key``), and a node binds a shard's
key once while any of its devices watches a user of that shard
(``core.watches.ShardRefs``), so it holds at most ``PRESENCE_SHARDS``
presence bindings whatever the number of watches. What arrives for a user
nobody here watches is dropped (``deliver_presence`` finds no watcher).
Unbinding is lazy (``Bindings``), so watch churn is not broker churn.

The cap (``IM_PRESENCE_SUBS_MAX``) is per user, across its connections and
nodes: the users it watches are counted in Redis (``WatchStore``), each once
however many of its connections watch it. This node tells the count only
when a (watcher, watched) pair appears or disappears here
(``core.watches.HeldWatches``); the writes of one watcher are serialized
here, so an unsubscribe and a subscribe of the same user never cross. Its
entries there are renewed every third of their lease; entries found gone
(lapsed, or lost by Redis) are written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from core.errors import Unavailable
from core.tasks import stop
from core.watches import HeldWatches, ShardRefs
from gateway.bindings import Bindings
from gateway.errors import ProtocolError
from gateway.hub import Client, ConnectionIndex, Hub
from router.routing import presence_shard, presence_shard_key
from store.ports import WatchStore

__all__ = ["PresenceSubs"]

log = logging.getLogger("gateway.presence.subs")
CHUNK = 512  # watchers per renewal batch
RETRY_S = 1.0


class PresenceSubs:
    def __init__(self, hub: Hub, bindings: Bindings, store: WatchStore, node: str,
                 max_per_user: int, *, dead_nodes: Callable[[], list[str]] = list,
                 refused: Callable[[str], None] = lambda _cap: None) -> None:
        self.hub = hub
        self.bindings = bindings
        self.store = store
        self.node = node
        self.max_per_user = max_per_user
        self.dead_nodes = dead_nodes  # nodes whose heartbeat lapsed (their entries go)
        self.refused = refused  # im_limit_refusals_total{limit}
        self.watchers: ConnectionIndex[str] = ConnectionIndex("watching")
        self.shards = ShardRefs(presence_shard)
        self.held = HeldWatches()
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  # watcher -> (lock, users)
        self._released: dict[str, set[str]] = {}  # watcher -> pairs to take out of the count
        self._counts: dict[str, int] = {}  # watcher -> its count as last read here
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- subscriptions --------------------------------------------------------------
    async def precheck(self, client: Client, users: Sequence[str], rid: object = None) -> None:
        """``forbidden`` at once, before any other work, when ``client``'s user
        already watches as many users as the cap and asks for one more. Only an
        answer of the store refuses; the count last read here only tells when
        to ask (one cheap read per call while at the cap)."""
        if self._counts.get(client.user, 0) < self.max_per_user:
            return
        have = client.watching or set()
        if not self.held.missing(client.user, [u for u in users if u not in have]):
            return
        count = self._counts[client.user] = await self.store.count(client.user,
                                                                   self.dead_nodes())
        if count >= self.max_per_user:
            self._refuse(rid)

    def _refuse(self, rid: object) -> None:
        self.refused("presence_subs")
        raise ProtocolError("forbidden", f"a user watches at most {self.max_per_user} users "
                            "(IM_PRESENCE_SUBS_MAX), across all its connections", rid)

    async def watch(self, client: Client, users: Sequence[str], rid: object = None) -> None:
        """``client`` watches ``users`` from now on (bound before this returns);
        ``forbidden`` if its user would watch more than the cap."""
        have = client.watching or set()
        new = [u for u in dict.fromkeys(users) if u not in have]
        if not new:
            return
        async with self._lock(client.user):
            await self._uncount(client.user)  # an unsubscribe just before frees its slots
            count = self.held.missing(client.user, new)
            if count:
                ok, n = await self.store.add(client.user, self.node, count,
                                             self.max_per_user, self.dead_nodes())
                self._counts[client.user] = n
                if not ok:
                    self._refuse(rid)
            if not self._open(client):  # closed meanwhile: nothing of it stays
                self._release(client.user, count)
                return
            have = client.watching or set()
            new = [u for u in new if u not in have]  # (a concurrent sub of the same)
            self.held.hold(client.user, new)
            for user in new:
                if self.watchers.add(user, client):
                    self.shards.add(user)
        shards = {presence_shard(u) for u in new}
        await asyncio.gather(*(self.bindings.ensure(presence_shard_key(s)) for s in shards))
        now = time.monotonic()
        for shard in shards:  # emptied while it was being bound
            if shard not in self.shards:
                self.bindings.idle(presence_shard_key(shard), now)

    async def unwatch(self, client: Client, users: Sequence[str]) -> None:
        """``client`` watches ``users`` no more: at once here, and out of its
        user's count before this returns (if Redis answers; else soon after)."""
        have = client.watching
        if not have:
            return
        gone = [u for u in dict.fromkeys(users) if u in have]
        for user in gone:
            if self.watchers.remove(user, client):
                self._unbound(user)
        self._release(client.user, self.held.release(client.user, gone))
        with contextlib.suppress(Unavailable):  # left to the loop
            async with self._lock(client.user):
                await self._uncount(client.user)

    def disconnected(self, client: Client) -> None:
        left, emptied = self.watchers.remove_all(client)
        for user in emptied:
            self._unbound(user)
        if left:
            self._release(client.user, self.held.release(client.user, left))

    def watching(self, users: Sequence[str]) -> dict[str, set[str]]:
        """watcher -> those of ``users`` it watches from a connection here."""
        out: dict[str, set[str]] = {}
        for user in users:
            for c in (self.watchers.get(user) or {}).values():
                out.setdefault(c.user, set()).add(user)
        return out

    async def drop(self, watcher: str, users: Sequence[str]) -> None:
        """No connection of ``watcher`` here watches ``users`` any more."""
        for c in list(self.hub.users.get(watcher, {}).values()):
            if c.watching and (mine := [u for u in users if u in c.watching]):
                await self.unwatch(c, mine)

    def deliver_presence(self, user: str, frame: bytes) -> int:
        devices = self.watchers.get(user)
        return self.hub.write_each(devices.values(), frame, None) if devices else 0

    def shard_keys(self) -> list[str]:
        """The presence keys this node's devices need bound now."""
        return [presence_shard_key(s) for s in self.shards]

    def _unbound(self, user: str) -> None:
        """``user`` has no local watcher left."""
        shard = self.shards.remove(user)
        if shard is not None:
            self.bindings.idle(presence_shard_key(shard), time.monotonic())

    def _open(self, client: Client) -> bool:
        return self.hub.users.get(client.user, {}).get(client.id) is client

    # -- the count in Redis ------------------------------------------------------------
    def _release(self, watcher: str, users: Sequence[str]) -> None:
        """Pairs no local connection holds any more: out of the count, soon."""
        if users:
            self._released.setdefault(watcher, set()).update(users)
            self._wake.set()

    @contextlib.asynccontextmanager
    async def _lock(self, watcher: str) -> AsyncIterator[None]:
        lock, n = self._locks.get(watcher) or (asyncio.Lock(), 0)
        self._locks[watcher] = (lock, n + 1)
        try:
            async with lock:
                yield
        finally:
            lock, n = self._locks[watcher]
            if n == 1:
                del self._locks[watcher]
            else:
                self._locks[watcher] = (lock, n - 1)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self, flush_s: float = 2.0) -> None:
        """Stop; the pairs released by closed connections out of the count first
        (within ``flush_s``; else they lapse with the node's lease, or go at
        once where the node is known dead)."""
        task, self._task = self._task, None
        await stop(task)
        with contextlib.suppress(Unavailable, TimeoutError):
            async with asyncio.timeout(flush_s):
                await self.flush()

    async def _run(self) -> None:
        renew_every = self.store.lease_s / 3
        renewed = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, renewed + renew_every - time.monotonic())):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
                if time.monotonic() - renewed >= renew_every:
                    await self.renew()
                    renewed = time.monotonic()
            except Unavailable as exc:
                log.warning("presence watch counts not written (retried): %s", exc)
                await asyncio.sleep(RETRY_S)
                self._wake.set()

    async def flush(self) -> None:
        """Take every released pair out of the count."""
        while self._released:
            watcher = next(iter(self._released))
            async with self._lock(watcher):
                await self._uncount(watcher)

    async def _uncount(self, watcher: str) -> None:
        """The pairs ``watcher`` released here out of the count (a pair held
        again meanwhile stays); under the watcher's lock."""
        users = self._released.pop(watcher, None)
        gone = [u for u in users or () if not self.held.holds(watcher, u)]
        if not gone:
            return
        try:
            n = await self.store.remove(watcher, self.node, gone)
            if self.held.held(watcher):
                self._counts[watcher] = n
            else:
                self._counts.pop(watcher, None)
        except Unavailable:
            self._released.setdefault(watcher, set()).update(gone)
            self._wake.set()
            raise

    async def renew(self) -> None:
        """Keep this node's entries alive; write again those found gone."""
        watchers = self.held.watchers()
        for i in range(0, len(watchers), CHUNK):
            for watcher in await self.store.renew(self.node, watchers[i:i + CHUNK]):
                async with self._lock(watcher):
                    if held := self.held.held(watcher):
                        await self.store.restore(watcher, self.node, held)
