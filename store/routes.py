"""Where users are connected: user -> {connection: node} in Redis, plus the
set of live nodes (heartbeats).

A route is written when a device connects and removed when it disconnects.
A node that dies leaves its routes behind; readers ignore routes to nodes
whose heartbeat has lapsed and delete them as they meet them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

import redis.asyncio as aioredis

from store.keys import Keys
from store.redis_client import redis_guard

__all__ = ["RouteStore"]


class RouteStore:
    """Routes and node liveness for one namespace."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, route_ttl_s: int = 86_400) -> None:
        self.redis = redis
        self.keys = keys
        self.route_ttl_s = route_ttl_s

    @staticmethod
    def field(node: str, conn: int) -> str:
        return f"{node}/{conn}"

    async def add(self, routes: Sequence[tuple[str, str, int]]) -> None:
        """Write (user, node, conn) routes in one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user, node, conn in routes:
                key = self.keys.routes(user)
                pipe.hset(key, self.field(node, conn), node)
                pipe.expire(key, self.route_ttl_s)
            await pipe.execute()

    async def remove(self, routes: Sequence[tuple[str, str, int]]) -> None:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user, node, conn in routes:
                pipe.hdel(self.keys.routes(user), self.field(node, conn))
            await pipe.execute()

    async def lookup(self, users: Sequence[str]) -> list[dict[str, str]]:
        """Each user's routes (connection -> node), one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.hgetall(self.keys.routes(user))
            raw = await pipe.execute()
        return [{f.decode(): n.decode() for f, n in r.items()} for r in raw]

    async def purge_many(self, dead: Mapping[str, Iterable[str]]) -> None:
        """Drop routes to dead nodes met while looking users up (one pipeline)."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user, fields in dead.items():
                names = list(fields)
                if names:
                    pipe.hdel(self.keys.routes(user), *names)
            await pipe.execute()

    # -- node liveness -------------------------------------------------------
    async def heartbeat(self, node: str, ttl_s: float) -> dict[str, float]:
        """Announce ``node`` alive until now + ttl; return the heartbeat expiry of
        every node seen in the last hour (an expiry in the past: known dead)."""
        now = time.time()
        key = self.keys.nodes()
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.zadd(key, {node: now + ttl_s})
            pipe.zremrangebyscore(key, "-inf", now - 3600)  # forget the long dead
            pipe.zrange(key, 0, -1, withscores=True)
            *_, live = await pipe.execute()
        return {name.decode(): float(expiry) for name, expiry in live}

    async def leave(self, node: str) -> None:
        async with redis_guard():
            await self.redis.zrem(self.keys.nodes(), node)
