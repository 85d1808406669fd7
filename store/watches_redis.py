"""Presence watches counted per user across its connections and nodes
(``WatchStore``; ``IM_PRESENCE_SUBS_MAX`` caps them), by ``presence_watch.lua``.

- ``ns:pw:{watcher}``: hash, watched user -> the nodes holding it for the
  watcher (space-separated). Its length is the watcher's count: a user
  watched from two connections, or two nodes, counts once.
- ``ns:pwn:{watcher}``: hash, node -> unix time its entries lapse. A node
  renews it (``renew``) while it holds entries; an ``add`` first forgets the
  entries of the nodes the caller names dead (their heartbeat lapsed) and of
  those whose lease ran out, so a node that died stops counting at the next
  ``presence_sub`` of the user, or at the latest once ``lease_s`` ran out.

Both keys carry the watcher as hash tag (one slot), and expire ``lease_s``
after the last write; each call is one script run of O(users named), plus
O(entries) once for each dead node forgotten.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from store.keys import Keys
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["WatchesRedis"]


class WatchesRedis:
    def __init__(self, redis: RedisClient, keys: Keys, lease_s: float = 600.0) -> None:
        self.redis = redis
        self.keys = keys
        self.lease_s = lease_s
        self._lua = Lua("presence_watch.lua")

    def _call(self, op: str, watcher: str, node: str, users: Sequence[str], cap: int = 0,
              dead: Sequence[str] = ()) -> tuple[list[str], list[Any]]:
        return ([self.keys.watched(watcher), self.keys.watch_leases(watcher)],
                [op, node, int(time.time()), int(self.lease_s), cap, len(dead), *dead, *users])

    async def add(self, watcher: str, node: str, users: Sequence[str], cap: int,
                  dead_nodes: Sequence[str]) -> tuple[bool, int]:
        keys, args = self._call("add", watcher, node, users, cap, dead_nodes)
        async with redis_guard():
            ok, count = await self._lua(self.redis, keys, args)
        return bool(ok), int(count)

    async def count(self, watcher: str, dead_nodes: Sequence[str]) -> int:
        keys, args = self._call("count", watcher, "", (), 0, dead_nodes)
        async with redis_guard():
            _, n = await self._lua(self.redis, keys, args)
        return int(n)

    async def restore(self, watcher: str, node: str, users: Sequence[str]) -> None:
        keys, args = self._call("restore", watcher, node, users)
        async with redis_guard():
            await self._lua(self.redis, keys, args)

    async def remove(self, watcher: str, node: str, users: Sequence[str]) -> int:
        keys, args = self._call("del", watcher, node, users)
        async with redis_guard():
            _, n = await self._lua(self.redis, keys, args)
        return int(n)

    async def renew(self, node: str, watchers: Sequence[str]) -> list[str]:
        if not watchers:
            return []
        async with redis_guard():
            batch = Batch(self.redis)
            for watcher in watchers:
                batch.script(self._lua, *self._call("renew", watcher, node, ()))
            raw = await batch.execute()
        return [w for w, (ok, _) in zip(watchers, raw, strict=True) if not ok]
