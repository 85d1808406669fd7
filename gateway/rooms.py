"""The node's local room maps and the coalescer that writes room traffic.

``members[room]`` maps connection id to client; joining and leaving are
O(1) and a room with no local member leaves the map. A room message
(already-encoded fragment, from a local sender or another node) is queued
for its room; the first one queued schedules that room's flush, so idle
rooms and idle members cost nothing per message. Flushes of one room are at
least a window apart: a message to a quiet room goes out in the next loop
tick, a busy room's messages are gathered until a window after its last
flush. A flush applies the
room's delivery cap, builds the ``room_msgs`` frame(s) and their WebSocket
wire bytes once, and writes the same bytes to every member's transport
without awaiting. A member whose write buffer is over the bound misses the
frame (counted) and is noted as stuck; the node closes it if it stays so.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass

from websockets.protocol import State

from gateway.fanout import DeliveryCap, room_frames, sample, ws_text_frame
from gateway.hub import Client, Hub
from gateway.metrics import NodeMetrics

__all__ = ["RoomHub", "RoomLimits"]

_OPEN = State.OPEN


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
        self.members: dict[str, dict[int, Client]] = {}
        self.memberships = 0
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
    def join(self, client: Client, room: str) -> bool:
        """Add ``client`` to ``room``; True if it is the room's first local member."""
        members = self.members.get(room)
        first = members is None
        if members is None:
            members = self.members[room] = {}
        elif client.id in members:
            return False
        members[client.id] = client
        if client.rooms is None:
            client.rooms = set()
        client.rooms.add(room)
        self.memberships += 1
        self._gauges()
        return first

    def leave(self, client: Client, room: str) -> bool:
        """Remove ``client`` from ``room``; True if that emptied the room here."""
        members = self.members.get(room)
        if members is None or members.pop(client.id, None) is None:
            return False
        if client.rooms is not None:
            client.rooms.discard(room)
        self.memberships -= 1
        emptied = not members
        if emptied:
            del self.members[room]
            self._caps.pop(room, None)
            self._last_flush.pop(room, None)
        self._gauges()
        return emptied

    def leave_all(self, client: Client) -> tuple[list[str], list[str]]:
        """Remove ``client`` from every room: (rooms left, rooms emptied)."""
        rooms = list(client.rooms or ())
        emptied = [room for room in rooms if self.leave(client, room)]
        return rooms, emptied

    def count(self, room: str) -> int:
        members = self.members.get(room)
        return len(members) if members else 0

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
        written = self._write_all(members, wires, now)
        self._m_frames.inc(len(wires))
        self._m_writes.inc(written * len(wires))
        self._m_delivered.inc(written * len(frags))
        self._m_flush.observe(time.perf_counter() - started)

    def _write_all(self, members: dict[int, Client], wires: list[bytes], now: float) -> int:
        """The same wire bytes to every member's transport; skip the backed-up."""
        limit = self.limits.buffer_max
        hub = self.hub
        written = skipped = 0
        single = wires[0] if len(wires) == 1 else None
        for client in members.values():
            ws = client.ws
            if ws.protocol.state is not _OPEN:
                continue
            transport = ws.transport
            if transport.get_write_buffer_size() > limit:
                skipped += 1
                hub.mark_stuck(client, now)
                continue
            if single is not None:
                transport.write(single)
            else:
                transport.writelines(wires)
            written += 1
            if client.stuck_since:
                hub.unstuck(client)
        if skipped:
            self._m_skipped.inc(skipped)
        return written
