"""Post counters in Redis (``CounterStore``): reposts, comments and
likes move here and are flushed to MongoDB in the background; a hash that lost
its state merges MongoDB's flushed values back in (``counter_merge.lua``), so
no change is lost or counted twice.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from store.keys import COUNTER_SHARDS, Keys
from store.redis_client import Batch, Lua, RedisClient, redis_guard, spop_spread

__all__ = ["COUNT_FIELDS", "CountersRedis"]

COUNT_FIELDS = {"r": "reposts", "c": "comments", "l": "likes"}
# A post's counter hash expires this long after its last change or read. The
# background flush writes changes to MongoDB within seconds, so what expires is
# flushed; a post read again merges MongoDB's counts back in.
COUNTS_TTL_S = 7 * 86_400
# A like's +1 and -1 marks (``like_once.lua``) outlive any retry of the call
# that made them; a like row says it is counted long before they expire.
LIKE_MARK_TTL_S = 3_600


class CountersRedis:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._count = Lua("counter.lua")
        self._merge = Lua("counter_merge.lua")
        self._like = Lua("like_once.lua")

    async def bump(self, post: int, field: str, delta: int = 1) -> None:
        async with redis_guard():
            await self._count(self.redis, [self.keys.post_counts(post),
                                           self.keys.dirty_counts(post % COUNTER_SHARDS)],
                              [field, delta, post, COUNTS_TTL_S])

    async def like_once(self, post: int, user: str, token: str, counted: bool) -> int:
        return await self._like_move(post, user, token, 1, counted)

    async def unlike_once(self, post: int, user: str, token: str, counted: bool) -> bool:
        return await self._like_move(post, user, token, -1, counted) == 1

    async def _like_move(self, post: int, user: str, token: str, delta: int,
                         counted: bool) -> int:
        k = self.keys
        async with redis_guard():
            return int(await self._like(
                self.redis,
                [k.post_counts(post), k.dirty_counts(post % COUNTER_SHARDS),
                 k.like_mark(post, user, token, "+"), k.like_mark(post, user, token, "-")],
                [delta, post, COUNTS_TTL_S, LIKE_MARK_TTL_S, int(counted)]))

    async def counts(self, docs: Sequence[dict[str, Any]]) -> dict[int, dict[str, int]]:
        """Counts of these posts (documents as read from MongoDB), one round trip;
        a hash that lost its merged state gets MongoDB's flushed counts added."""
        async with redis_guard():
            batch = Batch(self.redis)
            for d in docs:
                c = d.get("counts") or {}
                batch.script(self._merge, keys=[self.keys.post_counts(d["_id"])],
                             args=[c.get("reposts", 0), c.get("comments", 0),
                                   c.get("likes", 0), COUNTS_TTL_S])
            raw = await batch.execute()
        return {d["_id"]: {name: int(v or 0) for name, v in
                           zip(COUNT_FIELDS.values(), r, strict=True)}
                for d, r in zip(docs, raw, strict=True)}

    async def dirty(self, n: int) -> tuple[dict[int, dict[str, int]], list[int]]:
        """Take up to about ``n`` changed counters to flush, from every shard:
        (merged counts, ids whose hash still needs MongoDB's values merged in first)."""
        shards = [self.keys.dirty_counts(sh) for sh in range(COUNTER_SHARDS)]
        async with redis_guard():
            ids = [int(x) for x in await spop_spread(self.redis, shards, n)]
            if not ids:
                return {}, []
            pipe = self.redis.pipeline(transaction=False)
            for p in ids:
                pipe.hgetall(self.keys.post_counts(p))
            raw = await pipe.execute()
        out: dict[int, dict[str, int]] = {}
        unmerged: list[int] = []
        for p, h in zip(ids, raw, strict=True):
            if h.get(b"ok") == b"1":
                out[p] = {name: int(h.get(f.encode(), 0)) for f, name in COUNT_FIELDS.items()}
            else:
                unmerged.append(p)
        return out, unmerged

    async def redirty(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if ids:
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                for p in ids:
                    pipe.sadd(self.keys.dirty_counts(p % COUNTER_SHARDS), p)
                await pipe.execute()
