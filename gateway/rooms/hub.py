"""The node's local room map and the coalescer that writes room traffic.

``members`` is a ``ConnectionIndex`` (room -> {conn id: client}): joining
and leaving are O(1) and a room with no local member leaves it. A room
message (already-encoded fragment, from a local sender or another node) is
queued for its room; the first one queued schedules that room's flush, so
idle rooms and idle members cost nothing per message. Flushes of one room
are at least a window apart: a message to a quiet room goes out in the next
loop tick, a busy room's messages are gathered until a window after its last
flush. A flush applies the room's delivery cap, builds the ``room_msgs``
frame(s) and their WebSocket wire bytes once, and hands the same bytes for
every member to the node's ``SocketWriter`` (no await; a member whose write
buffer is over the bound misses the frame, counted, and is noted as stuck).

A room with more local members than ``write_at_once`` is written by a
cursor, ``write_chunk`` members per loop turn (``gateway.rooms.ring``): one big
room's frame never holds the loop for the whole write (10,000 loopback writes
take ~90 ms here), each member gets one write per pass with every frame it
lacks, and a message waits at most one pass. Smaller rooms are written at
once.

Positioned messages (``pos`` and ``epoch``) leave in position order: a
flush sorts its window, and when positions are missing between the last one
this node delivered and the window's, waits for them once, up to
``reorder_s`` (the publishing nodes' messages cross the broker separately).
If they are still missing then, this node may have missed them (its broker
link was lost, an envelope was dropped): the room's flushes wait while its
history is read (``when_gap`` hooks; ``recovered`` with the answer), the
missing messages go out late but in position order, and where they are no
longer kept each member is told ``room_gap`` first. After a broker outage
every local room is checked the same way (``suspect_all``), also when no
later message would reveal the gap. Past ``recover_s`` without an answer the
members are told ``room_gap`` and the room goes on. So a member never sees a
room's positions jump without being told, and the highest it saw is where a
recovery starts.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from core.room_history import RoomLog, catch_up, entry_pos_ts
from gateway import frames
from gateway.hub import Client, ConnectionIndex, Hub
from gateway.metrics import NodeMetrics
from gateway.rooms.coalesce import DeliveryCap, room_frames, sample
from gateway.rooms.ring import RoomRing, first_pass
from gateway.wire import ws_text_frame

__all__ = ["RoomHub", "RoomLimits"]


@dataclass(frozen=True)
class RoomLimits:
    window_s: float = 0.025  # coalescing window
    rate_cap: float = 50.0  # messages/s to each member of a room; 0: no cap
    frame_max: int = 65_536  # bytes per room_msgs frame
    buffer_max: int = 262_144  # socket write buffer past which room frames skip a member
    pending_max: int = 10_000  # messages queued per room per window; more are dropped
    reorder_s: float = 0.05  # a gap in a room's positions is waited for this long
    write_at_once: int = 1000  # rooms up to this many local members are written at once
    write_chunk: int = 25  # members of a bigger room written per loop turn
    recover_s: float = 2.0  # a room waits this long for its history after a gap
    history_ttl_s: float = 300.0  # kept messages older than this are gone (IM_ROOM_HISTORY_TTL_S)


# A room whose order may have a hole: (room, epoch, last position delivered before it).
Gap = tuple[str, str, int]


class _Window:
    """A room's messages waiting for its next flush."""

    __slots__ = ("frags", "prios", "poss", "epochs", "held", "since")

    def __init__(self, since: float) -> None:
        self.since = since  # time.monotonic() when the oldest message came
        self.frags: list[bytes] = []
        self.prios: list[int] = []
        self.poss: list[int] = []  # 0: not positioned (history off)
        self.epochs: list[str | None] = []
        self.held = False  # waited for missing positions once already


