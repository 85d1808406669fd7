"""Presence subscriptions (``presence_sub`` / ``presence_unsub``): which local
devices watch which users, and the broker bindings that bring those users'
changes here.

A node binds ``p|<user>`` (``router.routing.presence_key``) while one of its
devices watches ``user``, so a change reaches only the nodes that asked for
it: one publish by the node that announces the change, one envelope to each
node bound, one frame per watching device there. Unbinding is lazy
(``Bindings``), so watch churn is not broker churn.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from gateway.bindings import Bindings
from gateway.errors import ProtocolError
from gateway.hub import Client, ConnectionIndex, Hub
from router.routing import presence_key

__all__ = ["PresenceSubs"]


class PresenceSubs:
    def __init__(self, hub: Hub, bindings: Bindings, max_per_conn: int) -> None:
        self.hub = hub
        self.bindings = bindings
        self.max_per_conn = max_per_conn
        self.watchers: ConnectionIndex[str] = ConnectionIndex("watching")

    async def watch(self, client: Client, users: Sequence[str], rid: object = None) -> None:
        """``client`` watches ``users`` from now on (bound before this returns)."""
        have = client.watching or set()
        new = [u for u in dict.fromkeys(users) if u not in have]
        if len(have) + len(new) > self.max_per_conn:
            raise ProtocolError("bad_request", f"a connection watches at most "
                                f"{self.max_per_conn} users", rid)
        await asyncio.gather(*(self.bindings.ensure(presence_key(u)) for u in new))
        for user in new:
            self.watchers.add(user, client)

    def unwatch(self, client: Client, users: Sequence[str]) -> None:
        now = time.monotonic()
        for user in users:
            if self.watchers.remove(user, client):
                self.bindings.idle(presence_key(user), now)

    def disconnected(self, client: Client) -> None:
        now = time.monotonic()
        for user in self.watchers.remove_all(client)[1]:
            self.bindings.idle(presence_key(user), now)

    def deliver_presence(self, user: str, frame: bytes) -> int:
        devices = self.watchers.get(user)
        return self.hub.write_each(devices.values(), frame, None) if devices else 0
