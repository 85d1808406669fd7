"""Per-user quotas over fixed windows, shared by every node (``QuotaStore``):
one INCR (and, for the first of a window, its EXPIRE) in one round trip.

A fixed window lets through at most twice the limit across a window edge;
that is the price of one key and one command per call.
"""

from __future__ import annotations

import time

from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["QuotasRedis"]


class QuotasRedis:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys

    async def take(self, user: str, what: str, limit: int, window_s: int) -> bool:
        """Count one ``what`` of ``user`` in the current window; False when the
        window already held ``limit`` (refused attempts count too: hammering
        a quota does not reopen it)."""
        window = int(time.time()) // window_s
        key = self.keys.quota(user, what, window)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, window_s + 1)
            n, _ = await pipe.execute()
        return int(n) <= limit
