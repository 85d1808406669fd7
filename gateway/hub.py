"""The node's local map: user -> connections (several devices each), and the
1:1 push path.

A push frame (encoded JSON) is framed for the wire once and written through
the node's one ``SocketWriter`` (``gateway/connections.py``) to every device,
never awaiting: a socket that is not open is passed over, one whose write
buffer is over the bound is skipped (counted) and noted as stuck. A chat
message skipped here is still in the receiver's offline store; a client that
stays stuck is closed by the node (it recovers through sync).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.connections import Client, SocketWriter
from gateway.fanout import ws_text_frame
from gateway.metrics import NodeMetrics

__all__ = ["Client", "Hub"]


class Hub:
    """Local connections of one node, by user; owns the node's socket writer."""

    def __init__(self, metrics: NodeMetrics, write_buffer_max: int) -> None:
        self.metrics = metrics
        self.write_buffer_max = write_buffer_max
        self.writer = SocketWriter(metrics.push_skipped, metrics.closed.labels("stuck"))
        self.users: dict[str, dict[int, Client]] = {}
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
        self.writer.unstuck(client)
        self.count -= 1
        self.metrics.connections.set(self.count)

    def clients(self) -> list[Client]:
        return [c for devices in self.users.values() for c in devices.values()]

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        devices = self.users.get(user)
        return self.write_each(devices.values(), frame, skip_conn) if devices else 0

    def write_each(self, clients: Iterable[Client], frame: bytes,
                   skip_conn: int | None = None) -> int:
        """``frame`` to each client but ``skip_conn``, framed once; returns how many
        took it (``im_pushes_total``; skips count in ``im_push_skipped_total``)."""
        written = self.writer.write_each(clients, (ws_text_frame(frame),),
                                         self.write_buffer_max, skip_conn)
        self.metrics.pushes.inc(written)
        return written
