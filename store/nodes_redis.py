"""Node identity and liveness in Redis: the lease on a node number
(``NodeLease``) and the heartbeats of live nodes (``NodeDirectory``).

A node leases a numeric id (0..255, the node bits of every mid it issues)
with ``SET NX EX`` and renews it with its heartbeat; while the lease lives
no other node can take the number, so mids stay unique without manual care.
"""

from __future__ import annotations

import secrets
import time

import redis.asyncio as aioredis

from core.ids import MAX_NODE_ID
from store.errors import Unavailable
from store.keys import Keys
from store.redis_client import redis_guard

__all__ = ["NodeDirectoryRedis", "NodeLeaseRedis"]

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
end
return redis.error_reply('lease lost')
"""


class NodeLeaseRedis:
    """The numeric id a node holds, kept alive by ``renew``."""

    def __init__(self, redis: aioredis.Redis, keys: Keys, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.ttl_s = ttl_s
        self.token = secrets.token_hex(8)
        self.number = -1
        self._renew = redis.register_script(_RENEW)

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

    async def renew(self) -> bool:
        """Extend the lease. Returns True if it had vanished (Redis lost its
        data) and was taken again; raises if another node holds it now."""
        async with redis_guard():
            try:
                await self._renew(keys=[self.keys.node_lease(self.number)],
                                  args=[self.token, self.ttl_s])
                return False
            except aioredis.ResponseError:
                if not await self.redis.set(self.keys.node_lease(self.number), self.token,
                                            nx=True, ex=self.ttl_s):
                    raise Unavailable("redis", "node id lease taken by another node") from None
                return True

    async def release(self) -> None:
        async with redis_guard():
            if await self.redis.get(self.keys.node_lease(self.number)) == self.token.encode():
                await self.redis.delete(self.keys.node_lease(self.number))


class NodeDirectoryRedis:
    """Heartbeats: ``ns:nodes`` zset of node name -> heartbeat expiry."""

    def __init__(self, redis: aioredis.Redis, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

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