class RoomHub:
    """Room -> local members, and the per-room coalescing queues."""

    def __init__(self, hub: Hub, metrics: NodeMetrics, limits: RoomLimits,
                 rng: random.Random | None = None) -> None:
        self.hub = hub
        self.metrics = metrics
        self.limits = limits
        self.members: ConnectionIndex[str] = ConnectionIndex("rooms")
        self._users: dict[str, dict[str, int]] = {}  # room -> user -> its connections here
        self._pending: dict[str, _Window] = {}
        # room -> (epoch, next position to send); epoch None: the room's first
        self._next: dict[str, tuple[str | None, int]] = {}
        self._caps: dict[str, DeliveryCap] = {}
        self._last_flush: dict[str, float] = {}  # room -> loop time of its last flush
        self._rings: dict[str, RoomRing] = {}  # big rooms with frames still being written
        # room -> (deadline, answered): its history is being read after a gap
        self._recovering: dict[str, tuple[float, bool]] = {}
        self._on_gap: list[Callable[[str, str, int], None]] = []
        self._writing = False  # ``_write_some`` is scheduled
        self._counted = [0, 0]  # writes and deliveries of passes under way, not counted yet
        self._rng = rng or random.Random()
        m = metrics
        self._m_in = m.room_msgs_in
        self._m_cap = m.room_dropped.labels("cap")
        self._m_overflow = m.room_dropped.labels("overflow")
        self._m_nobody = m.room_dropped.labels("no_members")
        self._m_frames = m.room_frames
        self._m_writes = m.room_writes
        self._m_delivered = m.room_delivered
        self._m_skipped = m.room_skipped
        self._m_flush = m.room_flush_seconds
        self._m_held = m.room_held
        self._m_recovery = m.room_recoveries
        self._m_window = m.room_stage.labels("window")
        self._m_write = m.room_stage.labels("write")

    # -- membership ----------------------------------------------------------
    @property
    def memberships(self) -> int:
        return self.members.memberships

    def join(self, client: Client, room: str) -> bool:
        """Add ``client`` to ``room``; True if it is the room's first local member."""
        if client.rooms is None or room not in client.rooms:
            users = self._users.setdefault(room, {})
            users[client.user] = users.get(client.user, 0) + 1
            if (ring := self._rings.get(room)) is not None:
                ring.joined(client)
        first = self.members.add(room, client)
        self._gauges()
        return first

    def leave(self, client: Client, room: str) -> bool:
        """Remove ``client`` from ``room``; True if that emptied the room here."""
        if client.rooms is not None and room in client.rooms:
            self._user_left(room, client.user)
            if (ring := self._rings.get(room)) is not None:
                ring.left(client.id)
        emptied = self.members.remove(room, client)
        if emptied:
            self._forget(room)
        self._gauges()
        return emptied

    def leave_all(self, client: Client) -> tuple[list[str], list[str]]:
        """Remove ``client`` from every room: (rooms left, rooms emptied)."""
        left, emptied = self.members.remove_all(client)
        for room in left:
            self._user_left(room, client.user)
            if (ring := self._rings.get(room)) is not None:
                ring.left(client.id)
        for room in emptied:
            self._forget(room)
        if left:
            self._gauges()
        return left, emptied

    def _user_left(self, room: str, user: str) -> None:
        users = self._users.get(room)
        if users is None:
            return
        n = users.get(user, 0) - 1
        if n > 0:
            users[user] = n
        else:
            users.pop(user, None)
            if not users:
                del self._users[room]

    def expect(self, room: str, epoch: str | None, pos: int) -> None:
        """A member joined when the room was at ``pos`` (of ``epoch``; None: no
        message yet): later positions go out in order from there. Only for a
        room whose order this node does not follow yet."""
        if room in self.members and room not in self._next:
            self._next[room] = (epoch, pos + 1)

    def count(self, room: str) -> int:
        """Local connections in ``room``."""
        return self.members.count(room)

    def users(self, room: str) -> int:
        """Distinct users with a connection in ``room`` here."""
        return len(self._users.get(room, ()))

    def _forget(self, room: str) -> None:
        """An emptied room keeps no state (a pending flush finds no members)."""
        self._caps.pop(room, None)
        self._last_flush.pop(room, None)
        self._next.pop(room, None)
        self._rings.pop(room, None)
        self._recovering.pop(room, None)
        self._count()

    def _gauges(self) -> None:
        self.metrics.rooms.set(len(self.members))
        self.metrics.room_members.set(self.memberships)

    # -- gaps ----------------------------------------------------------------
    def when_gap(self, hook: Callable[[str, str, int], None]) -> None:
        """Call ``hook(room, epoch, after)`` when ``room`` may have missed the
        messages after position ``after``; the answer comes to ``recovered``."""
        self._on_gap.append(hook)

    def suspect_all(self) -> list[Gap]:
        """This node may have missed room messages (its broker link was lost):
        every local room with a known position is checked against its history."""
        gaps = [(room, epoch, nxt - 1) for room, (epoch, nxt) in self._next.items()
                if epoch is not None and room in self.members]
        for room, epoch, after in gaps:
            self._recover(room, epoch, after)
        return gaps

    def _recover(self, room: str, epoch: str, after: int) -> None:
        if room in self._recovering and not self._recovering[room][1]:
            return  # a read is under way
        self._recovering[room] = (time.monotonic() + self.limits.recover_s, False)
        for hook in self._on_gap:
            hook(room, epoch, after)

    def recovered(self, room: str, epoch: str, after: int, log: RoomLog | None,
                  now_ms: int) -> None:
        """The room's history as read for a gap after ``after`` (None: it could not
        be read). What is missing goes to the members in position order; what is
        no longer kept, a ``room_gap`` first."""
        if room not in self._recovering or room not in self.members:
            return
        if log is None:  # unreadable: tell now, and the room goes on past the hole
            del self._recovering[room]
            self._tell_gap(room, epoch, after, "failed")
            win = self._pending.get(room)
            if win is not None and win.poss:
                self._next[room] = (epoch, min(win.poss))
            return
        self._recovering[room] = (self._recovering[room][0], True)
        got = catch_up(log, now_ms=now_ms, max_age_ms=int(self.limits.history_ttl_s * 1000),
                       history=0, since=(epoch, after))
        kept = [(entry_pos_ts(m)[0], m) for m in got.msgs]
        nxt = self._next.get(room) or (epoch, after + 1)
        if nxt[0] != epoch:  # the gap opened a new epoch: its positions after ``after``
            nxt = (epoch, after + 1)
        if got.recovered:
            self._m_recovery.labels("recovered").inc()
        elif log.epoch is not None:
            self._tell_gap(room, epoch, after, "gap")
            nxt = self._next[room] = (log.epoch, kept[0][0] if kept else log.last + 1)
        win = self._pending.get(room)
        waiting = set(win.poss) if win is not None else set()
        for pos, msg in kept:
            if pos >= nxt[1] and pos not in waiting:
                self.deliver_room(room, msg, 0, pos, log.epoch)

    def _tell_gap(self, room: str, epoch: str, after: int, outcome: str) -> None:
        self._m_recovery.labels(outcome).inc()
        members = self.members.get(room)
        if members:
            self.hub.writer.write_each(members.values(),
                                       (ws_text_frame(frames.room_gap(room, epoch, after)),),
                                       self.limits.buffer_max, skipped=self._m_skipped)

    def _still_waiting(self, room: str, epoch: str, after: int) -> bool:
        """A gap outlived the reorder wait: whether to keep holding for the
        history (asked for now if not yet), or give up (``room_gap``)."""
        state = self._recovering.get(room)
        if state is None:
            self._recover(room, epoch, after)
            return True
        deadline, answered = state
        if not answered and time.monotonic() < deadline:
            return True
        del self._recovering[room]
        self._tell_gap(room, epoch, after, "gap" if answered else "timeout")
        return False

    # -- traffic -------------------------------------------------------------
    def deliver_room(self, room: str, fragment: bytes, prio: int, pos: int = 0,
                     epoch: str | None = None) -> None:
        """Queue one message for this node's members of ``room``; never awaits."""
        self._m_in.inc()
        if room not in self.members:
            self._m_nobody.inc()
            return
        win = self._pending.get(room)
        if win is None:
            loop = asyncio.get_running_loop()
            win = self._pending[room] = _Window(time.monotonic())
            wait = self._last_flush.get(room, -1e9) + self.limits.window_s - loop.time()
            if wait > 0:
                loop.call_later(wait, self._flush, room)
            else:  # the next tick: what arrives in this one (an envelope) shares the frame
                loop.call_soon(self._flush, room)
        elif len(win.frags) >= self.limits.pending_max and not prio:
            self._m_overflow.inc()
            return
        win.frags.append(fragment)
        win.prios.append(prio)
        win.poss.append(pos)
        win.epochs.append(epoch)

    def _flush(self, room: str) -> None:
        win = self._pending.pop(room)
        members = self.members.get(room)
        if not members:
            self._m_nobody.inc(len(win.frags))
            return
        loop = asyncio.get_running_loop()
        self._last_flush[room] = loop.time()
        now = time.monotonic()
        self._m_window.observe(now - win.since)
        started = time.perf_counter()
        runs = self._in_order(room, win)
        if room in self._pending:  # a gap: the rest waits for it
            loop.call_later(self.limits.reorder_s, self._flush, room)
        wires: list[bytes] = []
        frags = 0
        for epoch, run, prios in runs:
            frags += self._frames(room, epoch, run, prios, now, wires)
        if wires:
            ring = self._rings.get(room)
            if ring is not None:  # being written: the cursor takes it on its way
                ring.add(wires, frags, now)
            elif len(members) <= self.limits.write_at_once:
                self._write(members.values(), wires, frags)
                self._m_write.observe(time.monotonic() - now)
            else:
                self._rings[room] = first_pass(list(members.values()), wires, frags)
                self._step(room)  # the first chunk in this turn
        self._m_flush.observe(time.perf_counter() - started)

    def _write_some(self) -> None:
        """The next chunk of every big room's members (one loop turn)."""
        self._writing = False
        for room in list(self._rings):
            self._step(room)

    def _step(self, room: str) -> None:
        ring = self._rings[room]
        writes, delivered, done = ring.step(self.limits.write_chunk, self._write_run)
        self._counted[0] += writes  # counted at the pass's end: a chunk is a few dozen writes
        self._counted[1] += delivered
        if done:
            self._count()
            for took in ring.end_pass(time.monotonic()):
                self._m_write.observe(took)
            if room not in self.members or not ring.new_pass():
                del self._rings[room]
                return
        if not self._writing:
            self._writing = True
            asyncio.get_running_loop().call_soon(self._write_some)

    def _count(self) -> None:
        writes, delivered = self._counted
        if writes or delivered:
            self._m_writes.inc(writes)
            self._m_delivered.inc(delivered)
            self._counted = [0, 0]

    def _write_run(self, clients: Sequence[Client | None], wires: list[bytes],
                   frags: int) -> int:
        return self.hub.writer.write_each(clients, wires, self.limits.buffer_max,
                                          skipped=self._m_skipped)

    def _write(self, clients: Iterable[Client], wires: list[bytes], frags: int) -> None:
        written = self.hub.writer.write_each(clients, wires, self.limits.buffer_max,
                                             skipped=self._m_skipped)
        self._m_writes.inc(written * len(wires))
        self._m_delivered.inc(written * frags)

    def _in_order(self, room: str, win: _Window
                  ) -> list[tuple[str | None, list[bytes], list[int]]]:
        """The window's messages to send now, in position order, as runs of one
        epoch; what follows a missing position is put back (held) once."""
        epochs = win.epochs
        if epochs[0] is None or len(set(epochs)) > 1:  # unpositioned, or a new epoch
            if epochs[-1] is not None:
                self._next[room] = (epochs[-1], win.poss[-1] + 1)
            return [(e, [f], [p]) for e, f, p in zip(epochs, win.frags, win.prios,
                                                      strict=True)] \
                if epochs[0] is not None else [(None, win.frags, win.prios)]
        epoch = epochs[0]
        order = sorted(range(len(win.poss)), key=win.poss.__getitem__)
        cut = len(order)
        expected = self._next.get(room)
        if expected is not None and expected[0] not in (epoch, None):
            expected = (epoch, 1)  # a new epoch: its positions start again at 1
        if expected is not None and expected[0] in (epoch, None):
            nxt = expected[1]
            for k, i in enumerate(order):
                pos = win.poss[i]
                if pos > nxt:
                    cut = k
                    break
                nxt = max(nxt, pos + 1)  # (a late one, below nxt, goes now)
        if cut == len(order):
            if self._recovering.get(room, (0.0, False))[1]:
                del self._recovering[room]  # answered, and nothing is missing any more
        elif win.held and not (expected is not None and expected[0] == epoch
                               and self._still_waiting(room, epoch, expected[1] - 1)):
            cut = len(order)  # given up: the members were told room_gap
        if cut < len(order):
            self._m_held.inc()
            rest = self._pending[room] = _Window(win.since)
            rest.held = True
            for i in order[cut:]:
                rest.frags.append(win.frags[i])
                rest.prios.append(win.prios[i])
                rest.poss.append(win.poss[i])
                rest.epochs.append(epoch)
            order = order[:cut]
        if not order:
            return []
        self._next[room] = (epoch, max(win.poss[order[-1]] + 1,
                                       expected[1] if expected and expected[0] == epoch else 0))
        return [(epoch, [win.frags[i] for i in order], [win.prios[i] for i in order])]

    def _frames(self, room: str, epoch: str | None, frags: list[bytes], prios: list[int],
                now: float, out: list[bytes]) -> int:
        """The room's delivery cap, then the run's frames' wire bytes onto ``out``;
        returns how many messages they carry."""
        lim = self.limits
        cap = self._caps.get(room)
        if cap is None:
            # A burst of one second's worth, so a quiet room's first words all go.
            cap = self._caps[room] = DeliveryCap(lim.rate_cap, max(lim.rate_cap, 1.0), now)
        must = sum(prios)
        normal = len(frags) - must
        allowed = cap.allow(now, must, normal)
        if allowed < normal:
            frags = sample(frags, prios, allowed, self._rng)
            self._m_cap.inc(normal - allowed)
        if not frags:
            return 0
        wires = [ws_text_frame(f) for f in room_frames(room, frags, lim.frame_max, epoch)]
        self._m_frames.inc(len(wires))
        out.extend(wires)
        return len(frags)
