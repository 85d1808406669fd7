"""Presence watches on one node, as pure bookkeeping (``gateway.presence.subs``
does the I/O).

- ``ShardRefs``: how many watched users of each presence shard have a local
  watcher. A shard's broker key is bound while its count is above zero, so
  the node binds at most one key per shard however many users it watches.
- ``HeldWatches``: per watcher (a user), how many of its local connections
  watch each user. What counts against the watcher's cap is the set of
  users, not the connections: a pair is held here once, and told to the
  shared count (``store.ports.WatchStore``) only when it appears (first
  local connection) or disappears (last one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

__all__ = ["HeldWatches", "ShardRefs"]


class ShardRefs:
    """shard -> watched users of it with a local watcher."""

    def __init__(self, shard_of: Callable[[str], int]) -> None:
        self.shard_of = shard_of
        self._counts: dict[int, int] = {}

    def add(self, user: str) -> int | None:
        """``user`` got its first local watcher: its shard if that shard was unused."""
        shard = self.shard_of(user)
        n = self._counts.get(shard, 0)
        self._counts[shard] = n + 1
        return shard if n == 0 else None

    def remove(self, user: str) -> int | None:
        """``user`` lost its last local watcher: its shard if nothing else uses it."""
        shard = self.shard_of(user)
        n = self._counts.get(shard, 0)
        if n <= 1:
            self._counts.pop(shard, None)
            return shard if n == 1 else None
        self._counts[shard] = n - 1
        return None

    def count(self, shard: int) -> int:
        return self._counts.get(shard, 0)

    def __contains__(self, shard: object) -> bool:
        return shard in self._counts

    def __iter__(self) -> Iterator[int]:
        return iter(self._counts)

    def __len__(self) -> int:
        return len(self._counts)


class HeldWatches:
    """watcher -> {watched user: local connections of the watcher watching it}."""

    def __init__(self) -> None:
        self._held: dict[str, dict[str, int]] = {}

    def missing(self, watcher: str, users: Iterable[str]) -> list[str]:
        """Those of ``users`` (each once, in order) the watcher watches from no
        local connection yet: the ones to count."""
        held = self._held.get(watcher, {})
        return [u for u in dict.fromkeys(users) if u not in held]

    def hold(self, watcher: str, users: Iterable[str]) -> None:
        """One more local connection of ``watcher`` watches each of ``users``."""
        held = self._held.setdefault(watcher, {})
        for u in users:
            held[u] = held.get(u, 0) + 1

    def release(self, watcher: str, users: Iterable[str]) -> list[str]:
        """One connection fewer watches each of ``users``: those no local
        connection of ``watcher`` watches any more (to uncount)."""
        held = self._held.get(watcher)
        if held is None:
            return []
        gone = []
        for u in users:
            n = held.get(u, 0)
            if n > 1:
                held[u] = n - 1
            elif n == 1:
                del held[u]
                gone.append(u)
        if not held:
            del self._held[watcher]
        return gone

    def holds(self, watcher: str, user: str) -> bool:
        return user in self._held.get(watcher, {})

    def held(self, watcher: str) -> list[str]:
        """The users ``watcher`` watches from this node."""
        return list(self._held.get(watcher, {}))

    def watchers(self) -> list[str]:
        """The users watching someone from this node."""
        return list(self._held)

    def __len__(self) -> int:
        """(watcher, watched) pairs held."""
        return sum(len(h) for h in self._held.values())
