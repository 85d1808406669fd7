"""Where users are connected: user -> {connection: node} in Redis (``RouteStore``).

A route is written when a device connects and removed when it disconnects.
A node that dies leaves its routes behind; readers ignore routes to nodes
whose heartbeat has lapsed and delete them as they meet them.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence

from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["RoutesRedis"]

SEEN_TTL_S = 30 * 86_400


class RoutesRedis:
    """Routes for one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys, route_ttl_s: int = 86_400) -> None:
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
        """Drop these routes and note when each user was last seen (same round trip)."""
        now = int(time.time())
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user, node, conn in routes:
                pipe.hdel(self.keys.routes(user), self.field(node, conn))
                pipe.set(self.keys.last_seen(user), now, ex=SEEN_TTL_S)
            await pipe.execute()

    async def last_seen(self, users: Sequence[str]) -> list[int | None]:
        """When each user's device last disconnected (unix s), if within 30 days."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.get(self.keys.last_seen(user))
            raw = await pipe.execute()
        return [int(v) if v is not None else None for v in raw]

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
