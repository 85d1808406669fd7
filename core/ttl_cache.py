"""A bounded map whose entries expire: what a node remembers of other
stores' answers for a few seconds (privacy settings, blocks, contacts).
Pure: the caller gives the time."""

from __future__ import annotations

import collections
from typing import Generic, TypeVar

__all__ = ["TtlCache"]

K = TypeVar("K")
V = TypeVar("V")
_MISSING = object()


class TtlCache(Generic[K, V]):
    """At most ``max_items`` entries (least recently set dropped first)."""

    def __init__(self, max_items: int = 100_000) -> None:
        self.max_items = max_items
        self._items: collections.OrderedDict[K, tuple[float, V]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K, now: float) -> tuple[bool, V | None]:
        """(found, value): an entry past its expiry is not found (and dropped)."""
        item = self._items.get(key)
        if item is None:
            return False, None
        if item[0] <= now:
            del self._items[key]
            return False, None
        return True, item[1]

    def set(self, key: K, value: V, until: float) -> None:
        self._items[key] = (until, value)
        self._items.move_to_end(key)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def drop(self, key: K) -> None:
        self._items.pop(key, None)
