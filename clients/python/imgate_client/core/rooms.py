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

Gaps (``on_push``, ``on_joined``): ``pos`` is also the last *contiguous*
position: a ``room_msgs`` whose next new position is above ``pos + 1`` (same
epoch) is a jump. The messages before the jump are shown; the rest wait while
the hole is recovered with a ``join`` ``since: {epoch, pos}`` (``RoomOut.recover``:
the fields to send; at most one recovery in flight per room: frames that come
meanwhile wait too). The reply's ``msgs`` fill the hole, then the waiting
messages follow, in position order, each position once; what the reply could
not give back is told as a ``RoomGap`` placed before the messages after it. A
``room_gap`` frame starts the same recovery (always, whatever the switches
below). Automatic jump recovery can be turned off (``recover_jumps``) and is
rate limited (one per ``recover_interval`` seconds per room): a jump not
recovered is told as a ``RoomGap`` (``reason`` ``off`` / ``rate_limited``) and
its messages are shown at once. Never a silent jump.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from imgate_client.core.frames import Frame

__all__ = ["Joined", "RoomGap", "RoomOut", "RoomState", "Rooms"]

REJOIN_HISTORY = 100  # the most a join may ask for
RECOVER_INTERVAL = 2.0  # seconds between two automatic jump recoveries of a room


