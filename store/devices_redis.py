"""Each user's connected devices, across the nodes (``DeviceStore``).

``ns:dev:{user}`` is a hash: connection ("node:id") -> "device|platform|slot|
since". A connection takes its slot with ``device_claim.lua``, which removes
and returns the connections it replaces (the caller closes them), so two
connections claiming one slot at once on two nodes leave exactly one. A
connection's entry goes when it closes; entries of a node that died go with
the key's TTL (readers leave out the connections of dead nodes).
"""

from __future__ import annotations

from store.keys import Keys
from store.records import DeviceEntry
from store.redis_client import Lua, RedisClient, redis_guard

__all__ = ["DevicesRedis"]

TTL_S = 7 * 86_400  # refreshed by every claim of the user


class DevicesRedis:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._claim = Lua("device_claim.lua")

    async def claim(self, user: str, conn: str, device: str, platform: str, slot: str,
                    since_ms: int) -> list[str]:
        async with redis_guard():
            got = await self._claim(self.redis, [self.keys.devices(user)],
                                    [conn, device, platform, slot, since_ms, TTL_S])
        return [c.decode() if isinstance(c, bytes) else str(c) for c in got or ()]

    async def release(self, user: str, conn: str) -> None:
        async with redis_guard():
            await self.redis.hdel(self.keys.devices(user), conn)  # type: ignore[misc]

    async def devices(self, user: str) -> list[DeviceEntry]:
        async with redis_guard():
            raw: dict[bytes, bytes] = await self.redis.hgetall(  # type: ignore[misc,assignment]
                self.keys.devices(user))
        out = []
        for conn, entry in raw.items():
            parts = entry.decode().split("|")
            if len(parts) == 4 and parts[3].isdigit():
                out.append(DeviceEntry(conn.decode(), parts[0], parts[1], int(parts[3])))
        return sorted(out, key=lambda d: (d.since_ms, d.conn))
