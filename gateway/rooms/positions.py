"""Positions for the room messages this node publishes (live rooms v2).

A room's messages wait here for their positions: per room per window
(``IM_ROOM_WINDOW_MS``) one script call (``store/lua/room_append.lua``) takes
the next positions and keeps the messages, and the calls of every room due
at the same moment share one pipeline. One batch is in flight at a time, so
this node's messages of a room leave in position order. Each positioned
message is then delivered to this node's members and published to the other
nodes (``pos`` and ``epoch`` in the envelope's record), exactly as before;
the sender's future settles with the broker's confirm, or fails
(``Unavailable``) when the position could not be taken: a message without a
position is never acknowledged.

The positioned bytes are the fragment with ``"pos":N`` appended, built the
same way here and in the script, so a recovered message and a live one are
the same bytes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from core.errors import Unavailable
from gateway.metrics import NodeMetrics
from store.ports import RoomHistoryStore

__all__ = ["RoomPositions", "positioned"]

log = logging.getLogger("gateway.rooms.positions")

Deliver = Callable[[str, bytes, int, int, str], None]  # room, fragment, prio, pos, epoch
Publish = Callable[[str, bytes, int, int, str], "asyncio.Future[None]"]
_Item = tuple[bytes, int, "asyncio.Future[None]"]
_FORGET_AFTER = 4_096  # rooms remembered for their window before a sweep


def positioned(fragment: bytes, pos: int) -> bytes:
    """``{...}`` -> ``{...,"pos":N}`` (as ``room_append.lua`` writes it)."""
    return b'%s,"pos":%d}' % (fragment[:-1], pos)


class RoomPositions:
    def __init__(self, store: RoomHistoryStore, deliver: Deliver, publish: Publish,
                 metrics: NodeMetrics, *, window_s: float, pending_max: int) -> None:
        self.store = store
        self.deliver = deliver
        self.publish = publish
        self.window_s = window_s
        self.pending_max = pending_max
        self._pending: dict[str, list[_Item]] = {}
        self._due: list[str] = []
        self._last: dict[str, float] = {}  # room -> loop time of its last call
        self._since: dict[str, float] = {}  # room -> monotonic time its oldest waiting came
        self._m_stage = metrics.room_stage.labels("position")
        self._task: asyncio.Task[None] | None = None
        self._ok = metrics.room_positions.labels("ok")
        self._failed = metrics.room_positions.labels("unavailable")

    def submit(self, room: str, fragment: bytes, prio: int) -> asyncio.Future[None]:
        """Queue one message (a JSON object); never awaits. The future settles
        once the broker confirmed the envelope carrying it."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        items = self._pending.get(room)
        if items is None:
            items = self._pending[room] = []
            self._since[room] = time.monotonic()
            wait = self._last.get(room, -1e9) + self.window_s - loop.time()
            if wait > 0:
                loop.call_later(wait, self._ready, room)
            else:
                self._ready(room)
        elif len(items) >= self.pending_max and not prio:
            fut.set_exception(Unavailable("rooms", "too many messages waiting for the room"))
            return fut
        items.append((fragment, prio, fut))
        return fut

    def _ready(self, room: str) -> None:
        self._due.append(room)
        if self._task is None:  # starts next tick: this tick's messages share the call
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._due:
                rooms, self._due = self._due, []
                now = loop.time()
                if len(self._last) > _FORGET_AFTER:
                    self._last = {r: t for r, t in self._last.items()
                                  if t + self.window_s > now}
                batch: list[tuple[str, list[_Item]]] = []
                since = []
                for room in rooms:
                    self._last[room] = now
                    batch.append((room, self._pending.pop(room)))
                    since.append(self._since.pop(room))
                await self._position(batch)
                done = time.monotonic()
                for t in since:
                    self._m_stage.observe(done - t)
        finally:
            self._task = None

    async def _position(self, batch: list[tuple[str, list[_Item]]]) -> None:
        try:
            taken = await self.store.append(
                [(room, [frag for frag, _, _ in items]) for room, items in batch],
                secrets.token_hex(8))
        except Exception as exc:  # noqa: BLE001 - no message is acked without its position
            self._failed.inc(len(batch))
            if not isinstance(exc, Unavailable):
                log.exception("room positions failed")
                exc = Unavailable("redis", type(exc).__name__)
            for _, items in batch:
                for _, _, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        self._ok.inc(len(batch))
        for (room, items), (epoch, first) in zip(batch, taken, strict=True):
            confirmed: asyncio.Future[None] | None = None
            for k, (frag, prio, _) in enumerate(items):
                msg = positioned(frag, first + k)
                self.deliver(room, msg, prio, first + k, epoch)
                confirmed = self.publish(room, msg, prio, first + k, epoch)
            if confirmed is not None:
                confirmed.add_done_callback(
                    functools.partial(_settle, [fut for _, _, fut in items]))

    async def close(self) -> None:
        """Let the batch in flight finish (a drain)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


def _settle(waiting: list[asyncio.Future[None]], confirmed: asyncio.Future[None]) -> None:
    error: Any = (asyncio.CancelledError() if confirmed.cancelled()
                  else confirmed.exception())
    for fut in waiting:
        if not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
