"""The ``Client`` ops that are one request each: read, typing, recall, presence,
rooms. A mixin on ``Client``'s request machinery (``request``: on the connection
up, waiting for one; ``retry`` for the idempotent ones)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import Frame, Joined, Rooms, make

__all__ = ["Ops"]


class Ops:
    """Read, typing, recall, presence and rooms (see the module docstring)."""

    rooms: Rooms
    presence: set[str]  # users watched (resubscribed after a reconnect)

    async def request(self, op: str, *, retry: bool = False, timeout: float | None = None,
                      **fields: Any) -> Frame:
        raise NotImplementedError

    def _writable(self) -> Connection | None:
        """The connection up, if frames may go out on it now."""
        raise NotImplementedError

    def _now(self) -> float:
        raise NotImplementedError

    def _start_recovery(self, room: str, fields: dict[str, Any]) -> None:
        """Send the recovery join ``fields`` of ``room`` (RoomOut.recover)."""
        raise NotImplementedError

    async def read(self, conv: str, mid: int) -> None:
        """Read ``conv`` (a peer, or ``g:GROUP``) up to ``mid``."""
        await self.request("read", retry=True, conv=conv, mid=mid)

    async def typing(self, conv: str) -> bool:
        """Tell ``conv`` the user is typing; False if not connected (not worth a wait)."""
        conn = self._writable()
        if conn is None:
            return False
        try:
            await conn.send(make("typing", conv=conv))
        except Disconnected:
            return False
        return True

    async def recall(self, mid: int) -> None:
        await self.request("recall", retry=True, mid=mid)

    async def presence_sub(self, users: Iterable[str]) -> dict[str, Any]:
        """Watch ``users`` (kept across reconnects); their presence now."""
        users = list(users)
        self.presence.update(users)
        r = await self.request("presence_sub", retry=True, users=users)
        got: dict[str, Any] = r.get("users") or {}
        return got

    async def presence_unsub(self, users: Iterable[str]) -> None:
        users = list(users)
        self.presence.difference_update(users)
        await self.request("presence_unsub", retry=True, users=users)

    async def join(self, room: str, *, history: int | None = None,
                   recover_jumps: bool | None = None) -> Joined:
        """Join ``room`` (``history``: its last N messages). A room joined before (and
        not left) is joined with ``since``: ``Joined.msgs`` are only those not shown
        (``Joined.items``: with a ``RoomGap`` before them where some could not be).
        ``recover_jumps``: this room's switch of automatic jump recovery (None: the
        client's ``room_recover_jumps``)."""
        fields = self.rooms.join_fields(room, history, recover_jumps)
        try:
            reply = await self.request("join", retry=True, **fields)
        except BaseException:
            st = self.rooms.get(room)
            if st is not None:
                st.on_join_failed()
                if not st.joined_before:
                    self.rooms.forget(room)
            raise
        j = self.rooms.on_joined(room, reply, "since" in fields, self._now())
        if j.recover is not None:
            self._start_recovery(room, j.recover)
        return j

    def recover_jumps(self, room: str, on: bool) -> None:
        """Turn automatic recovery of jumps in ``pos`` on or off for a joined room (a
        ``room_gap`` is always acted on; a jump not recovered is told as ``RoomGap``)."""
        st = self.rooms.get(room)
        if st is not None:
            st.recover_jumps = on

    async def leave(self, room: str) -> None:
        self.rooms.forget(room)
        await self.request("leave", retry=True, room=room)

    async def room_send(self, room: str, body: Any, *, prio: int = 0) -> None:
        """A room message (live traffic: not retried, the node has no dedup for it)."""
        await self.request("room_send", room=room, body=body, prio=prio)
