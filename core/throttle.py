"""At most one event per key per interval, in bounded memory (pure)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

__all__ = ["Throttle"]


class Throttle:
    """``allow(key, now)`` is True at most once per ``interval_s`` per key. Keys
    are kept in the order last allowed; past ``max_keys`` the oldest are
    forgotten (an evicted key is allowed again: never more than one per
    interval is guaranteed only while fewer than ``max_keys`` keys are busy)."""

    def __init__(self, interval_s: float, max_keys: int = 100_000) -> None:
        self.interval_s = interval_s
        self.max_keys = max_keys
        self._last: OrderedDict[Hashable, float] = OrderedDict()

    def allow(self, key: Hashable, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._last[key] = now
        self._last.move_to_end(key)
        while self._last and (len(self._last) > self.max_keys
                              or now - next(iter(self._last.values())) >= self.interval_s):
            self._last.popitem(last=False)  # the oldest: over the bound, or free again
        return True

    def __len__(self) -> int:
        return len(self._last)
