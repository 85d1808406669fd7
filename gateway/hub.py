"""The node's local connection maps and the 1:1 push path.

- ``Client``: one connected device (kept small: one per idle connection).
- ``ConnectionIndex``: key -> {conn id: client}, shared by the room, group and
  presence maps. Adding and removing are O(1); an emptied key leaves the
  index; the keys a client is under are kept on the client itself
  (``Client.rooms`` / ``groups`` / ``watching``), ``None`` while it is under
  none, so an idle connection holds no set.
- ``Hub``: user -> devices, and the push to them. A push frame (encoded JSON)
  is framed for the wire once and written through the node's one
  ``SocketWriter`` (``gateway.wire``) to every device, never awaiting: a
  socket that is not open is passed over, one whose write buffer is over the
  bound is skipped (counted) and noted as stuck. A chat message skipped here
  is still in the receiver's offline store; a client that stays stuck is
  closed by the node (it recovers through sync).
"""

from __future__ import annotations

import itertools
from asyncio import Transport
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast

from websockets.asyncio.server import ServerConnection
from websockets.protocol import Protocol

from gateway.metrics import NodeMetrics
from gateway.wire import SocketWriter, Written, socket_fd, write_wires, ws_text_frame

__all__ = ["Client", "ConnectionIndex", "Hub"]

_ids = itertools.count(1)
K = TypeVar("K", bound=str)


@dataclass(eq=False, slots=True)
class Client:
    """One connected device."""

    user: str
    ws: ServerConnection
    id: int = field(default_factory=lambda: next(_ids))
    tasks: set[Any] | None = None  # in-flight ops; None until the first (memory)
    rooms: set[str] | None = None  # joined rooms; None while in none (memory)
    groups: set[str] | None = None  # groups this device gets pushes of; None while none
    watching: set[str] | None = None  # users whose presence it watches; None while none
    stuck_since: float = 0.0  # monotonic time of the first skipped write; 0: not stuck
    expires: int = 0  # the second its token expires (gateway.ws.expiry); 0: not tracked
    iat: float = 0.0  # its token's iat (0: none given): what a revocation compares
    device: str = ""  # the device id it named (or was given), and its platform
    platform: str = "other"
    ka_slot: int = -1  # its keepalive slot (gateway.ws.keepalive); -1: none
    ka_ping: bytes = b""  # the payload of its last keepalive ping
    # ``ws.protocol`` and ``ws.transport``, kept here for the fan-out loops: at
    # 10,000 members, reaching them through ``ws`` costs cache misses per member.
    proto: Protocol = field(init=False, repr=False)
    transport: Transport = field(init=False, repr=False)
    fd: int = field(init=False, repr=False)  # its socket (``wire.socket_fd``); -1: none

    def __post_init__(self) -> None:
        self.proto = self.ws.protocol
        self.transport = self.ws.transport
        self.fd = socket_fd(self.transport)

    def write(self, frame: bytes, limit: int) -> bool:
        """One encoded JSON ``frame`` (a reply) to this socket alone, under the same
        open-state check and bound as pushes; True if it was queued."""
        return write_wires(self.ws, (ws_text_frame(frame),), limit) is Written.SENT


class ConnectionIndex(Generic[K]):
    """key -> {conn id: client}, with each client's keys kept on the client.

    ``slot`` names the client attribute holding its keys (a set, or None while
    it is under none). Nothing here is proportional to the number of keys.
    """

    def __init__(self, slot: Literal["rooms", "groups", "watching"]) -> None:
        self._slot = slot
        self._conns: dict[K, dict[int, Client]] = {}
        self.memberships = 0  # (key, connection) pairs

    def add(self, key: K, client: Client) -> bool:
        """Put ``client`` under ``key``; True if it is the key's first local connection."""
        conns = self._conns.get(key)
        first = conns is None
        if conns is None:
            conns = self._conns[key] = {}
        elif client.id in conns:
            return False
        conns[client.id] = client
        keys = self._keys(client)
        if keys is None:
            setattr(client, self._slot, {key})
        else:
            keys.add(key)
        self.memberships += 1
        return first

    def remove(self, key: K, client: Client) -> bool:
        """Take ``client`` from ``key``; True if that emptied the key here."""
        conns = self._conns.get(key)
        if conns is None or conns.pop(client.id, None) is None:
            return False
        keys = self._keys(client)
        if keys is not None:
            keys.discard(key)
            if not keys:
                setattr(client, self._slot, None)
        self.memberships -= 1
        if conns:
            return False
        del self._conns[key]
        return True

    def remove_all(self, client: Client) -> tuple[list[K], list[K]]:
        """Take ``client`` from every key: (keys left, keys emptied)."""
        keys = self._keys(client)
        if not keys:
            return [], []
        setattr(client, self._slot, None)
        left, emptied = list(keys), []
        for key in left:
            conns = self._conns.get(key)
            if conns is None or conns.pop(client.id, None) is None:
                continue
            self.memberships -= 1
            if not conns:
                del self._conns[key]
                emptied.append(key)
        return left, emptied

    def get(self, key: K) -> Mapping[int, Client] | None:
        """The key's local connections by id, or None if it has none."""
        return self._conns.get(key)

    def count(self, key: K) -> int:
        conns = self._conns.get(key)
        return len(conns) if conns else 0

    def keys_of(self, client: Client) -> AbstractSet[K]:
        """The keys ``client`` is under (empty for an idle connection)."""
        return self._keys(client) or frozenset()

    def __contains__(self, key: object) -> bool:
        return key in self._conns

    def __iter__(self) -> Iterator[K]:
        return iter(self._conns)

    def __len__(self) -> int:
        return len(self._conns)

    def _keys(self, client: Client) -> set[K] | None:
        return cast("set[K] | None", getattr(client, self._slot))


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
