"""Node identity and liveness in Redis: the lease on a node number
(``NodeLease``) and the heartbeats of live nodes (``NodeDirectory``).

A node leases a numeric id (0..255, the node bits of every mid it issues)
with ``SET NX EX``; ``keeper_redis.py`` renews it with the heartbeat; while
the lease lives no other node can take the number, so mids stay unique
without manual care.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence

from core.ids import MAX_NODE_ID
from store.errors import Unavailable
from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["NodeDirectoryRedis", "NodeLeaseRedis"]

class NodeLeaseRedis:
    """The numeric id a node holds (kept alive by ``keeper_redis.LeaseKeeperRedis``)."""

    def __init__(self, redis: RedisClient, keys: Keys, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self.token = secrets.token_hex(8)
        self.number = -1

    async def acquire(self, wanted: int = -1) -> int:
        """Take ``wanted`` (0..255), or the first free number when it is -1."""
        candidates = [wanted] if wanted >= 0 else list(range(MAX_NODE_ID + 1))
        async with redis_guard():
            for n in candidates:
                if await self.redis.set(self.keys.node_lease(n), self.token, nx=True,
                                        ex=self.ttl_s):
                    self.number = n
                    return n
        if wanted >= 0:
            raise Unavailable("redis", f"node id {wanted} is held by another live node")
        raise Unavailable("redis", "all 256 node ids are leased")

    async def release(self) -> None:
        async with redis_guard():
            if await self.redis.get(self.keys.node_lease(self.number)) == self.token.encode():
                await self.redis.delete(self.keys.node_lease(self.number))


LIVE = "+live"  # the member of a node's live mark in ``Keys.inflight``


def live_member(node: str) -> str:
    return node + LIVE


class NodeDirectoryRedis:
    """Heartbeats: ``ns:nodes`` zset of node name -> heartbeat expiry."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def leave(self, node: str) -> None:
        """A drain: the node's heartbeat ends now, so the others know it dead at
        once (they stop routing to it, and check its users' presence after the
        grace) instead of when its heartbeat would have lapsed."""
        async with redis_guard():
            await self.redis.zadd(self.keys.nodes(), {node: time.time()})
            await self.redis.zrem(self.keys.inflight(), node, live_member(node))

    async def share_inflight(self, node: str, oldest: int | None,
                             forget: Sequence[str] = (), live: int | None = None
                             ) -> tuple[dict[str, int], dict[str, int]]:
        """Publish this node's oldest mid that may still land and its oldest of
        sends under way (``live``; None: none), drop the entries of ``forget``
        (dead nodes), and read every node's: (oldest marks, live marks), one
        round trip. Both in one sorted set: a live mark's member is the node's
        name and ``LIVE`` (nodes that do not share one are left out of the
        second map)."""
        key = self.keys.inflight()
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            if oldest is None:
                pipe.zrem(key, node)
            else:
                pipe.zadd(key, {node: oldest})
            if live is None:
                pipe.zrem(key, live_member(node))
            else:
                pipe.zadd(key, {live_member(node): live})
            if forget:
                pipe.zrem(key, *forget, *map(live_member, forget))
            pipe.zrange(key, 0, -1, withscores=True)
            *_, marks = await pipe.execute()
        oldest_marks: dict[str, int] = {}
        live_marks: dict[str, int] = {}
        for member, score in marks:
            name = member.decode()
            if name.endswith(LIVE):
                live_marks[name.removesuffix(LIVE)] = int(score)
            else:
                oldest_marks[name] = int(score)
        return oldest_marks, live_marks

    async def claim_dead(self, dead: str, node: str, ttl_s: float) -> bool:
        """``SET NX GET PX`` (one round trip): one live node at a time reads a
        dead node's sends back; the claim is this node's if it was free or its own."""
        key = self.keys.dead_sends_claim(dead)
        async with redis_guard():
            held = await self.redis.set(key, node, nx=True, get=True,
                                        px=max(1, int(ttl_s * 1000)))
        return held is None or held == node.encode()

    async def release_dead(self, dead: str, node: str) -> None:
        key = self.keys.dead_sends_claim(dead)
        async with redis_guard():
            if await self.redis.get(key) == node.encode():
                await self.redis.delete(key)

    async def forget_marks(self, nodes: Sequence[str]) -> None:
        if nodes:
            async with redis_guard():
                await self.redis.zrem(self.keys.inflight(), *nodes, *map(live_member, nodes))
