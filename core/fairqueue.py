"""A bounded queue that serves its keys in turn. Pure.

Items of one key stay in order; keys take turns, so one key with many items
(one user sending to thousands of offline ids) cannot hold back another's.
Bounded twice: ``max_total`` items in all, ``max_per_key`` per key; ``put``
refuses past either (the caller counts the drop).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

__all__ = ["FairQueue"]

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


class FairQueue(Generic[K, T]):
    def __init__(self, max_total: int, max_per_key: int) -> None:
        self.max_total = max_total
        self.max_per_key = max_per_key
        self._queues: dict[K, collections.deque[T]] = {}
        self._turns: collections.deque[K] = collections.deque()  # keys with items, in turn
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def put(self, key: K, item: T) -> bool:
        """Queue ``item`` behind ``key``'s others; False (nothing queued) when full."""
        queue = self._queues.get(key)
        if self._size >= self.max_total or (queue is not None and
                                             len(queue) >= self.max_per_key):
            return False
        if queue is None:
            queue = self._queues[key] = collections.deque()
            self._turns.append(key)
        queue.append(item)
        self._size += 1
        return True

    def batch(self, n: int) -> list[T]:
        """Up to ``n`` items, not removed: the keys' heads in turn, then their
        second items, and so on (each key's items in order)."""
        out: list[T] = []
        depth = 0
        while len(out) < n:
            took = False
            for key in self._turns:
                queue = self._queues[key]
                if depth < len(queue):
                    out.append(queue[depth])
                    took = True
                    if len(out) == n:
                        break
            if not took:
                break
            depth += 1
        return out

    def remove_done(self, done: Callable[[T], bool]) -> None:
        """Remove each key's leading items for which ``done`` holds (each key's
        items leave in order); if any left, the key that led goes last (if none
        did, the same batch comes again, in the same order: a retry)."""
        before = self._size
        for key in list(self._turns):
            queue = self._queues[key]
            while queue and done(queue[0]):
                queue.popleft()
                self._size -= 1
            if not queue:
                del self._queues[key]
                self._turns.remove(key)
        if self._turns and self._size < before:
            self._turns.rotate(-1)
