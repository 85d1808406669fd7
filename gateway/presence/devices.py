"""A user's devices across the nodes, and the login policy (``core.devices``).

A connection claims its slot once registered (``DeviceStore.claim``: atomic,
so of two connections of one slot claiming at once on two nodes the later
keeps it); each connection the claim replaced is closed with 4005, here at
once or on its node through the broker (``CloseConn``). ``devices`` lists a
user's connected devices (those of live nodes), and the server API closes
one device's connection with 4003.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from core.batcher import Batcher, Observe
from core.devices import REPLACED, slot
from core.errors import Unavailable
from gateway.hub import Client, Hub
from router.controls import CloseConn, Control
from store.ports import DeviceStore
from store.records import DeviceClaim

__all__ = ["Devices"]

log = logging.getLogger("gateway.presence.devices")
CLOSED_BY_SERVER = 4003


class Teller(Protocol):
    async def tell(self, users: list[str], ctl: Control) -> None: ...


class Devices:
    """The login policy on this node, and the device list."""

    def __init__(self, store: DeviceStore, teller: Teller, hub: Hub, node: str, policy: str,
                 alive: Callable[[str], bool],
                 replaced: Callable[[], None] = lambda: None, *, max_batch: int = 256,
                 max_pending: int = 20_000,
                 observe: Callable[[str], Observe] | None = None) -> None:
        self.store = store
        self.teller = teller
        self.hub = hub
        self.node = node
        self.policy = policy
        self.alive = alive  # whether a node is live (its devices count)
        self.replaced = replaced  # counts connections closed as replaced
        self._tasks: set[asyncio.Task[None]] = set()
        # A connect (or disconnect) storm's claims and releases, a round trip a
        # batch. One queue for both: a connection's release is never written
        # before its claim (it is submitted after it, and a batch writes its
        # claims first), which would leave its entry behind.
        self._writes: Batcher[DeviceClaim | tuple[str, str], list[str]] = Batcher(
            self._write_many, name="redis", max_batch=max_batch, max_pending=max_pending,
            observe=observe("devices") if observe else None)

    def conn(self, client: Client) -> str:
        return f"{self.node}:{client.id}"

    async def connected(self, client: Client) -> None:
        """Take the device's slot; close what it replaced (4005). Redis down:
        the connection stays, unlisted and unpoliced (logged)."""
        try:
            replaced = await self._writes.submit(DeviceClaim(
                client.user, self.conn(client), client.device, client.platform,
                slot(self.policy, client.platform, client.device), int(time.time() * 1000)))
        except Unavailable as exc:
            log.warning("device of %s not claimed: %s", client.user, exc)
            return
        for conn in replaced:
            await self.close(client.user, conn, REPLACED, "replaced by a newer connection")

    def claim_soon(self, client: Client) -> None:
        """``connected`` in a task of its own (tracked; closed with the node)."""
        task = asyncio.create_task(self.connected(client))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def disconnected(self, client: Client) -> None:
        async def release() -> None:
            try:
                await self._writes.submit((client.user, self.conn(client)))
            except Unavailable as exc:  # the entry goes with the key's TTL
                log.warning("device of %s not released: %s", client.user, exc)

        task = asyncio.create_task(release())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self, user: str, conn: str, code: int, reason: str) -> None:
        """Close connection ``conn`` of ``user``: here, or on its node."""
        if conn.rsplit(":", 1)[0] == self.node:
            self._close_here(user, conn, code, reason)
        else:
            await self.teller.tell([user], CloseConn(conn, code, reason))

    async def _write_many(self, ops: list[DeviceClaim | tuple[str, str]]) -> list[list[str]]:
        """Claims (what each replaced), then releases ([]): one round trip each."""
        claims = [op for op in ops if isinstance(op, DeviceClaim)]
        releases = [op for op in ops if not isinstance(op, DeviceClaim)]
        replaced = iter(await self.store.claim_many(claims) if claims else [])
        if releases:
            await self.store.release_many(releases)
        return [next(replaced) if isinstance(op, DeviceClaim) else [] for op in ops]

    async def devices(self, user: str) -> list[dict[str, Any]]:
        """The user's connected devices, on live nodes, oldest first."""
        return (await self.devices_many([user]))[0]

    async def devices_many(self, users: Sequence[str]) -> list[list[dict[str, Any]]]:
        """``devices`` of each user, one round trip."""
        return [[{"device": d.device, "platform": d.platform, "since": d.since_ms}
                 for d in found if self.alive(d.node)]
                for found in await self.store.devices_many(users)]

    async def disconnect_device(self, user: str, device: str) -> int:
        """Close ``device``'s connections (4003); how many there were."""
        found = [d for d in await self.store.devices(user) if d.device == device]
        for d in found:
            await self.store.release(user, d.conn)
            await self.close(user, d.conn, CLOSED_BY_SERVER, "disconnected by the server")
        return len(found)

    def apply_control(self, users: list[str], ctl: CloseConn) -> Awaitable[Any] | None:
        for user in users:
            self._close_here(user, ctl.conn, ctl.code, ctl.reason)
        return None

    def _close_here(self, user: str, conn: str, code: int, reason: str) -> None:
        node, _, cid = conn.rpartition(":")
        client = self.hub.users.get(user, {}).get(int(cid)) if cid.isdigit() else None
        if node != self.node or client is None:
            return
        if code == REPLACED:
            self.replaced()
        task = asyncio.ensure_future(client.ws.close(code, reason))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def close_all(self) -> None:
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        await self._writes.close()
