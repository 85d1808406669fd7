"""Live-room online counts: each node reports its local member count per room.

``{ns}:ro:{room}`` is a hash of node name -> that node's connections in the
room, and ``u:`` + node name -> its distinct users there. A node writes only
its own fields, in batches; a reader sums the fields of nodes whose heartbeat is
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

__all__ = ["USERS", "Online", "RoomCountsRedis"]

USERS = "u:"  # field prefix of a node's distinct users
Online = tuple[int, int]  # (connections, users)


class RoomCountsRedis:
    """Per-room online counts across nodes, for one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys, ttl_s: int = 3600) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s

    async def report(self, node: str, counts: Mapping[str, Online]) -> dict[str, Online]:
        """Write ``node``'s (connections, users) per room (0 removes its fields)
        and read each room's totals across live nodes, in one round trip."""
        rooms = list(counts)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for room, (conns, users) in counts.items():
                key = self.keys.room_online(room)
                if conns > 0:
                    pipe.hset(key, mapping={node: conns, USERS + node: users})
                    pipe.expire(key, self.ttl_s)
                else:
                    pipe.hdel(key, node, USERS + node)
            for room in rooms:
                pipe.hgetall(self.keys.room_online(room))
            pipe.zrange(self.keys.nodes(), time.time(), "+inf", byscore=True)
            replies = await pipe.execute()
        return await self._totals(rooms, replies[-1 - len(rooms):-1], replies[-1], node)

    async def totals(self, rooms: Iterable[str]) -> dict[str, Online]:
        """Each room's (connections, users) across live nodes."""
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
                pipe.hdel(self.keys.room_online(room), node, USERS + node)
            await pipe.execute()

    async def _totals(self, rooms: list[str], hashes: list[dict[bytes, bytes]],
                      live_raw: list[bytes], me: str | None) -> dict[str, Online]:
        live = {n.decode() for n in live_raw}
        if me is not None:
            live.add(me)
        totals: dict[str, Online] = {}
        dead: dict[str, list[str]] = {}
        for room, fields in zip(rooms, hashes, strict=True):
            conns = users = 0
            for name, value in fields.items():
                field = name.decode()
                is_users = field.startswith(USERS)
                if (field[len(USERS):] if is_users else field) not in live:
                    dead.setdefault(room, []).append(field)
                elif is_users:
                    users += int(value)
                else:
                    conns += int(value)
            totals[room] = (conns, users)
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
