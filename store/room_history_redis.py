"""Live-room positions and recent history (``RoomHistoryStore``).

- ``ns:rm:{room}``: hash ``e`` (the room's epoch), ``p`` (its last position).
  A position is taken by ``room_append.lua`` for every message of a window
  at once; when the hash is gone (a flush, a failover that lost it, a room
  quiet for ``meta_ttl_s``) the next append starts a new epoch at 1.
- ``ns:rh:{room}``: list of the room's newest positioned messages, trimmed to
  the count and expiring ``ttl_s`` after the last write; readers also drop
  entries older than ``ttl_s`` (``core.room_history``).

Both keys share the room's hash tag, so one script call holds a room on a
Redis Cluster; the appends of every room of a window go in one pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from core.room_history import RoomLog
from store.keys import Keys
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["RoomHistoryRedis"]


class RoomHistoryRedis:
    def __init__(self, redis: RedisClient, keys: Keys, *, keep: int, ttl_s: float,
                 meta_ttl_s: int = 86_400) -> None:
        self.redis = redis
        self.keys = keys
        self.keep = keep
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.meta_ttl_s = max(meta_ttl_s, int(ttl_s) + 1)
        self._append = Lua("room_append.lua")
        self._read = Lua("room_read.lua")

    async def append(self, batches: Sequence[tuple[str, Sequence[bytes]]], new_epoch: str
                     ) -> list[tuple[str, int]]:
        """Position each room's messages (JSON objects) and keep them: per room
        (epoch, first position); one round trip for every room."""
        async with redis_guard():
            batch = Batch(self.redis)
            for room, frags in batches:
                batch.script(self._append,
                             [self.keys.room_meta(room), self.keys.room_history(room)],
                             [new_epoch, self.keep, self.ttl_ms, self.meta_ttl_s, *frags])
            raw = await batch.execute()
        return [(_text(r[0]), int(r[1])) for r in raw]

    async def read(self, rooms: Sequence[tuple[str, bool]]) -> list[RoomLog]:
        """Each room's epoch (None: no state), last position and, when asked,
        its kept messages; one round trip."""
        async with redis_guard():
            batch = Batch(self.redis)
            for room, entries in rooms:
                batch.script(self._read,
                             [self.keys.room_meta(room), self.keys.room_history(room)],
                             ["1" if entries else "0"])
            raw = await batch.execute()
        return [RoomLog(_text(r[0]) if r[0] else None, int(r[1]), list(r[2:])) for r in raw]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
