"""Reaction counts in Redis, sharded so that a popular message is no hot key.

A message's reactions are split over ``shards`` pairs of keys by the
reacting user (a stable hash of its id): a counts hash (emoji -> count, and
``~`` once built) and a set of ``user|emoji``. Each pair has a hash tag of
its own (``{rx:MID:SHARD}``), so on a Redis Cluster the reactions of one
message spread over the masters and no single key takes every node's
writes. A reaction costs one insert or delete in MongoDB (the truth, by
``_id``) and one script on one shard (``reaction.lua``): O(1) whatever the
conversation's size. Reading a message's counts reads its shards' small
hashes; all of a message's shards are built together, at its first reaction
or when any of them is missing (expired, or lost with a Redis master), from
MongoDB (``reaction_build.lua``).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from store.keys import Keys
from store.reactions_mongo import ReactionsMongo
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["REACTION_TTL_S", "ReactionsRedis"]

# The keys outlive every copy of the message a sync can read from Redis (the
# offline stores keep 7 days); missing keys are rebuilt from MongoDB.
REACTION_TTL_S = 30 * 86_400
BUILT = b"~"
FIELD = "e:"  # a count's field: "e:" + emoji (no emoji can clash with "~")


def shard_of(user: str, shards: int) -> int:
    return zlib.crc32(user.encode()) % shards


class ReactionsRedis:
    """``ReactionStore``: counts in Redis, who reacted in MongoDB."""

    def __init__(self, redis: RedisClient, keys: Keys, source: ReactionsMongo,
                 shards: int = 4) -> None:
        self.redis = redis
        self.keys = keys
        self.source = source
        self.shards = max(1, shards)
        self._apply = Lua("reaction.lua")
        self._build = Lua("reaction_build.lua")

    def _pair(self, mid: int, shard: int) -> list[str]:
        return [self.keys.reaction_counts(mid, shard), self.keys.reaction_users(mid, shard)]

    async def apply(self, mid: int, user: str, emoji: str, on: bool, at_ms: int
                  ) -> tuple[bool, bool]:
        """(changed, built): MongoDB first (the truth), then the user's shard; ``built``: the
        message's shards were built now (its first reaction, or after a loss)."""
        stored = await self.source.set(mid, user, emoji, on, at_ms)
        keys = self._pair(mid, shard_of(user, self.shards))
        args = [f"{user}|{emoji}", FIELD + emoji, "1" if on else "0", REACTION_TTL_S]
        async with redis_guard():
            changed = int(await self._apply(self.redis, keys, args))
        built = False
        if changed < 0:
            await self._build_all(mid)
            built = True
            async with redis_guard():
                changed = int(await self._apply(self.redis, keys, args))
        # Changed in MongoDB (a build then counted it already), or only now in
        # Redis (a retry of a call whose Redis step failed): either is a change.
        return stored or changed > 0, built

    async def counts(self, mids: Sequence[int], reacted: Mapping[int, bool] | None = None
                     ) -> dict[int, dict[str, int]]:
        """Each message's counts (those with none left out). A message with some
        shards missing is rebuilt; one with none is taken to have no
        reactions unless ``reacted`` (MongoDB's flag) says it has had some."""
        if not mids:
            return {}
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for mid in mids:
                for s in range(self.shards):
                    pipe.hgetall(self.keys.reaction_counts(mid, s))
            raw: list[dict[bytes, bytes]] = await pipe.execute()
        out: dict[int, dict[str, int]] = {}
        rebuild: list[int] = []
        for i, mid in enumerate(mids):
            hashes = raw[i * self.shards:(i + 1) * self.shards]
            built = sum(1 for h in hashes if BUILT in h)
            if built < self.shards and (built or (reacted or {}).get(mid)):
                rebuild.append(mid)
                continue
            total = _sum(hashes)
            if total:
                out[mid] = total
        for mid in rebuild:
            await self._build_all(mid)
            total = await self._read(mid)
            if total:
                out[mid] = total
        return out

    async def _read(self, mid: int) -> dict[str, int]:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for s in range(self.shards):
                pipe.hgetall(self.keys.reaction_counts(mid, s))
            return _sum(await pipe.execute())

    async def tally(self, mids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Counts read from MongoDB alone (Redis is down): one read per message."""
        out: dict[int, dict[str, int]] = {}
        for mid in mids:
            total: dict[str, int] = {}
            for _user, emoji in await self.source.of_message(mid):
                total[emoji] = total.get(emoji, 0) + 1
            if total:
                out[mid] = total
        return out

    async def emoji_of(self, mid: int) -> set[str]:
        """The distinct emoji message ``mid`` has now (the cap's check)."""
        return set((await self.counts([mid])).get(mid, {}))

    async def users(self, mid: int, emoji: str, after: str | None, limit: int) -> list[str]:
        return await self.source.users(mid, emoji, after, limit)

    async def _build_all(self, mid: int) -> None:
        """Every shard of ``mid`` not built, from MongoDB (one read of its reactions)."""
        by_shard: list[list[Any]] = [[] for _ in range(self.shards)]
        for user, emoji in await self.source.of_message(mid):
            by_shard[shard_of(user, self.shards)].extend((f"{user}|{emoji}", FIELD + emoji))
        async with redis_guard():
            batch = Batch(self.redis)
            for s, pairs in enumerate(by_shard):
                batch.script(self._build, self._pair(mid, s), [REACTION_TTL_S, *pairs])
            await batch.execute()


def _sum(hashes: Sequence[Mapping[bytes, bytes]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for h in hashes:
        for field, n in h.items():
            if field.startswith(b"e:"):
                emoji = field[2:].decode()
                total[emoji] = total.get(emoji, 0) + int(n)
    return {e: n for e, n in total.items() if n > 0}
