"""Which of a user's groups have news: an index per user, so that a sync reads
the groups with messages after its cursor, not every group of its caller.

- ``ugn:{user}``: sorted set, group -> a score (the time, in ms, of one of its
  read-diffused messages: every such message of the group is at most
  ``NEWS_EVERY_MS`` newer than the score), and ``~`` (-1 while it is being
  seeded, 0 once complete). Refreshed by each sync; it expires with the user.
- ``gs:{g:G}`` field ``mk``: the score the group's members were last given.

A group with read-diffused messages gives its members a new score when its
last one is ``NEWS_EVERY_MS`` old or more (``news_mark.lua``, one call per
member, only for members whose index exists), so a busy group of N members
costs at most N small writes per ``NEWS_EVERY_MS``. The sync that finds no
complete index opens one (marks land in it from then on), reads its caller's
groups as before and seeds the index from their newest read-diffused mids.
A Redis that lost the index costs one such sync; nothing else depends on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from store.groups_redis import CACHE_TTL_S
from store.keys import Keys
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["NEWS_EVERY_MS", "GroupNewsRedis"]

NEWS_EVERY_MS = 5_000  # a group's members' scores move at most this often
NEWS_TTL_S = 7 * 86_400  # an index lives this long after its user's last sync
CHUNK = 1000  # member writes per pipeline
MARK_FIELD = "mk"


class GroupNewsRedis:
    """``GroupNews`` on Redis (a standalone server or a cluster)."""

    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self.every_ms = NEWS_EVERY_MS
        self._mark = Lua("news_mark.lua")
        self._read = Lua("news_read.lua")

    async def due(self, newest: Mapping[str, int]) -> list[str]:
        """Those of the groups (-> the time of their newest read-diffused message
        in ms) whose members' scores are ``NEWS_EVERY_MS`` old or more."""
        groups = list(newest)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in groups:
                pipe.hget(self.keys.group_state(g), MARK_FIELD)
            got = await pipe.execute()
        return [g for g, mk in zip(groups, got, strict=True)
                if newest[g] - int(mk or 0) >= self.every_ms]

    async def mark(self, scores: Mapping[str, int], members: Mapping[str, Sequence[str]]
                   ) -> None:
        """Give every member of each group (``members``) the group's score, then
        note the score on the group: a failure half way leaves the group due."""
        await self._give(scores, members)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in members:
                pipe.hset(self.keys.group_state(g), MARK_FIELD, scores[g])
                pipe.expire(self.keys.group_state(g), CACHE_TTL_S)  # (it may have expired)
            await pipe.execute()

    async def joined(self, group: str, users: Sequence[str], now_ms: int) -> None:
        """New members: the group is news to them. A later message the group's
        marks skip is less than ``NEWS_EVERY_MS`` newer than the group's last
        mark (at most now, give or take the nodes' clocks): this score covers it."""
        await self._give({group: now_ms + self.every_ms}, {group: users})

    async def _give(self, scores: Mapping[str, int], members: Mapping[str, Sequence[str]]
                    ) -> None:
        per_user: dict[str, list[object]] = {}
        for g, users in members.items():
            for u in users:
                per_user.setdefault(u, []).extend((scores[g], g))
        items = list(per_user.items())
        async with redis_guard():
            for i in range(0, len(items), CHUNK):
                batch = Batch(self.redis)
                for u, args in items[i:i + CHUNK]:
                    batch.script(self._mark, keys=[self.keys.group_news(u)], args=args)
                await batch.execute()

    async def news(self, user: str, since_ms: int) -> list[str] | None:
        """The user's groups that may have read-diffused messages newer than
        ``since_ms``; None when its index is not complete (opened: seed it)."""
        async with redis_guard():
            got = await self._read(self.redis, [self.keys.group_news(user)],
                                   [since_ms - self.every_ms, NEWS_TTL_S])
        if got is None:
            return None
        return [g for g in (m.decode() for m in got) if g != "~"]

    async def seed(self, user: str, scores: Mapping[str, int]) -> None:
        """Complete an index ``news`` opened: each group's newest read-diffused
        message time (read after it was opened), then ``~`` 0."""
        key = self.keys.group_news(user)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            items = list(scores.items())
            for i in range(0, len(items), CHUNK):
                pipe.zadd(key, dict(items[i:i + CHUNK]), gt=True)
            pipe.zadd(key, {"~": 0}, xx=True)
            pipe.expire(key, NEWS_TTL_S)
            await pipe.execute()
