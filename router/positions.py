"""Positions for the room messages this node publishes, when rooms keep history.

A room's messages wait here for their positions: per room per window
(``IM_ROOM_WINDOW_MS``) one call of the store's ``append``
(``store/lua/room_append.lua``: the next positions and the room's epoch,
the messages kept), and the calls of every room due at the same moment
share one pipeline. One batch is in flight at a time, so this node's
messages of a room leave in position order. Each room's positioned
messages are then handed to ``out`` (the router: to this node's members
and the other nodes); a message whose position could not be taken has its
future failed (``Unavailable``): a message without a position is never
acknowledged.

The positioned bytes are the fragment with ``"pos":N`` appended, built the
same way here and in the script, so a recovered message and a live one are
the same bytes.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from core.errors import Unavailable
from store.ports import RoomHistoryStore

__all__ = ["Item", "Out", "RoomPositions", "positioned"]

log = logging.getLogger("router.positions")

# A message waiting for its position: (fragment, prio, the sender's future).
Item = tuple[bytes, int, "asyncio.Future[None]"]
# Where positioned messages go: (room, epoch, first position, the room's items).
Out = Callable[[str, str, int, list[Item]], None]
_FORGET_AFTER = 4_096  # rooms remembered for their window before a sweep


def positioned(fragment: bytes, pos: int) -> bytes:
    """``{...}`` -> ``{...,"pos":N}`` (as ``room_append.lua`` writes it)."""
    return b'%s,"pos":%d}' % (fragment[:-1], pos)


def _nothing(*_: object) -> None:
    return None


class RoomPositions:
    """Per room per window one store call; positioned messages to ``out``.

    ``observe(seconds)``: how long a room's oldest message waited for its
    position; ``count(outcome, rooms)``: store calls by outcome (``ok`` /
    ``unavailable``), in rooms.
    """

    def __init__(self, out: Out, store: RoomHistoryStore, *, window_s: float,
                 pending_max: int, observe: Callable[[float], None] = _nothing,
                 count: Callable[[str, int], None] = _nothing) -> None:
        self.out = out
        self.store = store
        self.window_s = window_s
        self.pending_max = pending_max
        self.observe = observe
        self.count = count
        self._pending: dict[str, list[Item]] = {}
        self._due: list[str] = []
        self._last: dict[str, float] = {}  # room -> loop time of its last call
        self._since: dict[str, float] = {}  # room -> monotonic time its oldest waiting came
        self._task: asyncio.Task[None] | None = None

    def submit(self, room: str, fragment: bytes, prio: int, fut: asyncio.Future[None]) -> None:
        """Queue one message (a JSON object); never awaits. ``fut`` fails here if
        the room has too many waiting, or later if no position could be taken."""
        items = self._pending.get(room)
        if items is None:
            loop = asyncio.get_running_loop()
            items = self._pending[room] = []
            self._since[room] = time.monotonic()
            wait = self._last.get(room, -1e9) + self.window_s - loop.time()
            if wait > 0:
                loop.call_later(wait, self._ready, room)
            else:
                self._ready(room)
        elif len(items) >= self.pending_max and not prio:
            fut.set_exception(Unavailable("rooms", "too many messages waiting for the room"))
            return
        items.append((fragment, prio, fut))

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
                batch: list[tuple[str, list[Item]]] = []
                since = []
                for room in rooms:
                    self._last[room] = now
                    batch.append((room, self._pending.pop(room)))
                    since.append(self._since.pop(room))
                await self._position(batch)
                done = time.monotonic()
                for t in since:
                    self.observe(done - t)
        finally:
            self._task = None

    async def _position(self, batch: list[tuple[str, list[Item]]]) -> None:
        try:
            taken = await self.store.append(
                [(room, [frag for frag, _, _ in items]) for room, items in batch],
                secrets.token_hex(8))
        except Exception as exc:  # noqa: BLE001 - no message is acked without its position
            self.count("unavailable", len(batch))
            if not isinstance(exc, Unavailable):
                log.exception("room positions failed")
                exc = Unavailable("redis", type(exc).__name__)
            for _, items in batch:
                for _, _, fut in items:
                    if not fut.done():
                        fut.set_exception(exc)
            return
        self.count("ok", len(batch))
        for (room, items), (epoch, first) in zip(batch, taken, strict=True):
            self.out(room, epoch, first, items)

    async def close(self) -> None:
        """Let the batch in flight finish (a drain)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