def _is_pos(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ranges(first: int, last: int, have: set[int]) -> tuple[tuple[int, int], ...]:
    """The inclusive ranges of ``first..last`` not in ``have``."""
    out: list[tuple[int, int]] = []
    start = first
    for p in sorted(x for x in have if first <= x <= last):
        if p > start:
            out.append((start, p - 1))
        start = p + 1
    if start <= last:
        out.append((start, last))
    return tuple(out)


@dataclass(frozen=True)
class RoomGap:
    """Positions of a room the client will not show, told before the messages that
    follow them. ``after``: the last position shown before the hole (in ``epoch``);
    ``missing``: the positions not shown, as inclusive ``(first, last)`` ranges
    (empty when unknown: the room changed epoch); ``recovered``: the positions the
    recovery did bring back (shown right after this); ``reason``: ``not_kept`` (the
    node no longer keeps them: ``recovered: false``), ``epoch`` (the room lost its
    state), ``off`` (jump recovery turned off), ``rate_limited`` (a recovery of
    this room ran less than ``recover_interval`` ago), ``failed`` (the recovery
    join was refused or timed out)."""

    room: str
    epoch: str | None
    after: int
    missing: tuple[tuple[int, int], ...]
    recovered: tuple[int, ...] = ()
    reason: str = "not_kept"

    @property
    def count(self) -> int:
        """How many positions are missing (0: unknown, or none)."""
        return sum(b - a + 1 for a, b in self.missing)


@dataclass
class RoomOut:
    """What a room push (or a recovery answer) gives: ``items``, the messages to show
    and ``RoomGap``s, in order; ``recover``: the fields of a ``join`` to send now
    (a recovery), whose reply goes to ``on_joined(reply, since_sent=True)``."""

    room: str
    items: list[Frame | RoomGap] = field(default_factory=list)
    recover: dict[str, Any] | None = None

    @property
    def msgs(self) -> list[Frame]:
        return [m for m in self.items if not isinstance(m, RoomGap)]

    @property
    def gaps(self) -> list[RoomGap]:
        return [m for m in self.items if isinstance(m, RoomGap)]


@dataclass
class Joined:
    """A ``joined`` reply as the client reads it."""

    room: str
    reply: Frame
    msgs: list[Frame]  # messages not shown before, in position order
    recovered: bool | None  # rejoin: nothing was missed (None: a first join)
    items: list[Frame | RoomGap] = field(default_factory=list)  # msgs, with gaps, in order
    recover: dict[str, Any] | None = None  # a recovery join to send now (see RoomOut)

    @property
    def gaps(self) -> list[RoomGap]:
        return [m for m in self.items if isinstance(m, RoomGap)]

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
    recover_jumps: bool = True  # a jump in pos is recovered (else told as a RoomGap)
    recover_interval: float = RECOVER_INTERVAL  # at most one jump recovery per this long
    _seen: set[int] = field(default_factory=set)
    _floor: int = 0  # keep_late: positions at or below it count as seen
    _held: list[Frame] | None = None  # room pushes that came before the joined reply
    _recovering: bool = False  # a recovery join is in flight
    _last_auto: float | None = None  # when the last jump recovery started
    _tell_next: str | None = None  # a failed recovery: the next jump is told with this

    @property
    def recovering(self) -> bool:
        """A recovery join is in flight (pushes wait for its reply)."""
        return self._recovering

    def join_fields(self, rejoin_history: int = REJOIN_HISTORY,
                    hold: bool = True) -> dict[str, Any]:
        """The fields of the next ``join``: ``since`` once the room has an epoch, else
        ``history`` (the first join's, or ``rejoin_history`` on a rejoin; 0: none).
        ``hold``: ``room_msgs`` frames wait for the reply (its messages come first,
        whatever the wire order); False: they are shown as they come."""
        fields: dict[str, Any] = {"room": self.room}
        if not hold:
            self._held = None
        elif self._held is None:
            self._held = []  # (frames held by a recovery cut short stay held)
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

    def on_joined(self, reply: Frame, since_sent: bool, now: float = 0.0) -> Joined:
        """A ``joined`` reply to the join whose fields ``join_fields`` (or a recovery,
        ``RoomOut.recover``) gave. ``Joined.items``: a ``RoomGap`` first when positions
        after the ``since`` sent could not be given back, then the messages."""
        rejoin = self.joined_before
        self._recovering = False
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
        items: list[Frame | RoomGap] = []
        if since_sent and before_epoch is not None and not self.keep_late:
            got = tuple(m["pos"] for m in msgs if _is_pos(m.get("pos")))
            if self.epoch != before_epoch:
                items.append(RoomGap(self.room, before_epoch, before_pos, (), got, "epoch"))
            elif self.pos > before_pos:
                missing = _ranges(before_pos + 1, self.pos, set(got))
                if missing:
                    items.append(RoomGap(self.room, self.epoch, before_pos, missing, got))
        items.extend(msgs)
        held, self._held = self._held or [], None
        if before_epoch is not None and self.epoch != before_epoch:
            # What waited from the epoch left is covered by the gap told above.
            held = [f for f in held if f.get("epoch") != before_epoch]
        out = RoomOut(self.room, items)
        for frame in held:
            self._feed(frame, now, out)
        recovered: bool | None = None
        if rejoin:
            if since_sent:
                recovered = reply.get("recovered") is True
            elif epoch is None:  # the room had no message then, and has none now
                recovered = before_pos == 0 and reply.get("pos") in (0, None)
            else:  # history from an empty start: complete if it goes back to pos 1
                positions = [m.get("pos") for m in raw]
                recovered = bool(positions) and positions[0] == 1 and positions[-1] == pos
        return Joined(self.room, reply, out.msgs, recovered, out.items, out.recover)

    # -- gaps --------------------------------------------------------------------------
    def on_push(self, frame: Frame, now: float) -> RoomOut:
        """A ``room_msgs`` or ``room_gap`` frame (``now``: seconds, any monotonic clock):
        what to show, and maybe a recovery to send (see the module docstring)."""
        out = RoomOut(self.room)
        self._feed(frame, now, out)
        return out

    def on_recovery_failed(self, now: float) -> RoomOut:
        """The recovery join was refused or timed out: the waiting messages are shown,
        the hole before them told as a ``RoomGap`` (``failed``)."""
        self._recovering = False
        held, self._held = self._held or [], None
        self._tell_next = "failed"
        out = RoomOut(self.room)
        for frame in held:
            self._feed(frame, now, out)
        return out

    def on_recovery_lost(self) -> None:
        """The connection went with the recovery in flight: the waiting messages stay
        held for the rejoin of the next connection (``since`` the same position)."""
        self._recovering = False

    def _jump_policy(self, now: float) -> str | None:
        """None: recover this jump; else why not."""
        if self._tell_next is not None:
            return self._tell_next
        if not self.recover_jumps:
            return "off"
        if self._last_auto is not None and now - self._last_auto < self.recover_interval:
            return "rate_limited"
        return None

    def _start_recovery(self, out: RoomOut, epoch: object) -> None:
        self._recovering = True
        self._held = []
        since_epoch = self.epoch if self.epoch is not None else epoch
        since_pos = self.pos if self.epoch is not None else 0
        if isinstance(since_epoch, str):
            out.recover = {"room": self.room, "since": {"epoch": since_epoch, "pos": since_pos}}
        else:  # nothing to say since: ask for what is kept
            out.recover = {"room": self.room, "history": REJOIN_HISTORY}

    def _feed(self, frame: Frame, now: float, out: RoomOut) -> None:
        if self._held is not None:  # a join or a recovery is answered first
            self._held.append(frame)
            return
        if frame.get("op") == "room_gap":  # always acted on
            self._start_recovery(out, frame.get("epoch"))
            return
        if self.keep_late:
            out.items.extend(self.on_frame(frame))
            return
        self._new_epoch(frame.get("epoch"))
        msgs = [m for m in frame.get("msgs") or () if isinstance(m, dict)]
        for i, m in enumerate(msgs):
            p = m.get("pos")
            if not _is_pos(p) or self.epoch is None:
                out.items.append(m)  # no positions on this node: as they come
                continue
            assert isinstance(p, int)
            if p <= self.pos:
                continue  # shown already (the overlap at a join, or a late one)
            if p > self.pos + 1 and self.joined_before:
                reason = self._jump_policy(now)
                if reason is None:
                    self._last_auto = now
                    self._start_recovery(out, self.epoch)
                    assert self._held is not None
                    self._held.append({**frame, "msgs": msgs[i:]})
                    return
                out.items.append(RoomGap(self.room, self.epoch, self.pos,
                                         ((self.pos + 1, p - 1),), (), reason))
            self._tell_next = None
            self.pos = p
            out.items.append(m)

    def on_join_failed(self) -> None:
        """The join was refused or lost: frames held for it go."""
        self._held = None

    def _new_epoch_none(self) -> None:
        self.epoch, self.pos = None, 0
        self._seen.clear()
        self._floor = 0


class Rooms:
    """The rooms a client is in, by id."""

    def __init__(self, *, keep_late: bool = False, rejoin_history: int = REJOIN_HISTORY,
                 recover_jumps: bool = True,
                 recover_interval: float = RECOVER_INTERVAL) -> None:
        self.keep_late = keep_late
        self.rejoin_history = rejoin_history
        self.recover_jumps = recover_jumps  # the default of rooms joined from now on
        self.recover_interval = recover_interval
        self._rooms: dict[str, RoomState] = {}

    def _new(self, room: str, history: int | None) -> RoomState:
        st = self._rooms[room] = RoomState(room, history, self.keep_late,
                                           recover_jumps=self.recover_jumps,
                                           recover_interval=self.recover_interval)
        return st

    def __contains__(self, room: object) -> bool:
        return room in self._rooms

    def __iter__(self) -> Iterator[RoomState]:
        return iter(list(self._rooms.values()))

    def get(self, room: str) -> RoomState | None:
        return self._rooms.get(room)

    def join_fields(self, room: str, history: int | None = None,
                    recover_jumps: bool | None = None) -> dict[str, Any]:
        """Fields of a ``join`` of ``room``: a room known here rejoins with ``since``.
        ``recover_jumps``: this room's switch (None: as it was, else the default)."""
        st = self._rooms.get(room)
        if st is None:
            st = self._new(room, history)
        if recover_jumps is not None:
            st.recover_jumps = recover_jumps
        return st.join_fields(self.rejoin_history)

    def on_joined(self, room: str, reply: Frame, since_sent: bool, now: float = 0.0) -> Joined:
        st = self._rooms.get(room)
        if st is None:
            st = self._new(room, None)
        return st.on_joined(reply, since_sent, now)

    def on_push(self, frame: Frame, now: float) -> RoomOut | None:
        """A ``room_msgs`` or ``room_gap`` frame (see ``RoomState.on_push``); None for a
        room this client is not in."""
        st = self._rooms.get(str(frame.get("room")))
        if st is None:
            return None
        return st.on_push(frame, now)

    def on_room_msgs(self, frame: Frame) -> tuple[str, list[Frame]] | None:
        """A ``room_msgs`` frame: its room and the messages to show; None for a room
        this client is not in. The plain recipe, without gap recovery (``on_push``)."""
        st = self._rooms.get(str(frame.get("room")))
        if st is None:
            return None
        return st.room, st.on_frame(frame)

    def forget(self, room: str) -> None:
        """Left (or kicked): not rejoined after a reconnect."""
        self._rooms.pop(room, None)
