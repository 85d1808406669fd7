"""The feed in Redis (``FeedCache``): following sets, pull authors, fan-outs
under way, timeline floors and growth. Everything here is a cache of MongoDB
and is rebuilt from it when missing. The post counters are
``counters_redis.py``'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import redis.asyncio as aioredis

from store.keys import Keys
from store.ports import FollowStore, PostStore
from store.redis_client import load_lua, redis_guard

__all__ = ["FeedCacheRedis"]

MARK = "~"


class FeedCacheRedis:
    def __init__(self, redis: aioredis.Redis, keys: Keys, follows: FollowStore,
                 posts: PostStore) -> None:
        self.redis = redis
        self.keys = keys
        self.follows = follows
        self.posts = posts
        self._hmax = redis.register_script(load_lua("hmax.lua"))

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
            await self.redis.sadd(key, MARK, *ids)  # type: ignore[misc]
        return set(ids)

    async def followed(self, a: str, b: str, yes: bool) -> None:
        """Mirror a follow (or unfollow); a set without ``~`` is rebuilt on read."""
        async with redis_guard():
            if yes:
                await self.redis.sadd(self.keys.following(a), b)  # type: ignore[misc]
            else:
                await self.redis.srem(self.keys.following(a), b)  # type: ignore[misc]

    # -- authors whose posts are pulled --------------------------------------------
    async def pull_max(self, authors: Iterable[str]) -> dict[str, int]:
        """Newest unpushed post id of each author that has one."""
        authors = list(authors)
        key = self.keys.pullers()
        async with redis_guard():
            raw = await self.redis.hmget(key, [MARK, *authors])  # type: ignore[misc]
        if raw[0] is None:
            found = await self.posts.pullers()
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                for a, v in found.items():
                    await self._hmax(keys=[key], args=[a, v], client=pipe)
                pipe.hset(key, MARK, 1)
                await pipe.execute()
            return {a: found[a] for a in authors if a in found}
        return {a: int(v) for a, v in zip(authors, raw[1:], strict=True) if v is not None}

    async def set_pull(self, author: str, post: int) -> None:
        async with redis_guard():
            await self._hmax(keys=[self.keys.pullers()], args=[author, post])

    # -- fan-outs under way ----------------------------------------------------------
    async def pending(self, author: str, post: int, yes: bool) -> None:
        async with redis_guard():
            key, member = self.keys.fanouts_pending(), f"{author}|{post}"
            if yes:
                await self.redis.zadd(key, {member: post})
            else:
                await self.redis.zrem(key, member)

    async def pending_below(self, before: int | None, limit: int = 1000
                            ) -> list[tuple[str, int]]:
        """(author, post) of fan-outs under way, newest first, post < ``before``."""
        high = f"({before}" if before is not None else "+inf"
        async with redis_guard():
            raw: list[bytes] = await self.redis.zrevrangebyscore(  # type: ignore[assignment]
                self.keys.fanouts_pending(), high, "-inf", start=0, num=limit)
        out = []
        for m in raw:
            author, _, post = m.decode().rpartition("|")
            out.append((author, int(post)))
        return out

    # -- timeline floors and trimming ----------------------------------------------
    async def floor(self, user: str) -> int:
        async with redis_guard():
            raw = await self.redis.hget(self.keys.timeline_floors(), user)  # type: ignore[misc]
        if raw is not None:
            return int(raw)
        value = int((await self.follows.user(user)).get("tl_floor", 0))
        await self.set_floor(user, value)
        return value

    async def set_floor(self, user: str, value: int) -> None:
        async with redis_guard():
            await self._hmax(keys=[self.keys.timeline_floors()], args=[user, value])

    async def grew(self, users: Sequence[str], keep: int, slack: int) -> None:
        """``users`` got one entry each; those past keep + slack are due a trim."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for u in users:
                pipe.hincrby(self.keys.timeline_growth(), u, 1)
            counts = await pipe.execute()
            due = [u for u, n in zip(users, counts, strict=True) if n > keep + slack]
            if due:
                await self.redis.sadd(self.keys.timeline_trims(), *due)  # type: ignore[misc]

    async def due_trims(self, n: int) -> list[str]:
        async with redis_guard():
            raw: list[bytes] | None = await self.redis.spop(  # type: ignore[assignment,misc]
                self.keys.timeline_trims(), n)
        return [u.decode() for u in raw or ()]

    async def trimmed(self, user: str, keep: int) -> None:
        async with redis_guard():
            await self.redis.hset(self.keys.timeline_growth(), user, keep)  # type: ignore[misc]
