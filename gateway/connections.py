"""Local connections: the device record, the key -> connections index that rooms
and groups share, and the one writer every frame to a socket goes through.

- ``ConnectionIndex``: key -> {conn id: client}. Adding and removing are O(1);
  an emptied key leaves the index; the keys a client is under are kept on the
  client itself (``Client.rooms`` / ``Client.groups``), ``None`` while it is
  under none, so an idle connection holds no set.
- ``SocketWriter``: writes WebSocket wire bytes (``fanout.ws_text_frame``,
  RFC 6455 5.2), built once by the caller, to each recipient's transport
  without awaiting. It owns the rules: only OPEN sockets are written; a
  socket whose write buffer is over the bound is skipped (counted) and noted
  as stuck; a write that goes through clears that; a socket stuck too long is
  aborted. Writing frames straight to the transport bypasses ``websockets``'
  framing, which is safe because the node never sends fragmented messages
  and ``websockets`` flushes its own frames (pings, pongs, closes) to the
  transport in the step that makes them, so frames never interleave.
"""

from __future__ import annotations

import enum
import itertools
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar, cast

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State

from gateway.fanout import ws_text_frame

__all__ = ["Client", "ConnectionIndex", "Count", "SocketWriter", "Written", "write_wires"]

log = logging.getLogger("gateway.connections")

_ids = itertools.count(1)
_OPEN = State.OPEN

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
    expires: int = 0  # the second its token expires (gateway.expiry); 0: not tracked
    iat: float = 0.0  # its token's iat (0: none given): what a revocation compares

    def write(self, frame: bytes, limit: int) -> bool:
        """One encoded JSON ``frame`` (a reply) to this socket alone, under the same
        open-state check and bound as pushes; True if it was queued."""
        return write_wires(self.ws, (ws_text_frame(frame),), limit) is Written.SENT


class Written(enum.Enum):
    """What became of one write."""

    SENT = "sent"
    FULL = "full"  # the write buffer was over the bound: skipped
    CLOSED = "closed"  # the socket was not OPEN: skipped


_SENT, _FULL, _CLOSED = Written.SENT, Written.FULL, Written.CLOSED


def write_wires(ws: ServerConnection, wires: Sequence[bytes], limit: int) -> Written:
    """Queue ``wires`` (complete frames) on ``ws``'s transport unless the socket is
    not OPEN or more than ``limit`` bytes are already queued. Never awaits."""
    if ws.protocol.state is not _OPEN:
        return _CLOSED
    transport = ws.transport
    if transport.get_write_buffer_size() > limit:
        return _FULL
    if len(wires) == 1:
        transport.write(wires[0])
    else:
        transport.writelines(wires)
    return _SENT


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


class Count(Protocol):
    """A counter (``prometheus_client.Counter`` or one of its labelled children)."""

    def inc(self, amount: float = 1) -> None: ...


class SocketWriter:
    """Writes the same wire bytes to many sockets; owns the skip and stuck rules.

    ``skipped`` counts recipients skipped for backlog unless a call names its
    own counter; ``closed`` counts sockets aborted for staying stuck.
    """

    def __init__(self, skipped: Count, closed: Count) -> None:
        self.skipped = skipped
        self.closed = closed
        self.stuck: dict[int, Client] = {}  # clients whose writes are being skipped

    def write_each(self, clients: Iterable[Client], wires: Sequence[bytes], limit: int,
                   skip_conn: int | None = None, *, skipped: Count | None = None) -> int:
        """``wires`` to each client but ``skip_conn``, never awaiting; a client with
        over ``limit`` bytes queued is skipped, counted and noted as stuck.
        Returns how many took them."""
        written = 0
        full: list[Client] = []
        # ``write_wires`` inlined: this loop is the room and group fan-out's hot path
        # (one pass per member per frame); several frames go as one buffer, one write.
        data = wires[0] if len(wires) == 1 else b"".join(wires)
        for client in clients:
            if client.id == skip_conn:
                continue
            ws = client.ws
            if ws.protocol.state is not _OPEN:
                continue
            transport = ws.transport
            if transport.get_write_buffer_size() > limit:
                full.append(client)
                continue
            transport.write(data)
            written += 1
            if client.stuck_since:
                self.unstuck(client)
        if full:
            (skipped or self.skipped).inc(len(full))
            now = time.monotonic()
            for client in full:
                self.mark_stuck(client, now)
        return written

    def mark_stuck(self, client: Client, now: float) -> None:
        if not client.stuck_since:
            client.stuck_since = now
            self.stuck[client.id] = client

    def unstuck(self, client: Client) -> None:
        """A write went through (or the client is gone): not stuck any more."""
        client.stuck_since = 0.0
        self.stuck.pop(client.id, None)

    def stuck_longer_than(self, seconds: float, now: float) -> list[Client]:
        """Clients whose writes have been skipped for over ``seconds``."""
        return [c for c in self.stuck.values() if now - c.stuck_since > seconds]

    def close_stuck(self, seconds: float, now: float) -> int:
        """Abort the sockets stuck for over ``seconds``; returns how many. The
        client recovers by reconnecting and syncing."""
        stale = self.stuck_longer_than(seconds, now)
        for client in stale:
            log.info("closing a stuck connection of %s (write buffer full for %.0fs)",
                     client.user, now - client.stuck_since)
            self.unstuck(client)
            self.closed.inc()
            client.ws.transport.abort()  # a close handshake would queue behind the backlog
        return len(stale)
