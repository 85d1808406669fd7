"""Bans and token revocations per user, set by the server API (``SanctionStore``).

``ns:san:{user}`` is a hash: ``ban`` = unix time the ban ends, ``rev`` =
tokens issued (``iat``) before this unix time are refused. The key expires
with the later of the two (a revocation needs to outlive only the tokens it
refuses: at most the longest token lifetime). Read once per WebSocket
handshake and per HTTP call of that user, never per frame.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from store.keys import Keys
from store.records import Sanctions
from store.redis_client import Lua, RedisClient, redis_guard

__all__ = ["SanctionsRedis"]


class SanctionsRedis:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._set = Lua("sanction.lua")

    async def get(self, user: str) -> Sanctions:
        return (await self.get_many([user]))[0]

    async def get_many(self, users: Sequence[str]) -> list[Sanctions]:
        """Each user's sanctions, one round trip (a connect storm's handshakes)."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.hmget(self.keys.sanctions(user), ["ban", "rev"])
            raw: list[list[bytes | None]] = await pipe.execute()
        now = time.time()
        out = []
        for ban, rev in raw:
            until = float(ban) if ban is not None else 0.0
            out.append(Sanctions(banned_until=until if until > now else 0.0,
                                 revoked_before=float(rev) if rev is not None else 0.0))
        return out

    async def ban(self, user: str, until: float) -> None:
        async with redis_guard():
            await self._set(self.redis, [self.keys.sanctions(user)], ["ban", until, 0, "set"])

    async def unban(self, user: str) -> None:
        async with redis_guard():
            await self.redis.hdel(self.keys.sanctions(user), "ban")  # type: ignore[misc]

    async def room_muted(self, room: str, user: str) -> float:
        async with redis_guard():
            raw = await self.redis.hget(self.keys.room_mutes(room), user)  # type: ignore[misc]
        until = float(raw) if raw is not None else 0.0
        return until if until > time.time() else 0.0

    async def mute(self, room: str, user: str, until: float) -> None:
        async with redis_guard():
            await self._set(self.redis, [self.keys.room_mutes(room)], [user, until, 0, "set"])

    async def unmute(self, room: str, user: str) -> None:
        async with redis_guard():
            await self.redis.hdel(self.keys.room_mutes(room), user)  # type: ignore[misc]

    async def revoke(self, user: str, before: float, keep_s: float) -> None:
        """Refuse ``user``'s tokens issued before ``before`` (only ever moves later),
        remembered ``keep_s`` past it."""
        async with redis_guard():
            await self._set(self.redis, [self.keys.sanctions(user)],
                            ["rev", before, before + keep_s, "max"])
