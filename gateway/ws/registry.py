"""Where this node's devices are registered: the local map, the routes other
nodes read, the groups' and rooms' local maps; and the replay of pushes after
a broker outage.

A device is served only once its route is written (batched: a reconnect
storm is a few round trips), so a message sent to it after its ``connect``
finds it. A route that could not be written is rewritten with every other
after the next heartbeat that finds Redis lost its data.
"""

from __future__ import annotations

import contextlib
import logging

from core.batcher import Batcher
from core.errors import Unavailable
from gateway.groups.membership import GroupMembership
from gateway.hub import Client, Hub
from gateway.presence.subs import PresenceSubs
from gateway.presence.watch import PresenceWatch
from gateway.rooms.service import LiveRooms
from store.ports import RouteStore

__all__ = ["Registry"]

log = logging.getLogger("gateway.ws.registry")
RouteOp = tuple[bool, str, int]  # (add?, user, connection id)


class Registry:
    """Connects and disconnects of this node's devices."""

    def __init__(self, node: str, hub: Hub, routes: RouteStore, groups: GroupMembership,
                 live: LiveRooms, presence: PresenceWatch, watchers: PresenceSubs, *,
                 max_batch: int, max_pending: int) -> None:
        self.node = node
        self.hub = hub
        self.routes = routes
        self.groups = groups
        self.live = live
        self.presence = presence
        self.watchers = watchers
        self._ops: Batcher[RouteOp, None] = Batcher(
            self._flush, name="redis", max_batch=max_batch, max_pending=max_pending)

    def connections_of(self, user: str) -> int:
        """This node's open connections of ``user``."""
        devices = self.hub.users.get(user)
        return len(devices) if devices else 0

    async def connected(self, client: Client) -> None:
        """Register a device locally and in the routes (so other nodes find it)."""
        self.hub.add(client)
        try:
            await self._ops.submit((True, client.user, client.id))
        except Unavailable as exc:  # served locally; other nodes find it after a rewrite
            log.warning("route write failed for %s: %s", client.user, exc)
        self.presence.connected(client.user)
        await self.groups.connected(client)

    async def disconnected(self, client: Client) -> None:
        self.hub.remove(client)
        self.live.disconnected(client)
        self.groups.disconnected(client)
        self.watchers.disconnected(client)
        if client.user not in self.hub.users:
            self.presence.last_left(client.user)
        with contextlib.suppress(Unavailable):
            await self._ops.submit((False, client.user, client.id))

    async def rewrite(self) -> None:
        """Redis lost its data: every local device's route again."""
        log.warning("lease was gone from Redis: rewriting %d routes", self.hub.count)
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
        await self._ops.close()
