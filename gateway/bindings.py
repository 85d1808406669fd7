"""Which broker routing keys this node's queue is bound to, and lazy unbinding.

A key (a room's or a group's, built by ``router.routing``) is bound when it
gets its first local member: callers await the bind, concurrent callers share
it. An emptied key keeps its binding for ``delay_s``; it is unbound at a
sweep only if it is still unused then, so join/leave and connect/disconnect
churn do not become broker churn.

After the broker link comes back, ``recheck`` compares the keys the node's
connections need now with the keys the broker binds, and binds any missing
(counted and logged: it means a bind was lost, which is a bug).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable

from gateway.metrics import NodeMetrics
from router.base import Binder

__all__ = ["Bindings"]

log = logging.getLogger("gateway.bindings")


class Bindings:
    def __init__(self, router: Binder, metrics: NodeMetrics, delay_s: float,
                 window_ticks: int) -> None:
        self.router = router
        self.metrics = metrics
        self.delay_s = delay_s
        self.bound: set[str] = set()
        self.ops = 0  # binds + unbinds since start
        self._binding: dict[str, asyncio.Future[None]] = {}
        self._idle: dict[str, float] = {}  # emptied key -> monotonic time it emptied
        self._totals: deque[int] = deque(maxlen=window_ticks + 1)
        self._tasks: set[asyncio.Task[list[str]]] = set()

    def keep(self, keys: Iterable[str]) -> list[str]:
        """The keys bound already stay bound (a pending lazy unbind cancelled);
        returned: those not bound yet, for ``ensure``."""
        unbound = []
        for key in keys:
            if key in self.bound:
                self._idle.pop(key, None)
            else:
                unbound.append(key)
        return unbound

    async def ensure(self, key: str) -> None:
        """Bound before this returns (the broker replays it after a reconnect)."""
        self._idle.pop(key, None)
        if key in self.bound:
            return
        waiter = self._binding.get(key)
        if waiter is not None:
            await asyncio.shield(waiter)
            return
        waiter = self._binding[key] = asyncio.get_running_loop().create_future()
        try:
            await self.router.bind_key(key)
            self.bound.add(key)
            self.ops += 1
            self.metrics.room_bind_ops.labels("bind").inc()
        finally:
            del self._binding[key]
            waiter.set_result(None)

    def resumed(self, needed: Callable[[], Iterable[str]]) -> None:
        """The broker link is back: ``recheck`` what ``needed()`` names, soon."""
        task = asyncio.create_task(self.recheck(needed()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def recheck(self, needed: Iterable[str]) -> list[str]:
        """Every key in ``needed`` (what local connections use) bound on the broker,
        checked against the broker's own set, not this one's; the keys that
        were missing, now bound again."""
        have = self.router.bound_keys()
        missing = [k for k in needed if k not in have]
        for key in missing:
            self.bound.discard(key)
            await self.ensure(key)
            self.metrics.room_bind_ops.labels("repair").inc()
        if missing:
            log.warning("%d routing key(s) in use were not bound on the broker (e.g. %s); "
                        "bound again", len(missing), missing[0])
        return missing

    def idle(self, key: str, now: float) -> None:
        """``key`` has no local member any more."""
        if key in self.bound:
            self._idle[key] = now

    async def sweep(self, now: float, in_use: Callable[[str], bool]) -> None:
        due = [k for k, since in self._idle.items() if now - since >= self.delay_s]
        for key in due:
            del self._idle[key]
            if in_use(key) or key not in self.bound:
                continue
            self.bound.discard(key)
            await self.router.unbind_key(key)
            self.ops += 1
            self.metrics.room_bind_ops.labels("unbind").inc()

    def tick_metrics(self) -> None:
        """Once a tick: binds + unbinds over the last minute of ticks."""
        self._totals.append(self.ops)
        self.metrics.room_bind_ops_minute.set(self._totals[-1] - self._totals[0])

    @property
    def idle_count(self) -> int:
        return len(self._idle)
