"""Announced presence (``PresenceStore``): who has had ``presence.online``
without a ``presence.offline`` since, kept so that events are announced once
across every node and never flap with a quick reconnect.

- ``ns:pr:{user}``: set NX when a device arrives (the NX winner announces
  online); deleted by ``presence_off.lua`` only if the user's routes hold no
  device on a live node (the deleter announces offline).
- ``ns:pon:{node}``: the users a node answers for. A node that dies leaves it
  behind; survivors pop it and check each user (``take``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from store.keys import Keys
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["PresenceRedis"]


class PresenceRedis:
    def __init__(self, redis: RedisClient, keys: Keys, ttl_s: int = 86_400) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s  # as the routes': a presence outlives no route
        self._off = Lua("presence_off.lua")

    async def arrive(self, node: str, users: Sequence[str], *, announce: bool = True
                     ) -> list[str]:
        """Devices of ``users`` arrived at ``node``: those whose presence is new
        (``announce=False``: restore the keys after Redis lost them, no news)."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.set(self.keys.presence(user), node, nx=announce, ex=self.ttl_s)
            if users:
                pipe.sadd(self.keys.node_users(node), *users)
            raw = await pipe.execute()
        return [u for u, new in zip(users, raw, strict=False) if new] if announce else []

    async def depart(self, users: Sequence[str], dead_nodes: Sequence[str], *,
                     node: str | None = None) -> list[str]:
        """Users gone from ``node`` (its set forgets them): those whose presence
        ended now, with no device left on a node other than ``dead_nodes``."""
        async with redis_guard():
            batch = Batch(self.redis)
            for user in users:
                batch.script(self._off, [self.keys.routes(user), self.keys.presence(user)],
                             list(dead_nodes))
            if node is not None and users:
                batch.pipe.srem(self.keys.node_users(node), *users)
            raw = await batch.execute()
        return [u for u, ended in zip(users, raw, strict=False) if ended == 1]

    async def take(self, node: str, n: int) -> list[str]:
        """Up to ``n`` users of a dead node's set, each taken by one survivor only."""
        async with redis_guard():
            raw: Any = await self.redis.spop(self.keys.node_users(node), n)  # type: ignore[misc]
        return sorted(v.decode() for v in raw or ())
