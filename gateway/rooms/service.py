"""Live rooms on one node: the ops (join, leave, room_send), broker bindings,
online counts, and the once-a-second housekeeping.

- Bindings (``gateway/bindings.py``): the node's broker queue is bound to a
  room when the room gets its first local member; an emptied room keeps its
  binding for ``room_unbind_delay_s``.
- Counts: each join or leave writes this node's count for the room and
  reads the total across live nodes in the same round trip (batched with
  every other join and leave in flight); nobody is told about joins.
- ``room_send``: checked, encoded once and handed to the router, which
  positions it when rooms keep history (``router/positions.py``), writes it
  to this node's members and publishes it to the other nodes; the sender's
  ``ok`` waits for the broker's confirm of the envelope carrying it
  (``unavailable`` otherwise).
- History (``IM_ROOM_HISTORY`` > 0): ``join`` binds first, then reads the
  room's position and kept messages, so nothing falls between what the reply
  carries and what arrives live (the two may overlap: clients dedup by pos).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from core.batcher import Batcher
from core.ratelimit import KeyedBuckets
from core.room_history import RoomLog, catch_up
from gateway import frames
from gateway.bindings import Bindings
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.frames import body_value
from gateway.hub import Client
from gateway.metrics import NodeMetrics
from gateway.rooms.hub import RoomHub
from router import BrokerUnavailable, Router
from router.controls import RoomKick, RoomMute, RoomUnmute
from router.routing import parse_key, room_key
from store.errors import Unavailable
from store.ports import RoomCountStore, RoomHistoryStore, SanctionStore

RoomMutes = SanctionStore  # the room mutes, read at join

__all__ = ["LiveRooms"]

log = logging.getLogger("gateway.rooms.service")


@dataclass(frozen=True, slots=True)
class RoomRules:
    """What the room service enforces and keeps: rooms per connection, each
    user's send budget, history, and its batching (``IM_ROOM_*``)."""

    max_per_conn: int
    send_rate: float
    send_burst: int
    history: int
    history_ttl_s: float
    refresh_s: float
    reply_buffer_max: int
    batch_max: int
    pending_max: int

    @classmethod
    def from_settings(cls, s: Settings) -> RoomRules:
        return cls(s.room_max_per_conn, s.room_send_rate, s.room_send_burst, s.room_history,
                   s.room_history_ttl_s, s.room_refresh_s, s.reply_buffer_max, s.batch_max,
                   s.pending_max)


