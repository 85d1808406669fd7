"""Sends this node answered with an error after their message may have been
stored: MongoDB's answer was lost or late, or the offline stores (Redis)
failed after MongoDB had the message, or the sender went away mid-send. If
the client resends, the resend finishes it (the same mid, delivered, acked).
If it never does, the message stays in MongoDB only: history shows it, but
it is in neither user's offline store, so sync passes it by and unread
never counts it.

So the node finishes such sends itself. Each mid is kept here and held in
flight (``core.inflight``: sync cursors on every node stay below it), and a
task redelivers it (``ChatService.redeliver`` and ``GroupService.redeliver``,
as for a dead node's sends: idempotent, so a resend that finished it first
makes this a no-op), a moment after the failure and then with backoff while
a store is down. A mid found stored is finished; one not found is kept until
``linger_s`` after its failure (a store that answered late may still write
it), then dropped. At most ``max_pending`` are kept; past that a failed send
falls back to the linger alone (counted ``dropped``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from core.errors import Unavailable
from core.ids import node_of
from core.inflight import InFlight

__all__ = ["UnfinishedSends"]

log = logging.getLogger("gateway.chat.unfinished")

FIRST_DELAY_S = 0.5  # a failed send's client usually resends within this
RETRY_MAX_S = 5.0
ROUND_MAX = 200  # mids redelivered per round (oldest first)


class UnfinishedSends:
    def __init__(self, redeliver: Callable[[int, int, int], Awaitable[int]],
                 inflight: InFlight, *, linger_s: float | None = None,
                 max_pending: int = 10_000, first_delay_s: float = FIRST_DELAY_S,
                 count: Callable[[str, int], None] = lambda outcome, n: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.redeliver = redeliver  # (node id, lowest mid, highest mid) -> how many
        self.inflight = inflight
        self.linger_s = inflight.linger_s if linger_s is None else linger_s
        self.max_pending = max_pending
        self.first_delay_s = first_delay_s
        self.count = count  # (finished | not_stored | dropped, how many)
        self.clock = clock
        self._pending: dict[int, float] = {}  # mid -> when it may be dropped if not found
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def add(self, mids: Iterable[int]) -> None:
        """These sends failed after their message may have been stored."""
        until = self.clock() + self.linger_s
        dropped = 0
        for mid in mids:
            if mid in self._pending:
                self._pending[mid] = until
            elif len(self._pending) >= self.max_pending:
                dropped += 1
            else:
                self._pending[mid] = until
                self.inflight.keep(mid)
        if dropped:
            self.count("dropped", dropped)
        if self._pending and not self._closed and (self._task is None or self._task.done()):
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        delay = self.first_delay_s
        while self._pending:
            await asyncio.sleep(delay)
            try:
                await self.finish_round()
                delay = self.first_delay_s
            except Unavailable as exc:
                delay = min(max(delay, 0.1) * 2, RETRY_MAX_S)
                log.warning("finishing %d failed send(s): %s; again in %.1f s",
                            len(self._pending), exc, delay)

    async def finish_round(self) -> None:
        """Redeliver up to ``ROUND_MAX`` of the kept mids, oldest first: finished
        if found stored, dropped if not found past their linger."""
        for mid in sorted(self._pending)[:ROUND_MAX]:
            found = await self.redeliver(node_of(mid), mid, mid)
            until = self._pending.get(mid)
            if until is None:
                continue  # added again meanwhile and done: nothing to do
            if found:
                self._forget(mid, "finished")
            elif self.clock() >= until:
                self._forget(mid, "not_stored")

    def _forget(self, mid: int, outcome: str) -> None:
        del self._pending[mid]
        self.inflight.done(mid)
        self.count(outcome, 1)

    async def close(self) -> None:
        """One last round for what is kept (a drain), then stop."""
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._pending:
            with contextlib.suppress(Unavailable):
                await self.finish_round()
            if self._pending:
                log.warning("closing with %d failed send(s) not finished: a resend "
                            "finishes each", len(self._pending))
