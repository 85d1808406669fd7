"""Where a message goes: this node's sockets at once, other nodes through the
broker. The router delivers locally the same way for users, groups, presence
and rooms; deciding whom a message is for (a group's members, an author's
followers) belongs to the feature that owns it.

Nothing here awaits per message. Local devices get the frame at once; for
other nodes records are queued, and once per event-loop tick the queued
records become one envelope per node (users, controls) or per routing key
(a group, a room, a user's presence: every node bound to it), handed to a
publisher task that publishes batches concurrently and gathers their
confirms. A caller that must know the broker took its message (a room
send, a group event ahead of a membership change) gets a future, settled
with the confirm of the envelope carrying it.

1:1 and group pushes are best effort on top of a durable store: the message
is already in the receiver's offline store, so a push lost to a dead node or
a broker outage is recovered by the replay on resume or by sync. A room
message has no store behind it but its history: its sender is told
``unavailable`` when the broker did not take it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from router import controls, envelope
from router.base import (
    Broker,
    BrokerStatus,
    GroupDelivery,
    LocalDelivery,
    PresenceDelivery,
    RoomDelivery,
)
from router.controls import Control, Controls
from router.envelope import CONTROL, EPOCH, GROUP, POS, PRESENCE, PRIO, ROOM, USERS
from router.errors import BrokerUnavailable
from router.positions import Out, RoomPositions, positioned
from router.routing import group_key, parse_key, presence_key, room_key
from store.ports import RouteStore

__all__ = ["Router"]

log = logging.getLogger("router")
# An outbox item: (exchange kind "node" or "room", routing key, envelope, the
# futures to settle with the confirm, or None when nobody waits on it).
_Item = tuple[str, str, bytes, "list[asyncio.Future[None]] | None"]


class Router:
    """Fan-out decisions and inter-node traffic for one node."""

    def __init__(
        self, node: str, local: LocalDelivery, broker: Broker, routes: RouteStore,
        *, rooms: RoomDelivery | None = None, groups: GroupDelivery | None = None,
        presence: PresenceDelivery | None = None, controls: Controls | None = None,
        positions: Callable[[Out], RoomPositions] | None = None,
        outbox_max: int = 10_000, publish_batch: int = 64, controls_max: int = 1000,
    ) -> None:
        self.node = node
        self.local = local
        self.rooms = rooms
        self.groups = groups
        self.presence = presence
        # Membership changes for local devices, applied here or sent by the node
        # that took them; run as tasks (at most ``controls_max`` at once).
        self.controls = controls or Controls()
        self.controls_max = controls_max
        self._controls: set[asyncio.Task[None]] = set()
        self.broker = broker
        self.routes = routes
        self.publish_batch = publish_batch
        self.live: dict[str, float] = {}  # node -> heartbeat expiry (unix s)
        self.live_read_at = 0.0  # when ``live`` was read (unix s)
        self._on_resume: list[Callable[[float], None]] = []
        self.stats: dict[str, int] = defaultdict(int)
        self._records: dict[str, list[envelope.Record]] = defaultdict(list)
        self._key_records: dict[str, list[envelope.Record]] = {}
        self._key_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._node_waiters: dict[str, list[asyncio.Future[None]]] = {}
        # Rooms that keep history: positions first (built here, fed to ``_room_out``).
        self.positions = positions(self._positioned) if positions is not None else None
        self._flush_scheduled = False
        self._outq: asyncio.Queue[_Item] = asyncio.Queue(maxsize=outbox_max)
        self._failed: deque[_Item] = deque(maxlen=outbox_max)
        self._publisher: asyncio.Task[None] | None = None
        self._dead_routes: dict[str, set[str]] = {}
        self._purger: asyncio.Task[None] | None = None

    def when_resumed(self, hook: Callable[[float], None]) -> None:
        """Call ``hook(lost_at)`` each time the broker link comes back after a loss
        (after the router resent what failed)."""
        self._on_resume.append(hook)

    async def start(self) -> None:
        await self.broker.start(self.node, self.on_envelope, self._broker_resumed)
        self._publisher = asyncio.create_task(self._publish_loop())

    async def close(self) -> None:
        if self._publisher is not None:
            self._publisher.cancel()
            await asyncio.gather(self._publisher, return_exceptions=True)
        if self._purger is not None:
            self._purger.cancel()
        for task in self._controls:
            task.cancel()
        await asyncio.gather(*self._controls, return_exceptions=True)
        await self.broker.close()

    # -- liveness ------------------------------------------------------------
    async def publish_event(self, key: str, body: bytes, event_id: str) -> None:
        """An event out (``{ns}.events``), confirmed; ``BrokerUnavailable`` otherwise."""
        await self.broker.publish_event(key, body, event_id)

    def broker_connected(self) -> bool:
        """Whether the broker link is up now: the broker's watched state, no I/O."""
        return self.broker.status().connected

    def broker_status(self) -> BrokerStatus:
        return self.broker.status()

    def set_live(self, live: Mapping[str, float], read_at: float | None = None) -> None:
        """The heartbeats (node -> expiry, unix s) as read at ``read_at`` (now if
        not given)."""
        self.live = dict(live)
        self.live_read_at = time.time() if read_at is None else read_at

    def is_alive(self, node: str, now: float) -> bool:
        """Known dead only when a read of the heartbeats showed it lapsed.

        A node missing from our view may be newer than the view (it started,
        or re-announced itself after a Redis flush, since our last heartbeat):
        it is routed to, and RabbitMQ drops the envelope if no queue is there.
        A view that could not be refreshed (Redis down) declares no one dead
        however old it grows: every node's expiry would lapse in it.
        """
        expiry = self.live.get(node)
        return node == self.node or expiry is None or expiry > min(now, self.live_read_at)

    def live_routes(self, routes: Mapping[str, str] | None, now: float) -> int:
        """How many of a user's routes (connection -> node) are to live nodes."""
        return sum(1 for n in (routes or {}).values() if self.is_alive(n, now))

    # -- outgoing ------------------------------------------------------------
    def push(self, user: str, frame: bytes, routes: Mapping[str, str] | None,
             skip_conn: int | None = None,
             confirms: list[asyncio.Future[None]] | None = None) -> None:
        """Send ``frame`` to every device of ``user``: local at once, remote queued.
        ``confirms`` gets one future per other node, settled by the broker's
        confirm of the tick's envelope to it (a send's ack waits on them)."""
        self.stats["local_writes"] += self.local.deliver_to_user(user, frame, skip_conn)
        if not routes:
            return
        now = time.time()
        nodes: set[str] = set()
        dead: list[str] = []
        for field, node in routes.items():
            if node == self.node:
                continue
            if self.is_alive(node, now):
                nodes.add(node)
            else:
                dead.append(field)
        for node in nodes:
            self._records[node].append(({USERS: [user]}, frame))
            if confirms is not None:
                fut = asyncio.get_running_loop().create_future()
                self._node_waiters.setdefault(node, []).append(fut)
                confirms.append(fut)
        if nodes:
            self._schedule_flush()
        if dead:
            self._purge(user, dead)

    def publish_room(self, room: str, fragment: bytes, prio: int) -> asyncio.Future[None]:
        """One room message (an encoded JSON object) to every member of ``room``:
        positioned first when rooms keep history, then this node's members at
        once and one record in the tick's envelope for every other node bound
        to the room. Never awaits. The future settles when the broker confirmed
        that envelope; it fails with ``Unavailable`` when no position could be
        taken and ``BrokerUnavailable`` when the broker did not take it."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.positions is not None:
            self.positions.submit(room, fragment, prio, fut)
        else:
            self._room_out(room, fragment, prio, 0, None, fut)
        return fut

    def _positioned(self, room: str, epoch: str, first: int,
                    items: list[tuple[bytes, int, asyncio.Future[None]]]) -> None:
        for k, (fragment, prio, fut) in enumerate(items):
            self._room_out(room, positioned(fragment, first + k), prio, first + k, epoch, fut)

    def _room_out(self, room: str, fragment: bytes, prio: int, pos: int, epoch: str | None,
                  fut: asyncio.Future[None]) -> None:
        if self.rooms is not None:
            self.rooms.deliver_room(room, fragment, prio, pos, epoch)
        head: dict[str, Any] = {ROOM: room, PRIO: 1} if prio else {ROOM: room}
        if epoch is not None:  # positioned: receivers keep the order
            head[POS], head[EPOCH] = pos, epoch
        key = room_key(room)
        self._to_key(key, head, fragment)
        self._wait(key, fut)

    def _wait(self, key: str, fut: asyncio.Future[None]) -> None:
        """Settle ``fut`` with the confirm of the tick's envelope for ``key``."""
        waiters = self._key_waiters.get(key)
        if waiters is None:
            self._key_waiters[key] = [fut]
        else:
            waiters.append(fut)

    async def close_positions(self) -> None:
        """Let the positions in flight finish (a drain: before the broker closes)."""
        if self.positions is not None:
            await self.positions.close()

    async def push_users(self, users: Sequence[str], frame: bytes) -> None:
        """``frame`` to every device of ``users`` anywhere (one route lookup for all)."""
        await self.push_frames([(user, frame) for user in users])

    async def push_frames(self, items: Sequence[tuple[str, bytes]],
                          skip_conn: int | None = None) -> None:
        """Each (user, frame) to every device of the user anywhere but this node's
        connection ``skip_conn``: one route lookup for all, then the batched push."""
        users = list(dict.fromkeys(user for user, _ in items))
        found = dict(zip(users, await self.routes.lookup(users), strict=True))
        for user, frame in items:
            if found[user]:
                self.push(user, frame, found[user], skip_conn)

    def publish_group(self, group: str, frame: bytes, skip_conn: int | None = None,
                      confirms: list[asyncio.Future[None]] | None = None) -> None:
        """A stored group message to this node's members' devices at once, and to
        every other node holding one of its members (bound to the group's key):
        one envelope per group per loop tick, no message per member. Best
        effort: members catch up by sync. ``confirms`` gets a future settled by
        the broker's confirm of that envelope."""
        if self.groups is not None:
            self.groups.deliver_group(group, frame, skip_conn)
        self._to_key(group_key(group), {GROUP: group}, frame)
        if confirms is not None:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._wait(group_key(group), fut)
            confirms.append(fut)

    async def publish_group_confirmed(self, group: str, frame: bytes) -> None:
        """``publish_group``, returning once the broker confirmed the envelope
        carrying it, so a control or message published after this is queued
        behind it on every node (a group event before a membership change).
        Raises ``BrokerUnavailable``."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.publish_group(group, frame)
        self._wait(group_key(group), fut)
        await fut

    def publish_presence(self, user: str, frame: bytes) -> None:
        """A change of ``user``'s presence to this node's devices watching it at
        once, and to every other node with one (bound to the user's presence
        key): one envelope per key per loop tick, nothing for nodes that watch
        nobody of it. Best effort, like group pushes."""
        if self.presence is not None:
            self.presence.deliver_presence(user, frame)
        self._to_key(presence_key(user), {PRESENCE: user}, frame)

    def _to_key(self, key: str, head: dict[str, Any], frame: bytes) -> None:
        """One record for the nodes bound to ``key``, in the tick's envelope of it."""
        self._key_records.setdefault(key, []).append((head, frame))
        self._schedule_flush()

    async def tell(self, users: list[str], ctl: Control) -> None:
        """Apply a membership change to ``users``' devices on every node holding
        one: here first, then each other live node, each confirmed by the broker
        before this returns, so anything published after it (a group message)
        is queued behind it. A dead node has nothing to be told."""
        routes = await self.routes.lookup(users)
        now = time.time()
        remote: dict[str, list[str]] = {}
        for user, r in zip(users, routes, strict=True):
            for node in set(r.values()):
                if node != self.node and self.is_alive(node, now):
                    remote.setdefault(node, []).append(user)
        if (rest := self.controls.apply(users, ctl)) is not None:
            await rest
        for node, on_node in remote.items():
            with contextlib.suppress(BrokerUnavailable):
                await self.control(node, on_node, ctl)

    async def tell_all(self, users: list[str], ctl: Control) -> None:
        """As ``tell``, but to every live node whether or not it holds a device of
        ``users`` now (a handshake may be registering there)."""
        now = time.time()
        if (rest := self.controls.apply(users, ctl)) is not None:
            await rest
        for node, expiry in list(self.live.items()):
            if node != self.node and expiry > now:
                with contextlib.suppress(BrokerUnavailable):
                    await self.control(node, users, ctl)

    async def control(self, node: str, users: list[str], ctl: Control) -> None:
        """Tell ``node`` about a membership change of its local ``users``; returns
        once the broker confirmed it. Raises ``BrokerUnavailable``."""
        head = {USERS: users, CONTROL: controls.encode(ctl)}
        await self.broker.publish(node, envelope.encode([(head, b"")]))

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        records, self._records = self._records, defaultdict(list)
        node_waiters, self._node_waiters = self._node_waiters, {}
        for node, recs in records.items():
            self._enqueue(("node", node, envelope.encode(recs), node_waiters.get(node)),
                          len(recs))
        keys, self._key_records = self._key_records, {}
        waiters, self._key_waiters = self._key_waiters, {}
        for key, recs in keys.items():
            self._enqueue(("room", key, envelope.encode(recs), waiters.get(key)), len(recs))

    def _enqueue(self, item: _Item, records: int) -> None:
        try:
            self._outq.put_nowait(item)
        except asyncio.QueueFull:
            self.stats["dropped_outbox_full"] += records
            _settle(item[3], BrokerUnavailable("the outbox to the broker is full"))

    async def _publish_loop(self) -> None:
        while True:
            batch = [await self._outq.get()]
            while len(batch) < self.publish_batch and not self._outq.empty():
                batch.append(self._outq.get_nowait())
            results = await asyncio.gather(*(
                self.broker.publish_key(key, env) if kind == "room"
                else self.broker.publish(key, env)
                for kind, key, env, _ in batch
            ), return_exceptions=True)
            for item, result in zip(batch, results, strict=True):
                if result is None:
                    self.stats["envelopes_out"] += 1
                    self.stats["node_envelopes_out" if item[0] == "node"
                               else "key_envelopes_out"] += 1
                    _settle(item[3], None)
                    continue
                self.stats["publish_failed"] += 1
                if not isinstance(result, BrokerUnavailable):
                    log.error("publish error", exc_info=result)
                    result = BrokerUnavailable("publish failed")
                if item[0] == "node" or parse_key(item[1])[0] == "group":  # resent on resume
                    self._failed.append(item)
                # A room message: its sender hears `unavailable`; live traffic is not resent.
                _settle(item[3], result)

    def _purge(self, user: str, fields: list[str]) -> None:
        """Queue dead routes for deletion; one task deletes them in batches.

        When a node dies every sender meets its routes at once: coalescing per
        user and pipelining keeps that from taking every Redis connection.
        """
        if len(self._dead_routes) >= 10_000 and user not in self._dead_routes:
            return  # bounded: later readers meet the rest again
        self._dead_routes.setdefault(user, set()).update(fields)
        if self._purger is None or self._purger.done():
            self._purger = asyncio.create_task(self._purge_loop())

    async def _purge_loop(self) -> None:
        while self._dead_routes:
            batch, self._dead_routes = self._dead_routes, {}
            try:
                await self.routes.purge_many(batch)
                self.stats["routes_purged"] += sum(len(f) for f in batch.values())
            except Exception as exc:  # noqa: BLE001 - best effort; readers retry
                log.warning("route purge failed: %s", exc)
                return
            await asyncio.sleep(0.05)

    # -- incoming ------------------------------------------------------------
    def on_envelope(self, data: bytes) -> None:
        self.stats["envelopes_in"] += 1
        try:
            for head, frame in envelope.decode(data):
                if CONTROL in head:
                    self._apply_control(list(head.get(USERS, ())), head[CONTROL])
                    continue
                watched = head.get(PRESENCE)
                if watched is not None:
                    self.stats["presence_in"] += 1
                    if self.presence is not None:
                        self.presence.deliver_presence(watched, frame)
                    continue
                group = head.get(GROUP)
                if group is not None:
                    self.stats["group_msgs_in"] += 1
                    if self.groups is not None:
                        self.groups.deliver_group(group, frame, None)
                    continue
                room = head.get(ROOM)
                if room is not None:
                    self.stats["room_msgs_in"] += 1
                    if self.rooms is not None:
                        epoch = head.get(EPOCH)
                        self.rooms.deliver_room(
                            room, frame, 1 if head.get(PRIO) else 0, int(head.get(POS, 0)),
                            epoch if isinstance(epoch, str) else None)
                    continue
                for user in head.get(USERS, ()):
                    self.stats["remote_writes"] += self.local.deliver_to_user(user, frame, None)
        except envelope.EnvelopeError:
            self.stats["bad_envelopes"] += 1
            log.error("dropped a malformed envelope (%d bytes)", len(data))

    def _apply_control(self, users: list[str], raw: object) -> None:
        ctl = controls.decode(raw)
        if ctl is None:  # a kind this version does not know, or malformed
            self.stats["bad_controls"] += 1
            return
        if len(self._controls) >= self.controls_max:
            self.stats["controls_dropped"] += 1  # bounded; a reconnect reloads groups
            return
        # Applied now, not in a task of its own: the group message queued right
        # behind a ``gdel`` must not still reach the removed member's device.
        rest = self.controls.apply(users, ctl)
        if rest is None:
            return
        task = asyncio.ensure_future(rest)
        self._controls.add(task)
        task.add_done_callback(self._controls.discard)

    def _broker_resumed(self, lost_at: float) -> None:
        """The broker link is back: resend what failed, let the node replay the gap."""
        now = time.time()
        failed, self._failed = list(self._failed), deque(maxlen=self._failed.maxlen)
        for item in failed:
            if self.is_alive(item[1], now):
                with contextlib.suppress(asyncio.QueueFull):
                    self._outq.put_nowait(item)
        for hook in self._on_resume:
            hook(lost_at)

    def snapshot(self) -> dict[str, Any]:
        now = time.time()
        live = sorted(n for n, expiry in self.live.items() if expiry > now)
        return {"node": self.node, "live_nodes": live, **self.stats}


def _settle(waiters: list[asyncio.Future[None]] | None, error: BaseException | None) -> None:
    for fut in waiters or ():
        if fut.done():
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)
