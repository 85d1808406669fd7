"""The node's local map: user -> connections (several devices each).

Writes never await: a frame is handed to the socket's transport if its
write buffer is under the bound, and skipped (counted) otherwise. A chat
message skipped here is still in the receiver's offline store. A client
skipped for backlog is noted in ``Hub.stuck``; one that stays stuck past a
time bound is closed by the node (it recovers through sync).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from core.ratelimit import TokenBucket
from gateway.metrics import NodeMetrics

__all__ = ["Client", "Hub"]

_ids = itertools.count(1)


@dataclass(eq=False, slots=True)
class Client:
    """One connected device."""

    user: str
    ws: ServerConnection
    bucket: TokenBucket
    id: int = field(default_factory=lambda: next(_ids))
    bad_frames: int = 0
    tasks: set[Any] | None = None  # in-flight ops; None until the first (memory)
    rooms: set[str] | None = None  # joined rooms; None until the first join (memory)
    groups: set[str] | None = None  # groups this device gets pushes of
    stuck_since: float = 0.0  # monotonic time of the first skipped write; 0: not stuck

    def write(self, frame: bytes, limit: int) -> bool:
        """Queue ``frame`` on the socket unless it is closed or backed up."""
        ws = self.ws
        if ws.protocol.state is not State.OPEN:
            return False
        if ws.transport.get_write_buffer_size() > limit:
            return False
        ws.protocol.send_text(frame)
        ws.send_data()
        return True


class Hub:
    """Local connections of one node, by user."""

    def __init__(self, metrics: NodeMetrics, write_buffer_max: int) -> None:
        self.metrics = metrics
        self.write_buffer_max = write_buffer_max
        self.users: dict[str, dict[int, Client]] = {}
        self.stuck: dict[int, Client] = {}  # clients whose writes are being skipped
        self.count = 0

    def add(self, client: Client) -> None:
        self.users.setdefault(client.user, {})[client.id] = client
        self.count += 1
        self.metrics.connections.set(self.count)

    def remove(self, client: Client) -> None:
        devices = self.users.get(client.user)
        if devices is None or devices.pop(client.id, None) is None:
            return
        if not devices:
            del self.users[client.user]
        self.stuck.pop(client.id, None)
        self.count -= 1
        self.metrics.connections.set(self.count)

    def clients(self) -> list[Client]:
        return [c for devices in self.users.values() for c in devices.values()]

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        devices = self.users.get(user)
        return self.write_each(devices.values(), frame, skip_conn) if devices else 0

    def write_each(self, clients: Iterable[Client], frame: bytes,
                   skip_conn: int | None = None) -> int:
        """``frame`` to each client but ``skip_conn``, never awaiting; a backed-up
        client is skipped (counted) and noted as stuck. Returns how many took it."""
        written = 0
        for client in clients:
            if client.id == skip_conn:
                continue
            if client.write(frame, self.write_buffer_max):
                written += 1
                if client.stuck_since:
                    self.unstuck(client)
            else:
                self.metrics.push_skipped.inc()
                self.mark_stuck(client, time.monotonic())
        self.metrics.pushes.inc(written)
        return written

    def mark_stuck(self, client: Client, now: float) -> None:
        if not client.stuck_since:
            client.stuck_since = now
            self.stuck[client.id] = client

    def unstuck(self, client: Client) -> None:
        client.stuck_since = 0.0
        self.stuck.pop(client.id, None)

    def stuck_longer_than(self, seconds: float, now: float) -> list[Client]:
        """Clients whose writes have been skipped for over ``seconds``."""
        return [c for c in self.stuck.values() if now - c.stuck_since > seconds]
