"""The ``Client`` ops that are one request each: read, typing, recall, edit,
reactions, presence, rooms, and the HTTP calls of reactions and conversation
settings. A mixin on ``Client``'s request machinery (``request``: on the
connection up, waiting for one; ``retry`` for the idempotent ones; ``http``:
the node's API as the user)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import Frame, Joined, Rooms, make

__all__ = ["ConvSettings", "Ops", "ReactionUsers"]


@dataclass(frozen=True)
class ConvSettings:
    """The user's settings of one conversation (a peer, or ``g:GROUP``): the answer
    of ``set_conversation``, and the fields of a ``conv_settings`` push."""

    conv: str
    muted: bool
    pinned: bool
    archived: bool

    @classmethod
    def of(cls, frame: Frame) -> ConvSettings:
        """From a ``PATCH /v1/conversations/{conv}`` answer or a ``conv_settings`` push."""
        return cls(str(frame["conv"]), frame.get("muted") is True,
                   frame.get("pinned") is True, frame.get("archived") is True)


@dataclass(frozen=True)
class ReactionUsers:
    """A page of who reacted to a message with one emoji, by user id; ``cursor``:
    the next page's (None: this is the last)."""

    users: list[str]
    cursor: str | None


class Ops:
    """Read, typing, recall, edit, reactions, conversation settings, presence and
    rooms (see the module docstring)."""

    rooms: Rooms
    presence: set[str]  # users watched (resubscribed after a reconnect)

    async def request(self, op: str, *, retry: bool = False, timeout: float | None = None,
                      **fields: Any) -> Frame:
        raise NotImplementedError

    async def http(self, method: str, path: str, *, json: Any = None,
                   params: dict[str, Any] | None = None) -> Any:
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

    async def edit(self, mid: int, body: Any) -> None:
        """Replace the body of one of the user's own messages (1:1 or group) within
        the node's edit window (``IM_EDIT_WINDOW_S``, 900 s by default). Every device
        of both users, or the group's members online, get ``Push("edited")`` (this
        one too); sync and history then carry the new body and ``edited``.
        ServerError ``forbidden`` (someone else's, past the window, recalled),
        ``not_found``. Asked again on the next connection if this one is lost first
        (the same body again: at most a second ``edited`` push)."""
        await self.request("edit", retry=True, mid=mid, body=body)

    async def react(self, mid: int, emoji: str, on: bool = True) -> None:
        """Add (``on``) or remove the user's ``emoji`` (1-32 printable characters) on
        a message of one of its conversations. A change is pushed as
        ``Push("reaction")`` to every device of both users (this one too), or to the
        group's members online; the state the user already has changes and pushes
        nothing. ServerError ``not_found`` (not a participant), ``forbidden`` (a
        recalled message, or a new emoji past the node's per-message cap)."""
        await self.request("react", retry=True, mid=mid, emoji=emoji, on=on)

    async def reaction_users(self, mid: int, emoji: str, cursor: str | None = None,
                             limit: int = 100) -> ReactionUsers:
        """Who reacted to message ``mid`` with ``emoji``, a page of at most ``limit``
        (1-200) user ids in id order; ``cursor``: the last page's ``cursor``.
        ``GET /v1/messages/{mid}/reactions``; HttpError 404 for a message not in the
        user's conversations."""
        params: dict[str, Any] = {"emoji": emoji, "limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        r = await self.http("GET", f"/v1/messages/{int(mid)}/reactions", params=params)
        nxt = r.get("cursor")
        return ReactionUsers([str(u) for u in r.get("users") or ()],
                             nxt if isinstance(nxt, str) else None)

    async def set_conversation(self, conv: str, *, muted: bool | None = None,
                               pinned: bool | None = None,
                               archived: bool | None = None) -> ConvSettings:
        """Change the user's settings of ``conv`` (a peer, or ``g:GROUP``): those given,
        the others stay as they are; the three as they are now. Every device of the
        user gets ``Push("conv_settings")``. ``PATCH /v1/conversations/{conv}``;
        HttpError 403 past the node's pinned cap or for a group the user is not in,
        400 for the user's own id."""
        changes = {k: v for k, v in (("muted", muted), ("pinned", pinned),
                                     ("archived", archived)) if v is not None}
        r = await self.http("PATCH", f"/v1/conversations/{quote(conv, safe=':')}",
                            json=changes)
        return ConvSettings.of(r)

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
