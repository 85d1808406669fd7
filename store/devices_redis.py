"""Each user's connected devices, across the nodes (``DeviceStore``).

``ns:dev:{user}`` is a hash: connection ("node:id") -> "device|platform|slot|
since". A connection takes its slot with ``device_claim.lua``, which removes
and returns the connections it replaces (the caller closes them), so two
connections claiming one slot at once on two nodes leave exactly one. A
connection's entry goes when it closes; entries of a node that died go with
the key's TTL (readers leave out the connections of dead nodes).
"""

from __future__ import annotations

from collections.abc import Sequence

from store.keys import Keys
from store.records import DeviceClaim, DeviceEntry
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["DevicesRedis"]

TTL_S = 7 * 86_400  # refreshed by every claim of the user


class DevicesRedis:
    def __init__(self, redis: RedisClient, keys: Keys) -> None:
        self.redis = redis
        self.keys = keys
        self._claim = Lua("device_claim.lua")

    async def claim(self, user: str, conn: str, device: str, platform: str, slot: str,
                    since_ms: int) -> list[str]:
        return (await self.claim_many([DeviceClaim(user, conn, device, platform, slot,
                                                   since_ms)]))[0]

    async def claim_many(self, claims: Sequence[DeviceClaim]) -> list[list[str]]:
        """Each claim as ``claim`` does, all in one round trip (a connect storm)."""
        async with redis_guard():
            batch = Batch(self.redis)
            for c in claims:
                batch.script(self._claim, [self.keys.devices(c.user)],
                             [c.conn, c.device, c.platform, c.slot, c.since_ms, TTL_S])
            got = await batch.execute()
        return [[x.decode() if isinstance(x, bytes) else str(x) for x in r or ()] for r in got]

    async def release(self, user: str, conn: str) -> None:
        await self.release_many([(user, conn)])

    async def release_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Drop these (user, connection) entries in one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user, conn in pairs:
                pipe.hdel(self.keys.devices(user), conn)
            await pipe.execute()

    async def devices(self, user: str) -> list[DeviceEntry]:
        return (await self.devices_many([user]))[0]

    async def devices_many(self, users: Sequence[str]) -> list[list[DeviceEntry]]:
        """Each user's entries (as ``devices``), one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.hgetall(self.keys.devices(user))
            raws: list[dict[bytes, bytes]] = await pipe.execute()
        return [_entries(raw) for raw in raws]


def _entries(raw: dict[bytes, bytes]) -> list[DeviceEntry]:
    out = []
    for conn, entry in raw.items():
        parts = entry.decode().split("|")
        if len(parts) == 4 and parts[3].isdigit():
            out.append(DeviceEntry(conn.decode(), parts[0], parts[1], int(parts[3])))
    return sorted(out, key=lambda d: (d.since_ms, d.conn))
