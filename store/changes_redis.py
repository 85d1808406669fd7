"""Where sync finds the messages changed after a cursor (edited, reacted to,
recalled), for a device that already had them.

A change is given a position: a fresh mid, so it orders with new messages.
One zset per user for its 1:1 messages and one per group (write or read
diffusion alike: a change in a group of 10,000 costs one write), member =
the message's mid, score = the position of its latest change (a second
change moves it: sync returns the message once, as it is now). Trimmed to
``keep`` entries and to the offline store's age, with its TTL: a device
away longer than that syncs a full history anyway. Not rebuilt after a
Redis loss: changes made before it, to messages a device had already synced,
are then found through history only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from core.ids import mid_for_time_ms, mid_time_ms
from store.keys import Keys
from store.redis_client import RedisClient, redis_guard

__all__ = ["ChangesRedis"]


class ChangesRedis:
    """``ChangeLog``."""

    def __init__(self, redis: RedisClient, keys: Keys, keep: int, ttl_s: int) -> None:
        self.redis = redis
        self.keys = keys
        self.keep = keep
        self.ttl_s = ttl_s

    async def note(self, mid: int, position: int, *, users: Sequence[str] = (),
                   group: str | None = None) -> None:
        keys = [self.keys.changes(u) for u in users]
        if group is not None:
            keys.append(self.keys.group_changes(group))
        floor = mid_for_time_ms(mid_time_ms(position) - self.ttl_s * 1000)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.zadd(key, {str(mid): position})
                pipe.zremrangebyscore(key, "-inf", f"({floor}")
                pipe.zremrangebyrank(key, 0, -self.keep - 1)
                pipe.expire(key, self.ttl_s)
            await pipe.execute()

    async def since(self, user: str, groups: Mapping[str, int], after: int, limit: int
                    ) -> list[tuple[int, int, str | None]]:
        """(position, mid, group or None) of the changes after ``after`` among the
        user's 1:1 messages and its ``groups``' (group -> the lowest position
        that concerns the user: it joined then), oldest first, at most ``limit``
        from each log."""
        names = list(groups)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.zrangebyscore(self.keys.changes(user), f"({after}", "+inf", start=0,
                               num=limit, withscores=True)
            for g in names:
                pipe.zrangebyscore(self.keys.group_changes(g), f"({max(after, groups[g])}",
                                   "+inf", start=0, num=limit, withscores=True)
            got = await pipe.execute()
        out: list[tuple[int, int, str | None]] = [(int(score), int(mid), None)
                                                  for mid, score in got[0]]
        for g, rows in zip(names, got[1:], strict=True):
            out += [(int(score), int(mid), g) for mid, score in rows]
        out.sort()
        return out

