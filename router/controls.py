"""Inter-node controls: typed messages that change what a node's own devices
are (their groups, their room sanctions, whether they stay connected).

A control is taken by one node (the one serving the server API call or the
group change) and applied on every node holding a device of its users
(``Router.tell`` / ``tell_all``): here at once, elsewhere through the
broker, ahead of anything published after it. On the wire it is a small
JSON object under the envelope's ``CONTROL`` header (``encode`` /
``decode``), the same shape every version of the node has used, so nodes of
two versions understand each other during a rolling upgrade.

``Controls`` dispatches a control to its handler by type. The composition
root builds it before the router and registers each handler once its
target exists; ``complete`` says whether every kind has one. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Close", "CloseConn", "Control", "Controls", "GroupAdd", "GroupDel", "RelationChange",
           "Revoke", "RoomKick", "RoomMute", "RoomUnmute", "Unban", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class GroupAdd:
    """The users joined ``group``: their devices get its pushes."""

    group: str


@dataclass(frozen=True, slots=True)
class GroupDel:
    """The users left ``group`` (or it was dissolved): no more of its pushes."""

    group: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close the users' connections (4003) with ``reason``; ``ban``: they are
    banned, so a handshake that registers just after this is closed too."""

    reason: str
    ban: bool = False


@dataclass(frozen=True, slots=True)
class CloseConn:
    """Close one connection, ``conn`` ("node:id"), with ``code`` and ``reason``
    (another of its slot replaced it: 4005; the server API closed it: 4003).
    Only the node named in ``conn`` acts; a node of an older version drops it."""

    conn: str
    code: int
    reason: str


@dataclass(frozen=True, slots=True)
class Revoke:
    """Tokens issued before ``before`` (unix s) are revoked: close those."""

    before: float


@dataclass(frozen=True, slots=True)
class Unban:
    """The users' ban ended."""


@dataclass(frozen=True, slots=True)
class RoomMute:
    """The users may not send to ``room`` until ``until`` (unix s)."""

    room: str
    until: float


@dataclass(frozen=True, slots=True)
class RoomUnmute:
    room: str


@dataclass(frozen=True, slots=True)
class RoomKick:
    """The users leave ``room``; each device there is told ``left`` (kicked)."""

    room: str


@dataclass(frozen=True, slots=True)
class RelationChange:
    """The users' privacy settings, blocks or contacts changed: what a node
    remembers of them is stale."""


Control = (GroupAdd | GroupDel | Close | CloseConn | Revoke | Unban | RoomMute | RoomUnmute
           | RoomKick | RelationChange)
KINDS: tuple[type[Control], ...] = (GroupAdd, GroupDel, Close, CloseConn, Revoke, Unban, RoomMute,
                                    RoomUnmute, RoomKick, RelationChange)


def encode(ctl: Control) -> dict[str, Any]:
    """The control's wire form."""
    if isinstance(ctl, GroupAdd | GroupDel):
        return {"op": "gadd" if isinstance(ctl, GroupAdd) else "gdel", "g": ctl.group}
    if isinstance(ctl, Close):
        return {"op": "close", "reason": ctl.reason, "ban": 1} if ctl.ban else \
            {"op": "close", "reason": ctl.reason}
    if isinstance(ctl, CloseConn):
        return {"op": "cclose", "conn": ctl.conn, "code": ctl.code, "reason": ctl.reason}
    if isinstance(ctl, Revoke):
        return {"op": "revoke", "before": ctl.before}
    if isinstance(ctl, Unban):
        return {"op": "unban"}
    if isinstance(ctl, RelationChange):
        return {"op": "rel"}
    if isinstance(ctl, RoomMute):
        return {"op": "rmute", "room": ctl.room, "until": ctl.until}
    return {"op": "runmute" if isinstance(ctl, RoomUnmute) else "rkick", "room": ctl.room}


def decode(raw: object) -> Control | None:
    """A control from its wire form; None for one this version does not know or
    that is malformed (the caller drops it, counted)."""
    if not isinstance(raw, dict):
        return None
    op = raw.get("op")
    text = _text(raw, "g" if op in ("gadd", "gdel") else "room")
    if op == "gadd" and text is not None:
        return GroupAdd(text)
    if op == "gdel" and text is not None:
        return GroupDel(text)
    if op == "close":
        return Close(str(raw.get("reason") or "closed by the server")[:100], bool(raw.get("ban")))
    if op == "cclose":
        conn, code = _text(raw, "conn"), _number(raw, "code")
        if conn is None or code is None or not 4000 <= code <= 4999:
            return None
        return CloseConn(conn, int(code), str(raw.get("reason") or "closed by the server")[:100])
    if op == "revoke":
        before = _number(raw, "before")
        return None if before is None else Revoke(before)
    if op == "unban":
        return Unban()
    if op == "rel":
        return RelationChange()
    if text is None:
        return None
    if op == "rmute":
        until = _number(raw, "until")
        return None if until is None else RoomMute(text, until)
    if op == "runmute":
        return RoomUnmute(text)
    return RoomKick(text) if op == "rkick" else None


def _text(raw: dict[Any, Any], key: str) -> str | None:
    value = raw.get(key)
    return value if isinstance(value, str) else None


def _number(raw: dict[Any, Any], key: str) -> float | None:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


C = TypeVar("C", bound=Control)
# Applies a control's in-memory part at once (so an envelope after it on the
# node's queue sees it applied) and returns what must still be awaited
# (binding a queue, closing sockets), or None.
Handler = Callable[[list[str], Any], Awaitable[Any] | None]


class Controls:
    """Control kind -> the handler that applies it to this node's devices."""

    def __init__(self, applied: Callable[[str], None] = lambda _kind: None) -> None:
        self._handlers: dict[type[Any], Handler] = {}
        self._applied = applied  # counts each control applied here, by kind

    def handle(self, kind: type[C], handler: Callable[[list[str], C], Awaitable[Any] | None]
               ) -> None:
        """``handler`` applies controls of ``kind`` from now on (once per kind)."""
        if kind in self._handlers:
            raise ValueError(f"{kind.__name__} already has a handler")
        self._handlers[kind] = handler

    def missing(self) -> list[str]:
        """The kinds without a handler (the composition root registers all)."""
        return [k.__name__ for k in KINDS if k not in self._handlers]

    def apply(self, users: list[str], ctl: Control) -> Awaitable[Any] | None:
        """Apply ``ctl`` to ``users``' devices here; what is left to await, if any."""
        handler = self._handlers.get(type(ctl))
        if handler is None:
            return None
        self._applied(type(ctl).__name__)
        return handler(users, ctl)