class LiveRooms:
    """Room ops and bookkeeping of one node."""

    def __init__(self, node: str, rules: RoomRules, metrics: NodeMetrics, rooms: RoomHub,
                 router: Router, counts: RoomCountStore, bindings: Bindings,
                 mutes: RoomMutes, history: RoomHistoryStore) -> None:
        self.node = node
        self.rules = rules
        self.metrics = metrics
        self.rooms = rooms
        self.router = router
        self.counts = counts
        self.bindings = bindings
        self._dirty: set[str] = set()  # counts to write at the next tick
        self.mutes = mutes
        # (room, user) -> unix time a mute ends, for users with a device in the room
        # here: read at join, moved by the server API's controls; room_send never awaits.
        self._muted: dict[tuple[str, str], float] = {}
        self._buckets = KeyedBuckets(rules.send_rate, rules.send_burst)
        self._last_refresh = time.monotonic()
        self._report: Batcher[str, tuple[int, int]] = Batcher(
            self._flush_counts, name="room-counts", max_batch=rules.batch_max,
            max_pending=rules.pending_max)
        self.history = history
        self.keeps_history = rules.history > 0
        self._logs: Batcher[tuple[str, bool], RoomLog] = Batcher(
            history.read, name="redis", max_batch=rules.batch_max,
            max_pending=rules.pending_max)
        self._recoveries: set[asyncio.Task[None]] = set()
        if self.keeps_history:
            rooms.when_gap(self._recover)

    # -- ops -----------------------------------------------------------------
    async def join(self, client: Client, room: str, history: int = 0,
                   since: tuple[str, int] | None = None) -> dict[str, Any]:
        """Join: the ``joined`` reply's fields (``online``; with history kept,
        ``epoch``, ``pos`` and ``msgs``, and ``recovered`` when ``since`` is
        given)."""
        if not self.keeps_history:  # nothing can be recovered
            online, _ = await self._join(client, room, None)
            out: dict[str, Any] = {"online": online[0], "users": online[1]}
            if since is not None:
                out.update(msgs=[], recovered=False)
            return out
        want = history > 0 or since is not None
        online, log = await self._join(client, room, want)
        assert log is not None
        self.rooms.expect(room, log.epoch, log.last)
        got = catch_up(log, now_ms=int(time.time() * 1000),
                       max_age_ms=int(self.rules.history_ttl_s * 1000),
                       history=history, since=since)
        out = {"online": online[0], "users": online[1], "epoch": log.epoch, "pos": log.last}
        if want:
            out["msgs"] = [orjson.Fragment(m) for m in got.msgs]
        if got.recovered is not None:
            out["recovered"] = got.recovered
        return out

    async def _join(self, client: Client, room: str, want: bool | None
                    ) -> tuple[tuple[int, int], RoomLog | None]:
        """Join here; the room's online count across nodes and, unless ``want``
        is None, its position (and kept messages if ``want``), read once the
        room is bound here."""
        joined = client.rooms or ()
        if room not in joined and len(joined) >= self.rules.max_per_conn:
            raise ProtocolError("forbidden", f"a connection may be in at most "
                                f"{self.rules.max_per_conn} rooms")
        until = await self.mutes.room_muted(room, client.user)
        if until:
            self._muted[(room, client.user)] = until
        self.rooms.join(client, room)
        await self.bindings.ensure(room_key(room))
        try:
            if want is None:
                return await self._report.submit(room), None
            online, log = await asyncio.gather(self._report.submit(room),
                                               self._logs.submit((room, want)))
            return online, log
        except Unavailable:
            self._left(client, room)  # refused: not counted, so not a member either
            raise

    # -- gaps ----------------------------------------------------------------
    def resumed(self) -> None:
        """The broker link is back: every local room is checked for messages
        missed meanwhile (``RoomHub.suspect_all``)."""
        if self.keeps_history:
            gaps = self.rooms.suspect_all()
            if gaps:
                log.info("broker link back: checking %d rooms for missed messages", len(gaps))

    def _recover(self, room: str, epoch: str, after: int) -> None:
        """Read ``room``'s history for the messages after ``after`` (batched with
        every other read in flight); the answer goes to the room map."""
        task = asyncio.ensure_future(self._read_for_gap(room, epoch, after))
        self._recoveries.add(task)
        task.add_done_callback(self._recoveries.discard)

    async def _read_for_gap(self, room: str, epoch: str, after: int) -> None:
        try:
            got: RoomLog | None = await self._logs.submit((room, True))
        except Unavailable as exc:
            log.warning("room %s: history unreadable after a gap: %s", room, exc)
            got = None
        self.rooms.recovered(room, epoch, after, got, int(time.time() * 1000))

    async def leave(self, client: Client, room: str) -> None:
        if self._left(client, room):
            try:
                await self._report.submit(room)
            except Unavailable:
                self._dirty.add(room)  # written at the next tick once Redis is back

    def disconnected(self, client: Client) -> None:
        """A connection closed: leave its rooms; counts are written at the next tick."""
        if client.rooms:
            left, emptied = self.rooms.leave_all(client)
            now = time.monotonic()
            for room in emptied:
                self.bindings.idle(room_key(room), now)
            self._dirty.update(left)

    def send(self, client: Client, room: str, body: Any, prio: int) -> asyncio.Future[None]:
        """Fan one message out; the future settles with the broker's confirm."""
        if client.rooms is None or room not in client.rooms:
            self.metrics.room_sends.labels("forbidden").inc()
            raise ProtocolError("forbidden", "join the room before sending to it")
        if self._muted and self._is_muted(room, client.user):
            self.metrics.room_sends.labels("muted").inc()
            raise ProtocolError("forbidden", "muted in this room")
        now = time.monotonic()
        if not self._buckets.take(client.user, now):
            self.metrics.room_sends.labels("rate_limited").inc()
            raise ProtocolError("rate_limited", "too many room messages; slow down")
        fragment = orjson.dumps({"from": client.user, "body": body_value(body),
                                 "ts": int(time.time() * 1000)})
        self.metrics.room_sends.labels("accepted").inc()
        return self.router.publish_room(room, fragment, prio)

    async def publish(self, room: str, body: bytes, prio: int, sender: str) -> None:
        """The server API's message to ``room``: members here at once, every other
        node's through the broker; returns once the broker confirmed it."""
        fragment = orjson.dumps({"from": sender, "body": body_value(body),
                                 "ts": int(time.time() * 1000)})
        self.metrics.room_sends.labels("server").inc()
        try:
            await self.router.publish_room(room, fragment, prio)
        except BrokerUnavailable as exc:
            raise Unavailable("rabbitmq", type(exc).__name__) from exc

    def _is_muted(self, room: str, user: str) -> bool:
        until = self._muted.get((room, user))
        if until is None:
            return False
        if until > time.time():
            return True
        del self._muted[(room, user)]
        return False

    def apply_control(self, users: list[str], ctl: RoomMute | RoomUnmute | RoomKick) -> None:
        """The server API's room controls for these users' local devices: a mute
        (``rmute``, until), its end (``runmute``), a kick (``rkick``: leave, told
        ``{"op":"left","room","reason":"kicked"}``)."""
        room = ctl.room
        for user in users:
            if isinstance(ctl, RoomMute):
                self._muted[(room, user)] = ctl.until
            elif isinstance(ctl, RoomUnmute):
                self._muted.pop((room, user), None)
            else:
                frame = frames.left(room, reason="kicked")
                for client in list(self.rooms.hub.users.get(user, {}).values()):
                    if self._left(client, room):
                        self._dirty.add(room)
                        client.write(frame, self.rules.reply_buffer_max)

    async def online(self, room: str) -> tuple[int, int]:
        """``room``'s connections and users across live nodes (a fresh read; a
        user with connections on two nodes counts on each)."""
        return (await self.counts.totals([room]))[room]

    @property
    def bind_ops(self) -> int:
        return self.bindings.ops

    def _left(self, client: Client, room: str) -> bool:
        """Leave locally; True if ``client`` was a member."""
        if client.rooms is None or room not in client.rooms:
            return False
        if self.rooms.leave(client, room):
            self.bindings.idle(room_key(room), time.monotonic())
        return True

    # -- counts --------------------------------------------------------------
    async def _flush_counts(self, rooms: list[str]) -> list[tuple[int, int]]:
        totals = await self.counts.report(self.node, self._local(rooms))
        return [totals[r] for r in rooms]

    def _local(self, rooms: Iterable[str]) -> dict[str, tuple[int, int]]:
        return {r: (self.rooms.count(r), self.rooms.users(r)) for r in rooms}

    # -- housekeeping (every room_report_s) ----------------------------------
    async def tick(self) -> None:
        now = time.monotonic()
        if now - self._last_refresh >= self.rules.refresh_s:
            self._last_refresh = now
            self._dirty.update(self.rooms.members)  # renews every key's TTL
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            try:
                await self.counts.report(self.node, self._local(dirty))
            except Unavailable as exc:
                self._dirty |= dirty
                log.warning("room counts not written: %s", exc)

    def rewrite_counts(self) -> None:
        """Redis lost its data: write every local count again at the next tick."""
        self._dirty.update(self.rooms.members)

    async def close(self) -> None:
        """Drain: this node's members leave every count at once."""
        await self._report.close()
        for task in self._recoveries:
            task.cancel()
        await asyncio.gather(*self._recoveries, return_exceptions=True)
        await self._logs.close()
        with contextlib.suppress(Unavailable):
            await self.counts.forget_node(self.node, list(self.rooms.members))

    def snapshot(self) -> dict[str, Any]:
        rooms = [k for k in self.bindings.bound if parse_key(k)[0] == "room"]
        return {"rooms": len(self.rooms.members), "memberships": self.rooms.memberships,
                "bound": len(rooms)}
