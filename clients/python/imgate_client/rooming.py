"""The ``Client``'s rooms after a connect and across gaps: the rejoin of every
room with ``since`` (``_rejoin``), and the recovery join when the core sees a
jump in a room's positions or the node sends ``room_gap`` (one in flight per
room; the core holds the room's pushes until its reply is in). Messages and
gaps reach the application in position order (``_room_items``). A mixin on
``Client``, first among its bases: its ``_now`` and ``_start_recovery`` are the
ones ``Ops`` declares."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import Any

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import Frame, Rooms
from imgate_client.events import Event, Push, RoomGap, RoomMessages, RoomRejoined

__all__ = ["Rooming"]


class Rooming:
    """Room rejoins and gap recovery (see the module docstring)."""

    rooms: Rooms
    request_timeout: float

    def _emit(self, event: Event) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Awaitable[Any]) -> None:
        raise NotImplementedError

    def _writable(self) -> Connection | None:
        raise NotImplementedError

    async def _rejoin(self, conn: Connection, room: str) -> None:
        fields = self.rooms.join_fields(room)
        try:
            r = await conn.request("join", self.request_timeout, **fields)
        except BaseException:
            st = self.rooms.get(room)
            if st is not None:
                st.on_join_failed()
            raise
        if r.get("op") != "joined":
            self.rooms.forget(room)
            self._emit(Push("error", r))
            return
        j = self.rooms.on_joined(room, r, "since" in fields, self._now())
        self._emit(RoomRejoined(room, bool(j.recovered), r))  # first: a "missed" divider
        self._room_items(room, j.items, j.recover, "rejoin")

    # -- room gaps ---------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _room_items(self, room: str, items: Sequence[Frame | RoomGap],
                    recover: dict[str, Any] | None, via: str) -> None:
        """Messages (as RoomMessages, consecutive ones together) and gaps, in order; then
        the recovery the core asks for, if any."""
        st = self.rooms.get(room)
        epoch = st.epoch if st is not None else None
        batch: list[Frame] = []
        for item in items:
            if isinstance(item, RoomGap):
                if batch:
                    self._emit(RoomMessages(room, epoch, batch, via))
                    batch = []
                self._emit(item)
            else:
                batch.append(item)
        if batch:
            self._emit(RoomMessages(room, epoch, batch, via))
        if recover is not None:
            self._start_recovery(room, recover)

    def _start_recovery(self, room: str, fields: dict[str, Any]) -> None:
        self._spawn(self._recover(room, fields))

    async def _recover(self, room: str, fields: dict[str, Any]) -> None:
        """A recovery join (one in flight per room: the core holds the room's pushes
        until its reply is in)."""
        st = self.rooms.get(room)
        conn = self._writable()
        if st is None:
            return
        if conn is None:  # between connections: the next one's rejoin recovers
            st.on_recovery_lost()
            return
        try:
            r = await conn.request("join", self.request_timeout, **fields)
        except Disconnected:
            st.on_recovery_lost()
            return
        except TimeoutError:
            r = {"op": "error", "code": "timeout", "message": "recovery join timed out"}
        if self.rooms.get(room) is not st:
            return  # left meanwhile
        if r.get("op") != "joined":
            out = st.on_recovery_failed(self._now())
            self._emit(Push("error", r))
            self._room_items(room, out.items, out.recover, "live")
            return
        j = st.on_joined(r, "since" in fields, self._now())
        self._room_items(room, j.items, j.recover, "recovery")

