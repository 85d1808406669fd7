"""Live-room online counts: each node reports its local member count per room.

``{ns}:ro:{room}`` is a hash of node name -> count. A node writes only its
own field, in batches; a reader sums the fields of nodes whose heartbeat is
current (the ``nodes`` zset), so a dead node's members drop out of the total
when its heartbeat lapses, with no broadcast to anyone. Fields of dead nodes
are deleted by the reader that meets them; every key expires unless a node
keeps reporting it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping

from store.errors import Unavailable
from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["RoomCountsRedis"]


class RoomCountsRedis:
    """Per-room online counts across nodes, for one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys, ttl_s: int = 3600) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s

    async def report(self, node: str, counts: Mapping[str, int]) -> dict[str, int]:
        """Write ``node``'s counts (0 removes its field) and read each room's total
        across live nodes, in one round trip."""
        rooms = list(counts)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for room, n in counts.items():
                key = self.keys.room_online(room)
                if n > 0:
                    pipe.hset(key, node, n)
                    pipe.expire(key, self.ttl_s)
                else:
                    pipe.hdel(key, node)
            for room in rooms:
                pipe.hgetall(self.keys.room_online(room))
            pipe.zrange(self.keys.nodes(), time.time(), "+inf", byscore=True)
            replies = await pipe.execute()
        return await self._totals(rooms, replies[-1 - len(rooms):-1], replies[-1], node)

    async def totals(self, rooms: Iterable[str]) -> dict[str, int]:
        """Each room's member count across live nodes."""
        rooms = list(rooms)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for room in rooms:
                pipe.hgetall(self.keys.room_online(room))
            pipe.zrange(self.keys.nodes(), time.time(), "+inf", byscore=True)
            replies = await pipe.execute()
        return await self._totals(rooms, replies[:-1], replies[-1], None)

    async def forget_node(self, node: str, rooms: Iterable[str]) -> None:
        """Remove ``node``'s fields (a drain): its members are gone at once."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for room in rooms:
                pipe.hdel(self.keys.room_online(room), node)
            await pipe.execute()

    async def _totals(self, rooms: list[str], hashes: list[dict[bytes, bytes]],
                      live_raw: list[bytes], me: str | None) -> dict[str, int]:
        live = {n.decode() for n in live_raw}
        if me is not None:
            live.add(me)
        totals: dict[str, int] = {}
        dead: dict[str, list[str]] = {}
        for room, fields in zip(rooms, hashes, strict=True):
            total = 0
            for name, value in fields.items():
                node = name.decode()
                if node in live:
                    total += int(value)
                else:
                    dead.setdefault(room, []).append(node)
            totals[room] = total
        if dead:
            await self._drop_dead(dead)
        return totals

    async def _drop_dead(self, dead: Mapping[str, list[str]]) -> None:
        """Fields of nodes with no current heartbeat (dead, drained, or not yet
        announced: a live node rewrites its own within its report interval)."""
        with contextlib.suppress(Unavailable):  # best effort: the next reader retries
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                for room, nodes in dead.items():
                    pipe.hdel(self.keys.room_online(room), *nodes)
                await pipe.execute()
