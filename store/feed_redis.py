"""The feed in Redis (``FeedCache``): following sets, pull authors, fan-outs
under way, timeline floors and growth. Everything here is a cache of MongoDB
and is rebuilt from it when missing. The post counters are
``counters_redis.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from store.keys import PULL_SHARDS, TIMELINE_SHARDS, Keys
from store.ports import FollowStore, PostStore
from store.redis_client import Batch, Lua, RedisClient, redis_guard, spop_spread

__all__ = ["FeedCacheRedis"]

MARK = "~"


class FeedCacheRedis:
    def __init__(self, redis: RedisClient, keys: Keys, follows: FollowStore,
                 posts: PostStore, following_ttl_s: int = 7 * 86_400) -> None:
        self.redis = redis
        # A following set expires this long after its last write and is rebuilt
        # from MongoDB when next read (without ``~`` it is never taken as complete).
        self.following_ttl_s = following_ttl_s
        self.keys = keys
        self.follows = follows
        self.posts = posts
        self._hmax = Lua("hmax.lua")

    # -- following ---------------------------------------------------------------
    async def following(self, user: str) -> set[str]:
        key = self.keys.following(user)
        async with redis_guard():
            raw: set[bytes] = await self.redis.smembers(key)  # type: ignore[assignment,misc]
        names = {m.decode() for m in raw}
        if MARK in names:
            return names - {MARK}
        ids = await self.follows.all_following(user)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(key, MARK, *ids)
            pipe.expire(key, self.following_ttl_s)
            await pipe.execute()
        return set(ids)

    async def followed(self, a: str, b: str, yes: bool) -> None:
        """Mirror a follow (or unfollow); a set without ``~`` is rebuilt on read."""
        key = self.keys.following(a)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            if yes:
                pipe.sadd(key, b)
            else:
                pipe.srem(key, b)
            pipe.expire(key, self.following_ttl_s)
            await pipe.execute()

    # -- authors whose posts are pulled --------------------------------------------
    async def pull_max(self, authors: Iterable[str]) -> dict[str, int]:
        """Newest unpushed post id of each author that has one (one round trip:
        an HMGET per shard these authors fall in)."""
        by_shard: dict[int, list[str]] = {}
        for a in authors:
            by_shard.setdefault(self.keys.pull_shard(a), []).append(a)
        shards = sorted(by_shard)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for sh in shards:
                pipe.hmget(self.keys.pullers_shard(sh), [MARK, *by_shard[sh]])
            raw = await pipe.execute()
        out: dict[str, int] = {}
        incomplete = []
        for sh, values in zip(shards, raw, strict=True):
            if values[0] is None:
                incomplete.append(sh)
                continue
            out.update({a: int(v) for a, v in zip(by_shard[sh], values[1:], strict=True)
                        if v is not None})
        if incomplete:
            found = await self._rebuild_pullers(incomplete)
            out.update({a: found[a] for sh in incomplete for a in by_shard[sh] if a in found})
        return out

    async def _rebuild_pullers(self, shards: list[int]) -> dict[str, int]:
        """Fill these shards from MongoDB (HMAX: a newer id already here stays)."""
        found = await self.posts.pullers()
        wanted = set(shards)
        async with redis_guard():
            batch = Batch(self.redis)
            for a, v in found.items():
                if self.keys.pull_shard(a) in wanted:
                    batch.script(self._hmax, keys=[self.keys.pullers(a)], args=[a, v])
            await batch.execute()
            pipe = self.redis.pipeline(transaction=False)  # complete only once filled
            for sh in shards:
                pipe.hset(self.keys.pullers_shard(sh), MARK, 1)
            await pipe.execute()
        return found

    async def set_pull(self, author: str, post: int) -> None:
        async with redis_guard():
            await self._hmax(self.redis, [self.keys.pullers(author)], [author, post])

    # -- fan-outs under way ----------------------------------------------------------
    async def pending(self, author: str, post: int, yes: bool) -> None:
        async with redis_guard():
            key, member = self.keys.fanouts_pending(author), f"{author}|{post}"
            if yes:
                await self.redis.zadd(key, {member: post})
            else:
                await self.redis.zrem(key, member)

    async def pending_below(self, before: int | None, limit: int = 1000,
                            authors: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """(author, post) of fan-outs under way, newest first, post < ``before``:
        of ``authors`` (the shards they fall in) or, without them, of everyone."""
        shards = (sorted({self.keys.pull_shard(a) for a in authors}) if authors is not None
                  else list(range(PULL_SHARDS)))
        high = f"({before}" if before is not None else "+inf"
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for sh in shards:
                pipe.zrevrangebyscore(self.keys.fanouts_pending_shard(sh), high, "-inf",
                                      start=0, num=limit, withscores=True)
            raw: list[list[tuple[bytes, float]]] = await pipe.execute()
        out = []
        for m, _ in sorted((row for rows in raw for row in rows), key=lambda r: r[1],
                           reverse=True)[:limit]:
            author, _, post = m.decode().rpartition("|")  # the id exact, not the score
            out.append((author, int(post)))
        return out

    # -- timeline floors and trimming ----------------------------------------------
    async def floor(self, user: str) -> int:
        async with redis_guard():
            raw = await self.redis.hget(self.keys.timeline_floors(user), user)  # type: ignore[misc]
        if raw is not None:
            return int(raw)
        value = int((await self.follows.user(user)).get("tl_floor", 0))
        await self.set_floor(user, value)
        return value

    async def set_floor(self, user: str, value: int) -> None:
        async with redis_guard():
            await self._hmax(self.redis, [self.keys.timeline_floors(user)], [user, value])

    async def grew(self, users: Sequence[str], keep: int, slack: int) -> None:
        """``users`` got one entry each; those past keep + slack are due a trim."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for u in users:
                pipe.hincrby(self.keys.timeline_growth(u), u, 1)
            counts = await pipe.execute()
            due = [u for u, n in zip(users, counts, strict=True) if n > keep + slack]
            if due:
                pipe = self.redis.pipeline(transaction=False)
                for u in due:
                    pipe.sadd(self.keys.timeline_trims(self.keys.timeline_shard(u)), u)
                await pipe.execute()

    async def due_trims(self, n: int) -> list[str]:
        """Up to about ``n`` users due a trim, taken from every shard."""
        shards = [self.keys.timeline_trims(sh) for sh in range(TIMELINE_SHARDS)]
        async with redis_guard():
            return [u.decode() for u in await spop_spread(self.redis, shards, n)]

    async def trimmed(self, user: str, keep: int) -> None:
        async with redis_guard():
            await self.redis.hset(self.keys.timeline_growth(user), user, keep)  # type: ignore[misc]
