"""Sends a node took to its grave: it may have stored a 1:1 message in
MongoDB and died before putting it in the users' offline stores (and before
marking the send acked). Sync trusts those stores for recent mids, so until
someone puts such a message there, any sync cursor passing it passes it for
good.

Each node shares the oldest mid it has in flight (``core.inflight``), or the
mid of the moment it shares when none is (a send begun before its next share
takes a later one); every node holds its sync cursors below the others' marks. When a node is seen
dead, one live node at a time (the holder of a short claim in Redis)
redelivers what the dead one stored from its mark on (``ChatService.redeliver``:
idempotent) and then forgets the mark; every live node holds its cursors below
that mark until it is forgotten. The claim keeps the read of the store to one
node per death; if its holder dies too, the claim lapses and another takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping

from core.errors import Unavailable
from core.ids import mid_for_time_ms

__all__ = ["CLAIM_TTL_S", "DeadSends", "node_number"]

log = logging.getLogger("gateway.chat.dead_sends")
_NAME = re.compile(r"n(\d+)-")
RETRY_MAX_S = 5.0
CLAIM_TTL_S = 60.0  # a claim outlives any redelivery its holder can still be doing


def node_number(name: str) -> int | None:
    """The node id in a node's name (``n<id>-<token>``), which its mids carry."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


class DeadSends:
    def __init__(self, redeliver: Callable[[int, int, int], Awaitable[int]],
                 claim: Callable[[str], Awaitable[bool]],
                 clock_ms: Callable[[], int] = lambda: int(time.time() * 1000),
                 release: Callable[[str], Awaitable[None]] | None = None,
                 forget: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        self.redeliver = redeliver  # (node id, lowest mid, highest mid) -> how many
        self.claim = claim  # dead node's name -> whether this node is the one to redeliver
        self.clock_ms = clock_ms
        # A claim given up when this node stops before it is done (another live
        # node takes it at once, not when it lapses: meanwhile every node holds
        # its cursors below the mark), and a mark dropped as soon as it is done
        # (not at the next share, which a node closing now would never make).
        self.release = release
        self.forget = forget
        self._running: dict[str, asyncio.Task[None]] = {}
        self._done: set[str] = set()

    def observe(self, dead: Mapping[str, int]) -> tuple[dict[str, int], list[str]]:
        """The dead nodes' marks as read now -> (the marks that must still hold
        cursors back, the nodes whose marks may be forgotten). Starts the
        redelivery of each dead node seen for the first time."""
        for name, mark in dead.items():
            if name not in self._running and name not in self._done:
                self._running[name] = asyncio.create_task(self._put_right(name, mark))
        self._done &= set(dead)  # a mark forgotten (by any node) is over
        return ({n: m for n, m in dead.items() if n not in self._done},
                [n for n in dead if n in self._done])

    async def _put_right(self, name: str, mark: int) -> None:
        try:
            try:
                if not await self.claim(name):
                    return  # another live node is putting it right
            except Unavailable as exc:
                log.warning("claiming the redelivery of %s's sends: %s", name, exc)
                return
            number = node_number(name)
            if number is not None:
                high = mid_for_time_ms(self.clock_ms())
                delay = 0.2
                while True:
                    try:
                        n = await self.redeliver(number, mark, high)
                        break
                    except Unavailable as exc:
                        log.warning("redelivering what %s stored: %s; trying again", name, exc)
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, RETRY_MAX_S)
                log.info("node %s died; what it stored from its mark (mid %d) on: "
                         "%d message(s) redelivered", name, mark, n)
            self._done.add(name)
            if self.forget is not None:
                with contextlib.suppress(Unavailable):  # else at the next share
                    await self.forget([name])
        finally:
            self._running.pop(name, None)

    async def close(self) -> None:
        running = dict(self._running)
        for t in running.values():
            t.cancel()
        for t in running.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        if self.release is not None:
            for name in running:
                with contextlib.suppress(Unavailable):
                    await self.release(name)
