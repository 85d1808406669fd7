"""Room positions and the rejoin recipe (docs/protocol.md, "Client recipe:
reconnecting to a room"), pure.

Per room: the ``epoch`` and the highest ``pos`` shown, from ``joined`` (its
``epoch`` and ``pos``) and from the ``msgs`` of each ``room_msgs`` frame; a new
epoch replaces both. A message whose ``pos`` is not above the highest shown is
dropped (the overlap at a join, or a late one), unless ``keep_late``: then only
a position already seen is dropped (a bounded window of them), so a late
message still counts once. After a reconnect the room is joined again with
``since: {epoch, pos}``; without an epoch yet (no message so far) with
``history``. Messages without ``pos`` (history off on the node) always pass.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from imgate_client.core.frames import Frame

__all__ = ["Joined", "RoomState", "Rooms"]

REJOIN_HISTORY = 100  # the most a join may ask for


@dataclass
class Joined:
    """A ``joined`` reply as the client reads it."""

    room: str
    reply: Frame
    msgs: list[Frame]  # messages not shown before, in position order
    recovered: bool | None  # rejoin: nothing was missed (None: a first join)

    @property
    def online(self) -> int | None:
        v = self.reply.get("online")
        return v if isinstance(v, int) else None

    @property
    def users(self) -> int | None:
        v = self.reply.get("users")
        return v if isinstance(v, int) else None


@dataclass
class RoomState:
    """One room's position as shown (see the module docstring)."""

    room: str
    history: int | None = None  # what the first join asked for
    keep_late: bool = False
    window: int = 4096
    epoch: str | None = None
    pos: int = 0  # the highest position shown
    joined_before: bool = False
    _seen: set[int] = field(default_factory=set)
    _floor: int = 0  # keep_late: positions at or below it count as seen
    _held: list[Frame] | None = None  # room_msgs that came before the joined reply

    def join_fields(self, rejoin_history: int = REJOIN_HISTORY,
                    hold: bool = True) -> dict[str, Any]:
        """The fields of the next ``join``: ``since`` once the room has an epoch, else
        ``history`` (the first join's, or ``rejoin_history`` on a rejoin; 0: none).
        ``hold``: ``room_msgs`` frames wait for the reply (its messages come first,
        whatever the wire order); False: they are shown as they come."""
        fields: dict[str, Any] = {"room": self.room}
        self._held = [] if hold else None
        if self.epoch is not None:
            fields["since"] = {"epoch": self.epoch, "pos": self.pos}
        elif self.joined_before:
            if rejoin_history:
                fields["history"] = rejoin_history
        elif self.history:
            fields["history"] = self.history
        return fields

    def _new_epoch(self, epoch: object) -> None:
        if isinstance(epoch, str) and epoch != self.epoch:
            self.epoch, self.pos = epoch, 0
            self._seen.clear()
            self._floor = 0

    def accept(self, pos: object) -> bool:
        """True if the message at ``pos`` is to be shown (and records it)."""
        if not isinstance(pos, int) or isinstance(pos, bool):
            return True
        if not self.keep_late:
            if pos <= self.pos:
                return False
            self.pos = pos
            return True
        if pos <= self._floor or pos in self._seen:
            return False
        self._seen.add(pos)
        self.pos = max(self.pos, pos)
        if len(self._seen) > self.window:
            self._floor = max(self._seen) - self.window // 2
            self._seen = {p for p in self._seen if p > self._floor}
        return True

    def on_frame(self, frame: Frame) -> list[Frame]:
        """A ``room_msgs`` frame: its messages to show, in position order (none while a
        join is answered: they are shown after the reply's, by ``on_joined``)."""
        if self._held is not None:
            self._held.append(frame)
            return []
        self._new_epoch(frame.get("epoch"))
        msgs = frame.get("msgs") or ()
        return [m for m in msgs if isinstance(m, dict) and self.accept(m.get("pos"))]

    def on_joined(self, reply: Frame, since_sent: bool) -> Joined:
        """A ``joined`` reply to the join whose fields ``join_fields`` gave."""
        rejoin = self.joined_before
        before_epoch, before_pos = self.epoch, self.pos
        self.joined_before = True
        epoch = reply.get("epoch")
        if epoch is None:  # no message yet, or history off on the node
            if before_epoch is not None:  # a lost state cannot give the room back its past
                self._new_epoch_none()
        else:
            self._new_epoch(epoch)
        raw = [m for m in reply.get("msgs") or () if isinstance(m, dict)]
        msgs = [m for m in raw if self.accept(m.get("pos"))]
        pos = reply.get("pos")
        if isinstance(pos, int) and pos > self.pos and self.epoch is not None:
            self.pos = pos  # owed nothing up to the room's last position
        held, self._held = self._held or [], None
        for frame in held:
            msgs += self.on_frame(frame)
        recovered: bool | None = None
        if rejoin:
            if since_sent:
                recovered = reply.get("recovered") is True
            elif epoch is None:  # the room had no message then, and has none now
                recovered = before_pos == 0 and reply.get("pos") in (0, None)
            else:  # history from an empty start: complete if it goes back to pos 1
                positions = [m.get("pos") for m in raw]
                recovered = bool(positions) and positions[0] == 1 and positions[-1] == pos
        return Joined(self.room, reply, msgs, recovered)

    def on_join_failed(self) -> None:
        """The join was refused or lost: frames held for it go."""
        self._held = None

    def _new_epoch_none(self) -> None:
        self.epoch, self.pos = None, 0
        self._seen.clear()
        self._floor = 0


class Rooms:
    """The rooms a client is in, by id."""

    def __init__(self, *, keep_late: bool = False, rejoin_history: int = REJOIN_HISTORY) -> None:
        self.keep_late = keep_late
        self.rejoin_history = rejoin_history
        self._rooms: dict[str, RoomState] = {}

    def __contains__(self, room: object) -> bool:
        return room in self._rooms

    def __iter__(self) -> Iterator[RoomState]:
        return iter(list(self._rooms.values()))

    def get(self, room: str) -> RoomState | None:
        return self._rooms.get(room)

    def join_fields(self, room: str, history: int | None = None) -> dict[str, Any]:
        """Fields of a ``join`` of ``room``: a room known here rejoins with ``since``."""
        st = self._rooms.get(room)
        if st is None:
            st = self._rooms[room] = RoomState(room, history, self.keep_late)
        return st.join_fields(self.rejoin_history)

    def on_joined(self, room: str, reply: Frame, since_sent: bool) -> Joined:
        st = self._rooms.get(room)
        if st is None:
            st = self._rooms[room] = RoomState(room, None, self.keep_late)
        return st.on_joined(reply, since_sent)

    def on_room_msgs(self, frame: Frame) -> tuple[str, list[Frame]] | None:
        """A ``room_msgs`` frame: its room and the messages to show; None for a room
        this client is not in."""
        st = self._rooms.get(str(frame.get("room")))
        if st is None:
            return None
        return st.room, st.on_frame(frame)

    def forget(self, room: str) -> None:
        """Left (or kicked): not rejoined after a reconnect."""
        self._rooms.pop(room, None)
