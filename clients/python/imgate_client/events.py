"""What a ``Client`` tells its application: one callback, ``on_event``, called
synchronously (from the event loop) with one of these, in the order the client
decides them. ``EventQueue`` turns that callback into an async iterator.

- ``Connected``: a connection is up and set up again (in-flight sends written,
  presence resubscribed, rooms rejoined, synced).
- ``ConnectionLost``: a connection ended (or, ``opened`` false, could not be
  opened); ``action`` says what comes next: ``retry``, ``move``, ``refresh``
  or ``stop``; ``unanswered``: the sends in flight on it (written again).
- ``Stopped``: no more reconnects: close 4003, a 403 handshake, no valid token,
  or ``close()``.
- ``Message``: a ``msg`` / ``group_msg`` not delivered before, by push or by
  sync: each mid once.
- ``RoomMessages``: a room's messages not shown before (dedup by ``pos``), live
  or recovered at a rejoin.
- ``RoomRejoined``: a room joined again after a reconnect; ``recovered`` false:
  something was missed. The messages recovered follow as one ``RoomMessages``
  (``via`` "rejoin").
- ``RoomGap``: positions of a room that will never be shown (no longer kept,
  another epoch, recovery off or rate limited, or failed), told before the
  messages that follow them (``imgate_client.core.rooms``).
- ``Push``: any other push: ``read``, ``receipt``, ``typing``, ``presence``,
  ``recalled``, ``edited``, ``reaction``, ``conv_settings``, ``notice``,
  ``group_event``, ``feed``, ``left`` (kicked), ``error``. ``recalled``,
  ``edited`` and ``reaction`` arriving during a sync are told after it, behind
  the messages it delivered, so one never comes before its message; each edit
  and recall of a delivered message is told once, and a sync bringing one
  again changed since (the push missed) makes the push it would have been.
- ``SyncFailed``: the sync after a connect failed its tries (tried again in
  the background while that connection lasts, 1 s doubling to 30 s; at the
  next connect; when the dedup window fills; or by ``sync()``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from imgate_client.core.frames import Frame
from imgate_client.core.rooms import RoomGap

__all__ = ["Connected", "ConnectionLost", "Event", "EventQueue", "Message", "Push", "RoomGap",
           "RoomMessages", "RoomRejoined", "Stopped", "SyncFailed"]


@dataclass(frozen=True)
class Connected:
    url: str
    reconnect: bool  # not the first connection of this client
    synced: int  # messages the sync after it delivered


@dataclass(frozen=True)
class ConnectionLost:
    url: str
    code: int | None  # close code (None: no close frame, or the handshake failed)
    reason: str
    action: str  # "retry", "move", "refresh" or "stop"
    delay: float  # seconds before the next attempt
    opened: bool = True  # False: the connection could not be opened (handshake failed)
    unanswered: int = 0  # sends written on it and not answered: written again on the next


@dataclass(frozen=True)
class Stopped:
    code: int | None
    reason: str


@dataclass(frozen=True)
class Message:
    """A stored message: ``frame`` is the push or the sync entry as the node sent it."""

    frame: Frame
    via: str  # "push" or "sync"

    @property
    def op(self) -> str:
        return str(self.frame.get("op"))

    @property
    def mid(self) -> int:
        return int(self.frame["mid"])

    @property
    def sender(self) -> str:
        return str(self.frame.get("from"))

    @property
    def body(self) -> Any:
        return self.frame.get("body")

    @property
    def group(self) -> str | None:
        g = self.frame.get("group")
        return g if isinstance(g, str) else None

    @property
    def conv(self) -> str | None:
        """The conversation: ``g:GROUP`` for a group message, else the peer (sync
        entries carry ``conv``; a push is named from ``from`` / ``to`` by the client)."""
        c = self.frame.get("conv")
        return c if isinstance(c, str) else (f"g:{self.group}" if self.group else None)

    @property
    def recalled(self) -> bool:
        return self.frame.get("recalled") is True

    @property
    def reply_to(self) -> int | None:
        """The mid of the message of the conversation this one answers."""
        r = self.frame.get("reply_to")
        return r if isinstance(r, int) and not isinstance(r, bool) else None

    @property
    def edited(self) -> int | None:
        """When (unix ms) it was last edited, as stored when it was read (a later
        edit comes as ``Push("edited")``)."""
        e = self.frame.get("edited")
        return e if isinstance(e, int) and not isinstance(e, bool) else None

    @property
    def reactions(self) -> dict[str, int]:
        """``{emoji: count}`` as a sync entry carries them (a push has none: changes
        come as ``Push("reaction")``)."""
        r = self.frame.get("reactions")
        return dict(r) if isinstance(r, dict) else {}


@dataclass(frozen=True)
class RoomMessages:
    room: str
    epoch: str | None
    msgs: list[Frame]  # {"from", "body", "ts", "pos"}, in position order
    via: str  # "live", "rejoin" or "recovery" (a hole filled, and what waited for it)


@dataclass(frozen=True)
class RoomRejoined:
    room: str
    recovered: bool  # true: nothing was missed; the missed ones came as RoomMessages
    reply: Frame


@dataclass(frozen=True)
class Push:
    op: str
    frame: Frame


@dataclass(frozen=True)
class SyncFailed:
    error: str


Event = (Connected | ConnectionLost | Stopped | Message | RoomMessages | RoomRejoined | RoomGap
         | Push | SyncFailed)


@dataclass(eq=False)
class EventQueue:
    """A callback for ``on_event`` that queues the events, and an async iterator
    over them. ``maxlen``: keep only the newest (``dropped`` counts the rest);
    None: unbounded (a consumer must keep up)."""

    maxlen: int | None = None
    dropped: int = 0
    _items: deque[Event] = field(default_factory=deque)
    _wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def __call__(self, event: Event) -> None:
        if self.maxlen is not None and len(self._items) >= self.maxlen:
            self._items.popleft()
            self.dropped += 1
        self._items.append(event)
        self._wakeup.set()

    def __len__(self) -> int:
        return len(self._items)

    def __aiter__(self) -> EventQueue:
        return self

    async def __anext__(self) -> Event:
        return await self.get()

    async def get(self) -> Event:
        while not self._items:
            self._wakeup.clear()
            await self._wakeup.wait()
        return self._items.popleft()

    async def next(self, *kinds: type, timeout: float = 10) -> Any:
        """The next event of one of ``kinds`` (any, if none given); events of other
        kinds before it are dropped. TimeoutError after ``timeout``."""
        async with asyncio.timeout(timeout):
            while True:
                ev = await self.get()
                if not kinds or isinstance(ev, kinds):
                    return ev

    def drain(self) -> list[Event]:
        """Every queued event, at once."""
        out = list(self._items)
        self._items.clear()
        return out
