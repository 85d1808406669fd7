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
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from gateway.connections import Client, ConnectionIndex
from gateway.fanout import DeliveryCap, room_frames, sample, ws_text_frame
from gateway.hub import Hub
from gateway.metrics import NodeMetrics

__all__ = ["RoomHub", "RoomLimits"]


@dataclass(frozen=True)
class RoomLimits:
    window_s: float = 0.025  # coalescing window
    rate_cap: float = 50.0  # messages/s to each member of a room; 0: no cap
    frame_max: int = 65_536  # bytes per room_msgs frame
    buffer_max: int = 262_144  # socket write buffer past which room frames skip a member
    pending_max: int = 10_000  # messages queued per room per window; more are dropped


class RoomHub:
    """Room -> local members, and the per-room coalescing queues."""

    def __init__(self, hub: Hub, metrics: NodeMetrics, limits: RoomLimits,
                 rng: random.Random | None = None) -> None:
        self.hub = hub
        self.metrics = metrics
        self.limits = limits
        self.members: ConnectionIndex[str] = ConnectionIndex("rooms")
        self._pending: dict[str, tuple[list[bytes], list[int]]] = {}
        self._caps: dict[str, DeliveryCap] = {}
        self._last_flush: dict[str, float] = {}  # room -> loop time of its last flush
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

    # -- membership ----------------------------------------------------------
    @property
    def memberships(self) -> int:
        return self.members.memberships

    def join(self, client: Client, room: str) -> bool:
        """Add ``client`` to ``room``; True if it is the room's first local member."""
        first = self.members.add(room, client)
        self._gauges()
        return first

    def leave(self, client: Client, room: str) -> bool:
        """Remove ``client`` from ``room``; True if that emptied the room here."""
        emptied = self.members.remove(room, client)
        if emptied:
            self._forget(room)
        self._gauges()
        return emptied

    def leave_all(self, client: Client) -> tuple[list[str], list[str]]:
        """Remove ``client`` from every room: (rooms left, rooms emptied)."""
        left, emptied = self.members.remove_all(client)
        for room in emptied:
            self._forget(room)
        if left:
            self._gauges()
        return left, emptied

    def count(self, room: str) -> int:
        return self.members.count(room)

    def _forget(self, room: str) -> None:
        """An emptied room keeps no state (a pending flush finds no members)."""
        self._caps.pop(room, None)
        self._last_flush.pop(room, None)

    def _gauges(self) -> None:
        self.metrics.rooms.set(len(self.members))
        self.metrics.room_members.set(self.memberships)

    # -- traffic -------------------------------------------------------------
    def deliver_room(self, room: str, fragment: bytes, prio: int) -> None:
        """Queue one message for this node's members of ``room``; never awaits."""
        self._m_in.inc()
        if room not in self.members:
            self._m_nobody.inc()
            return
        pending = self._pending.get(room)
        if pending is None:
            pending = self._pending[room] = ([], [])
            loop = asyncio.get_running_loop()
            wait = self._last_flush.get(room, -1e9) + self.limits.window_s - loop.time()
            if wait > 0:
                loop.call_later(wait, self._flush, room)
            else:  # the next tick: what arrives in this one (an envelope) shares the frame
                loop.call_soon(self._flush, room)
        elif len(pending[0]) >= self.limits.pending_max and not prio:
            self._m_overflow.inc()
            return
        pending[0].append(fragment)
        pending[1].append(prio)

    def _flush(self, room: str) -> None:
        frags, prios = self._pending.pop(room)
        members = self.members.get(room)
        if not members:
            self._m_nobody.inc(len(frags))
            return
        self._last_flush[room] = asyncio.get_running_loop().time()
        started = time.perf_counter()
        now = time.monotonic()
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
            return
        wires = [ws_text_frame(f) for f in room_frames(room, frags, lim.frame_max)]
        written = self.hub.writer.write_each(members.values(), wires, lim.buffer_max,
                                             skipped=self._m_skipped)
        self._m_frames.inc(len(wires))
        self._m_writes.inc(written * len(wires))
        self._m_delivered.inc(written * len(frags))
        self._m_flush.observe(time.perf_counter() - started)
