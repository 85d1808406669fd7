"""Dedup claims on (sender, cmid) in Redis (``DedupStore``).

MongoDB's unique (sender, cmid) index is the durable dedup; these keys make
the common case one ``SET NX GET`` per send, pipelined for a whole batch.
The values are ``core.dedup``'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from core import dedup
from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["DedupRedis"]


class DedupRedis:
    def __init__(self, redis: RedisClient, keys: Keys, pending_ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.pending_ttl_s = pending_ttl_s

    async def claim(self, claims: Sequence[tuple[str, str, int]]) -> list[str | None]:
        """For each (sender, cmid, new mid): None if new, else the stored value.

        The stored value is pending (a send in flight or failed: reuse its
        mid, the writes are idempotent) or acked (``core.dedup``).
        """
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for sender, cmid, mid in claims:
                pipe.set(self.keys.dedup(sender, cmid), dedup.pending(mid), nx=True, get=True,
                         ex=self.pending_ttl_s)
            raw = await pipe.execute()
        return [None if v is None else v.decode() for v in raw]
