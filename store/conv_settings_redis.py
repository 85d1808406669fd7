"""Each user's conversation settings, kept whole in one Redis hash per user
(``store/lua/conv_settings.lua``) over MongoDB's copy
(``store/conv_settings_mongo.py``): the events worker asks whether a
recipient muted a conversation with one hash read per user, and the
conversation list reads them with the same read. A hash not complete
(expired, lost) is filled from MongoDB on its next read."""

from __future__ import annotations

from collections.abc import Sequence

from store.conv_settings_mongo import LETTERS, ConvSettingsMongo
from store.keys import Keys
from store.records import ConvSettings
from store.redis_client import Lua, RedisClient, redis_guard

__all__ = ["ConvSettingsRedis"]

TTL_S = 7 * 86_400
COMPLETE = b"~"


def letters(value: ConvSettings) -> str:
    return "".join(c for name, c in LETTERS.items() if getattr(value, name))


def parse(text: bytes | str) -> ConvSettings:
    t = text.decode() if isinstance(text, bytes) else text
    return ConvSettings("m" in t, "p" in t, "a" in t)


class ConvSettingsRedis:
    """``ConvSettingStore``."""

    def __init__(self, redis: RedisClient, keys: Keys, source: ConvSettingsMongo) -> None:
        self.redis = redis
        self.keys = keys
        self.source = source
        self._lua = Lua("conv_settings.lua")

    async def put(self, user: str, conv: str, value: ConvSettings) -> None:
        """MongoDB first (the truth), then the hash."""
        await self.source.put(user, conv, value)
        async with redis_guard():
            await self._lua(self.redis, [self.keys.conv_settings(user)],
                            ["set", TTL_S, conv, letters(value)])

    async def of_user(self, user: str) -> dict[str, ConvSettings]:
        """The user's conversations with a setting on."""
        return (await self.of_users([user]))[user]

    async def of_users(self, users: Sequence[str]) -> dict[str, dict[str, ConvSettings]]:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for u in users:
                pipe.hgetall(self.keys.conv_settings(u))
            raw: list[dict[bytes, bytes]] = await pipe.execute()
        out: dict[str, dict[str, ConvSettings]] = {}
        for user, h in zip(users, raw, strict=True):
            if COMPLETE in h:
                out[user] = {f[2:].decode(): parse(v) for f, v in h.items()
                             if f.startswith(b"c:")}
            else:
                out[user] = await self._fill(user, h.get(b"v", b""))
        return out

    async def _fill(self, user: str, version: bytes) -> dict[str, ConvSettings]:
        """MongoDB's answer, kept if no change came in between (else the next
        read fills again)."""
        found = await self.source.of_user(user)
        pairs = [x for conv, value in found.items() for x in (conv, letters(value))]
        async with redis_guard():
            await self._lua(self.redis, [self.keys.conv_settings(user)],
                            ["fill", TTL_S, version.decode(), *pairs])
        return found

    async def muted_by(self, conv: str, limit: int) -> list[str]:
        return await self.source.muted_by(conv, limit)
