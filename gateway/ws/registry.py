"""Where this node's devices are registered: the local map, the routes other
nodes read, the groups' local map.

A device is served once its route is written and its groups are loaded
(both batched: a reconnect storm is a few round trips), so a message sent
to it after its ``connect`` finds it. When either could not be done (Redis
down, or one master of a Redis Cluster), the device is not left connected
and deaf: the registry tries again every ``retry_s`` until both are done,
then replays to it what came for it meanwhile (``Replay.registered_late``:
its offline entries since it connected, so a push sent in the moment
between Redis coming back and the retry is not missed), and closes the
connection with 1012 ("service restart": reconnect) if that takes longer
than ``grace_s``. Every route is also rewritten after a
heartbeat that finds Redis lost its data.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass

from core.batcher import Batcher, Observe
from core.errors import Unavailable
from gateway.delivery import Replay
from gateway.groups.membership import GroupMembership
from gateway.hub import Client, Hub
from gateway.presence.devices import Devices
from gateway.presence.subs import PresenceSubs
from gateway.presence.watch import PresenceWatch
from gateway.rooms.service import LiveRooms
from gateway.wire import Count
from store.ports import RouteStore

__all__ = ["Registry"]

log = logging.getLogger("gateway.ws.registry")
RouteOp = tuple[bool, str, int]  # (add?, user, connection id)
SERVICE_RESTART = 1012  # RFC 6455 7.4.1 (IANA registry): the client should reconnect


@dataclass(slots=True)
class _Unfinished:
    """A device whose registration is not complete yet."""

    client: Client
    since: float  # monotonic time it connected
    at: float  # unix time it connected
    route: bool  # its route is still to be written
    groups: bool  # its groups are still to be loaded


class Registry:
    """Connects and disconnects of this node's devices."""

    def __init__(self, node: str, hub: Hub, routes: RouteStore, groups: GroupMembership,
                 live: LiveRooms, presence: PresenceWatch, watchers: PresenceSubs,
                 replay: Replay, *, max_batch: int, max_pending: int, retry_s: float = 0.25,
                 grace_s: float = 30.0, closed: Count | None = None,
                 devices: Devices | None = None, observe: Observe | None = None) -> None:
        self.node = node
        self.hub = hub
        self.routes = routes
        self.groups = groups
        self.live = live
        self.presence = presence
        self.watchers = watchers
        self.replay = replay
        self._ops: Batcher[RouteOp, None] = Batcher(
            self._flush, name="redis", max_batch=max_batch, max_pending=max_pending,
            observe=observe)
        self.retry_s = retry_s
        self.grace_s = grace_s
        self.closed = closed
        self.devices = devices  # the login policy and the device list (None: neither)
        self._unfinished: dict[int, _Unfinished] = {}  # conn id -> what is missing
        self._repairer: asyncio.Task[None] | None = None

    def connections_of(self, user: str) -> int:
        """This node's open connections of ``user``."""
        devices = self.hub.users.get(user)
        return len(devices) if devices else 0

    async def connected(self, client: Client) -> None:
        """Register a device locally and in the routes (so other nodes find it),
        and load its groups; what fails is tried again (module doc)."""
        self.hub.add(client)
        routed = await self._write_route(client)
        if self.devices is not None:  # after the route (a replaced one's close finds it),
            # before presence (its event counts it); not awaited: a slow Redis must
            # not hold the device's registration (its groups, its replay)
            self.devices.claim_soon(client)
        self.presence.connected(client.user)
        grouped = await self.groups.connected(client)
        if not (routed and grouped):
            self._unfinished[client.id] = _Unfinished(client, time.monotonic(), time.time(),
                                                      not routed, not grouped)
            if self._repairer is None or self._repairer.done():
                self._repairer = asyncio.create_task(self._repair_loop())

    @property
    def unfinished(self) -> int:
        """Devices whose registration is not complete yet."""
        return len(self._unfinished)

    async def _write_route(self, client: Client) -> bool:
        try:
            await self._ops.submit((True, client.user, client.id))
        except Unavailable as exc:
            log.warning("route write failed for %s: %s", client.user, exc)
            return False
        return True

    async def _repair_loop(self) -> None:
        while self._unfinished:
            await asyncio.sleep(self.retry_s)
            for conn_id, u in list(self._unfinished.items()):
                if self._unfinished.get(conn_id) is not u:
                    continue  # gone meanwhile
                if u.route:
                    u.route = not await self._write_route(u.client)
                if u.groups and not u.route:  # (one failure a round is enough to wait)
                    u.groups = not await self.groups.connected(u.client)
                if not (u.route or u.groups):
                    del self._unfinished[conn_id]
                    log.info("registration of a device of %s completed", u.client.user)
                    self.replay.registered_late(u.client, u.at)
                elif time.monotonic() - u.since > self.grace_s:
                    del self._unfinished[conn_id]
                    self._close(u.client)

    def _close(self, client: Client) -> None:
        log.warning("closing a device of %s: its registration did not complete in %.0fs",
                    client.user, self.grace_s)
        if self.closed is not None:
            self.closed.inc()
        task = asyncio.ensure_future(client.ws.close(SERVICE_RESTART,
                                                     "registration incomplete: reconnect"))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def disconnected(self, client: Client) -> None:
        self._unfinished.pop(client.id, None)
        self.hub.remove(client)
        self.live.disconnected(client)
        self.groups.disconnected(client)
        self.watchers.disconnected(client)
        if client.user not in self.hub.users:
            self.presence.last_left(client.user)
        if self.devices is not None:
            self.devices.disconnected(client)
        with contextlib.suppress(Unavailable):
            await self._ops.submit((False, client.user, client.id))

    async def rewrite(self, why: str = "Redis lost its data") -> None:
        """Every local device's route again (Redis lost them, or other nodes
        may have purged them while this node's heartbeat had lapsed)."""
        log.warning("%s: rewriting %d routes", why, self.hub.count)
        await self.routes.add([(c.user, self.node, c.id) for c in self.hub.clients()])
        await self.presence.restore(list({c.user for c in self.hub.clients()}))

    async def forget_all(self) -> None:
        """A drain: every local route goes at once (clients move to other nodes)."""
        await self.routes.remove([(c.user, self.node, c.id) for c in self.hub.clients()])

    async def _flush(self, ops: list[RouteOp]) -> list[None]:
        adds = [(user, self.node, conn) for add, user, conn in ops if add]
        removes = [(user, self.node, conn) for add, user, conn in ops if not add]
        if adds:
            await self.routes.add(adds)
        if removes:
            await self.routes.remove(removes)
        return [None] * len(ops)

    async def close(self) -> None:
        if self._repairer is not None:
            self._repairer.cancel()
            await asyncio.gather(self._repairer, return_exceptions=True)
        await self._ops.close()
