"""Connections closed when their token expires: one timer for the node, not one
per connection (a timer handle per idle connection cost ~0.8 KB of RSS).

Connections are kept by the whole second their token's ``exp`` falls in
(rounded up), and a single timer is armed for the earliest such second; when
it fires, every connection of the seconds passed is handed to ``on_expired``.
So a connection is closed less than a second after its ``exp``, never before.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections.abc import Callable

from gateway.hub import Client

__all__ = ["ExpiryWheel"]


class ExpiryWheel:
    def __init__(self, on_expired: Callable[[Client], None]) -> None:
        self.on_expired = on_expired
        self._buckets: dict[int, set[Client]] = {}
        self._seconds: list[int] = []  # heap of the buckets' seconds (some maybe gone)
        self._timer: asyncio.TimerHandle | None = None
        self._armed_for = 0

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    def set(self, client: Client, exp: float) -> None:
        """Close ``client`` once ``exp`` (unix s) has passed; replaces an earlier one."""
        self.discard(client)
        second = math.ceil(exp)
        client.expires = second
        bucket = self._buckets.get(second)
        if bucket is None:
            bucket = self._buckets[second] = set()
            heapq.heappush(self._seconds, second)
        bucket.add(client)
        if self._timer is None or second < self._armed_for:
            self._arm(second)

    def discard(self, client: Client) -> None:
        bucket = self._buckets.get(client.expires)
        if bucket is not None:
            bucket.discard(client)
            if not bucket:
                del self._buckets[client.expires]
        client.expires = 0

    def _arm(self, second: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._armed_for = second
        self._timer = loop.call_at(loop.time() + max(0.0, second - time.time()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        now = time.time()
        while self._seconds and self._seconds[0] <= now:
            second = heapq.heappop(self._seconds)
            for client in self._buckets.pop(second, ()):
                client.expires = 0
                self.on_expired(client)
        while self._seconds and self._seconds[0] not in self._buckets:
            heapq.heappop(self._seconds)  # emptied by discards
        if self._seconds:
            self._arm(self._seconds[0])
