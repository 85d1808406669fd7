"""Which local devices get a group's pushes: the group map of this node, kept
current as devices connect and disconnect and as memberships change.

A device's groups load at connect (batched: a reconnect storm is a few
round trips); the node's broker queue is bound to a group while it holds one
of its members (``gateway/bindings.py``). Membership changes arrive as
controls (``gadd`` / ``gdel``) from whichever node took them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable

from core.batcher import Batcher, Observe
from core.errors import Unavailable
from gateway.bindings import Bindings
from gateway.groups.hub import GroupHub
from gateway.hub import Client
from router.controls import GroupAdd, GroupDel
from router.routing import group_key
from store.ports import GroupCache

__all__ = ["GroupMembership"]

log = logging.getLogger("gateway.groups.membership")


class GroupMembership:
    """This node's group map as devices come and go and memberships change."""

    def __init__(self, ghub: GroupHub, bindings: Bindings, cache: GroupCache, *,
                 max_batch: int, max_pending: int, observe: Observe | None = None) -> None:
        self.ghub = ghub
        self.bindings = bindings
        self._loads: Batcher[str, list[str]] = Batcher(
            cache.groups_of, name="redis", max_batch=max_batch, max_pending=max_pending,
            observe=observe)

    async def connected(self, client: Client) -> bool:
        """Load the device's groups into the map; False if they could not be read
        (the registry tries again until they are, or closes the connection)."""
        try:
            groups = await self._loads.submit(client.user)
        except Unavailable as exc:
            log.warning("groups of %s not loaded: %s", client.user, exc)
            return False
        if groups:
            await self._join(client, groups)
        return True

    async def _join(self, client: Client, groups: list[str]) -> None:
        for g in groups:
            self.ghub.add(client, g)
        # Keys bound already cost no task (a user in 2,000 groups reconnecting);
        # ensure() also cancels a pending lazy unbind.
        unbound = self.bindings.keep([group_key(g) for g in groups])
        if unbound:
            await asyncio.gather(*(self.bindings.ensure(k) for k in unbound))

    def disconnected(self, client: Client) -> None:
        now = time.monotonic()
        for g in self.ghub.remove_all(client):
            self.bindings.idle(group_key(g), now)

    def apply_control(self, users: list[str], ctl: GroupAdd | GroupDel) -> Awaitable[None] | None:
        """A membership change for these users' local devices, in the group map
        at once (a group message queued behind the control sees it); returned:
        binding the group's key after a ``gadd``."""
        group = ctl.group
        joined = False
        for user in users:
            for client in self.ghub.user_devices(user):
                if isinstance(ctl, GroupAdd):
                    self.ghub.add(client, group)
                    joined = True
                elif self.ghub.remove(client, group):
                    self.bindings.idle(group_key(group), time.monotonic())
        return self.bindings.ensure(group_key(group)) if joined else None

    async def close(self) -> None:
        await self._loads.close()
