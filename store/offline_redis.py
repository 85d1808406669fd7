"""Per-user state in Redis: offline store, unread, conversations (``OfflineStore``).

Every multi-key change is one Lua script over keys of one user (one hash
tag), so it is atomic and Redis Cluster friendly. Batched entry points take
many messages and make one round trip for all of them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from core.ids import mid_for_time_ms
from store.errors import Unavailable
from store.keys import Keys
from store.records import ConversationRow, Delivery, Erasure, InboxLimits, OfflinePage
from store.redis_client import Batch, Lua, RedisClient, cluster_state, redis_guard

__all__ = ["OfflineRedis"]


class OfflineRedis:
    """Redis side of chat state for one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys, limits: InboxLimits) -> None:
        self.redis = redis
        self.keys = keys
        self.limits = limits
        self._deliver = Lua("deliver.lua")
        self._read = Lua("read.lua")
        self._ack = Lua("offline_ack.lua")
        self._page = Lua("offline_page.lua")
        self._convs = Lua("conversations.lua")
        self._erase = Lua("erase.lua")

    # -- delivery ------------------------------------------------------------
    async def deliver(
        self, deliveries: Sequence[Delivery], acked: Sequence[tuple[str, str, str]],
        *, routes: bool = True,
    ) -> list[dict[str, str]]:
        """Record every delivery, set every (sender, cmid) dedup value, and read
        each owner's routes (connection -> node) for the push that follows.

        One round trip for all of it. Returns the routes, one dict per delivery.
        """
        lim = self.limits
        oldest = mid_for_time_ms(int(time.time() * 1000) - lim.offline_ttl_s * 1000)
        async with redis_guard():
            batch = Batch(self.redis)
            pipe = batch.pipe
            for d in deliveries:
                k = self.keys
                batch.script(
                    self._deliver,
                    keys=[
                        k.offline(d.owner), k.offline_meta(d.owner), k.unread(d.owner),
                        k.unread_mids(d.owner, d.conv), k.convs(d.owner), k.conv_last(d.owner),
                    ],
                    args=[
                        d.mid, d.frame, d.conv, "1" if d.unread else "0", lim.offline_max,
                        oldest, lim.unread_cap, lim.convs_max, lim.offline_ttl_s,
                        "1" if d.conv_list else "0", d.preview,
                    ],
                )
            for sender, cmid, value in acked:
                pipe.set(self.keys.dedup(sender, cmid), value, ex=lim.dedup_ttl_s)
            if routes:
                for d in deliveries:
                    pipe.hgetall(self.keys.routes(d.owner))
            results = await batch.execute()
        found = results[len(deliveries) + len(acked):]
        return [{f.decode(): n.decode() for f, n in r.items()} for r in found]

    # -- reading -------------------------------------------------------------
    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        async with redis_guard():
            count = await self._read(
                self.redis, keys=[self.keys.unread(user), self.keys.unread_mids(user, conv)],
                args=[conv, mid],
            )
        return int(count)

    async def erase(self, erasures: Sequence[Erasure]) -> None:
        """Recalls and deletions, each atomic for its user, one round trip."""
        k = self.keys
        async with redis_guard():
            batch = Batch(self.redis)
            for e in erasures:
                batch.script(self._erase, [k.offline(e.user), k.convs(e.user),
                                           k.conv_last(e.user), k.unread(e.user),
                                           k.unread_mids(e.user, e.conv)],
                             [e.mid, e.conv, "recall" if e.recall else "forget", e.frame,
                              e.frame_mid])
            await batch.execute()

    async def ack(self, user: str, *, mids: Sequence[int] = (), upto: int = -1) -> None:
        args: list[Any] = ["upto", upto] if upto >= 0 else ["mids", *mids]
        async with redis_guard():
            k = self.keys
            await self._ack(self.redis, [k.offline(user), k.offline_meta(user)], args)

    async def page(self, user: str, since: int, count: int) -> OfflinePage:
        async with redis_guard():
            raw = await self._page(
                self.redis, [self.keys.offline(user), self.keys.offline_meta(user)], [since, count]
            )
        floor = raw[0]
        if floor is None or floor is False or int(floor) > since:
            return OfflinePage(False, [])
        rows = [(int(float(raw[i + 1])), raw[i]) for i in range(1, len(raw), 2)]
        return OfflinePage(True, rows)

    async def recent(self, users: Sequence[str], since: int, count: int) -> list[list[bytes]]:
        """Each user's offline entries after ``since`` (oldest first), one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.zrangebyscore(self.keys.offline(user), f"({since}", "+inf", 0, count)
            return list(await pipe.execute())

    async def conversations(self, user: str, count: int, upto: int | None = None
                            ) -> tuple[int, list[ConversationRow]]:
        """(total unread, the ``count`` newest conversations whose last mid is at
        most ``upto``)."""
        k = self.keys
        async with redis_guard():
            raw = await self._convs(
                self.redis, keys=[k.convs(user), k.conv_last(user), k.unread(user)],
                args=[count, "+inf" if upto is None else upto])
        rows = [
            ConversationRow(raw[i].decode(), int(float(raw[i + 1])), int(raw[i + 2]),
                            raw[i + 3] or None)
            for i in range(1, len(raw), 4)
        ]
        return int(raw[0]), rows

    async def ping(self) -> None:
        """Redis answers; a Redis Cluster answers on every primary and each
        says ``cluster_state:ok``."""
        async with redis_guard():
            state = await cluster_state(self.redis)
            if state == "single" and not await self.redis.ping():
                raise Unavailable("redis", "no PONG")
        if state == "fail":
            raise Unavailable("redis", "cluster_state:fail")
