"""The wire: the one place frames are written to a socket around websockets.

Replies and pushes are complete WebSocket frames (``ws_text_frame``, RFC 6455
5.2) built once by the caller and written straight to the connection's
transport, never awaiting: encoding a broadcast once and writing the same
bytes to every recipient is what makes room and group fan-out cheap. This
bypasses websockets' own framing, which is safe because the node never sends
fragmented messages and websockets writes each of its own frames (pings,
pongs, closes) to the transport in the step that makes it, so a raw frame
never lands inside one of its frames (tests/integration/gateway/test_wire.py
interleaves the two on a real connection, with websockets 15 to 17). Every
raw access to a socket goes through this module: ``is_open``, ``is_closing``,
``buffered``, ``write``, ``writelines``, ``abort``, ``write_wires`` (one
reply under the open-state check and the bound), ``lighten`` (what an idle
connection keeps of websockets' state), ``NodeConnection`` (the answers to
the keepalive's pings, read without websockets' parser), and the ``SocketWriter``
that fans one frame out to many (its loop inlines the same checks: it is the
room and group fan-out's hot path).

- ``SocketWriter``: writes WebSocket wire bytes, built once by the caller, to
  each recipient's transport without awaiting. It owns the rules: only OPEN
  sockets are written; a socket whose write buffer is over the bound is
  skipped (counted) and noted as stuck; a write that goes through clears
  that; a socket stuck too long is aborted. Its member loop runs in C
  (``gateway/_fanout.c``, built by setup.py where a compiler is found) or, the
  same loop, in Python: the C loop also sends on the socket itself (send(2))
  when nothing is queued on its transport, which is what the event loop's own
  write does first, without the interpreter's work around it. ``FANOUT`` says
  which loop this process runs.
"""

from __future__ import annotations

import collections
import enum
import logging
import struct
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol, TypeVar

from websockets.asyncio.server import ServerConnection
from websockets.protocol import State
from websockets.streams import StreamReader

__all__ = ["FANOUT", "Count", "NodeConnection", "Peer", "SocketWriter", "Written", "abort",
           "buffered", "is_closing", "is_open", "lighten", "socket_fd", "write", "write_wires",
           "writelines", "ws_text_frame"]

log = logging.getLogger("gateway.wire")

try:
    from gateway import _fanout
except ImportError:  # not built (no C compiler where it was installed): the Python loop
    _fanout = None  # type: ignore[assignment]

FANOUT = "c" if _fanout is not None else "python"
# Transports whose socket the C loop may send on when nothing is queued: plain
# TCP, uvloop's and asyncio's (their own write does just that first). Never TLS.
_PLAIN_TCP = {("uvloop.loop", "TCPTransport"),
              ("asyncio.selector_events", "_SelectorSocketTransport")}

_OPEN = State.OPEN
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")


def ws_text_frame(payload: bytes) -> bytes:
    """A complete, unmasked (server to client), uncompressed WebSocket text frame
    (RFC 6455 5.2). Built once per message: the node's socket writer
    (``gateway/hub.py``) writes the same bytes to every recipient."""
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 1 << 16:
        return bytes((0x81, 126)) + _U16.pack(n) + payload
    return bytes((0x81, 127)) + _U64.pack(n) + payload


T = TypeVar("T")


class _ListQueue(list[T]):
    """The deque operations websockets' frame queue uses, on a list: an empty
    list is 56 bytes, an empty deque 760 (its first block). The queue holds
    the frames of one message being read, a few at most."""

    __slots__ = ()

    def popleft(self) -> T:
        return self.pop(0)

    def extendleft(self, items: Iterable[T]) -> None:
        self[:0] = list(items)[::-1]


def lighten(ws: ServerConnection) -> None:
    """Drop what an open connection keeps of websockets' state and never reads
    again (about 4.3 KB of the ~13.5 KB of an idle connection, measured with
    tracemalloc): the handshake's headers, which websockets' parser keeps
    alive for the connection's whole life (a local of its generator), and two
    empty deques that a list serves as well. Call once, after the handshake.
    Each part is only done when websockets' objects look as expected."""
    request = ws.request
    headers = getattr(request, "headers", None)
    if headers is not None and hasattr(headers, "clear"):
        headers.clear()  # the parser's reference to the request stays; its contents go
    ws.response = None
    waiters = getattr(ws, "drain_waiters", None)
    if isinstance(waiters, collections.deque) and not waiters:
        ws.drain_waiters = []  # type: ignore[assignment]  # append / remove / iterate
    frames = getattr(getattr(ws, "recv_messages", None), "frames", None)
    queue = getattr(frames, "queue", None)
    if isinstance(queue, collections.deque) and not queue:
        frames.queue = _ListQueue()  # type: ignore[union-attr]


_AT_EOF = StreamReader.at_eof.__code__  # where websockets' parser waits between frames
_PONG_HEAD = b"\x8a\x84"  # FIN + pong, masked (client to server), 4 bytes of payload


class NodeConnection(ServerConnection):
    """websockets' server connection, but a pong to the first ping still
    waiting is read here, without websockets' parser: the answers to the
    keepalive's pings (``gateway.ws.keepalive``) are most of an idle
    connection's traffic. Only when the bytes received are exactly one such
    frame (10 bytes) and websockets' parser stands between two frames (it is
    waiting in ``at_eof`` with nothing buffered); everything else goes to
    websockets unchanged. Answering the oldest ping only is what websockets
    does with it (``acknowledge_pings``), so its state is the same either way."""

    def data_received(self, data: bytes) -> None:
        if len(data) == 10 and data[:2] == _PONG_HEAD and self.pending_pings \
                and self.protocol.state is _OPEN and _between_frames(self):
            key = (int.from_bytes(data[6:10], "big")
                   ^ int.from_bytes(data[2:6], "big")).to_bytes(4, "big")
            pending = self.pending_pings
            if key == next(iter(pending)):
                waiter, sent_at = pending.pop(key)
                self.latency = self.loop.time() - sent_at
                if not waiter.done():
                    waiter.set_result(self.latency)
                return
        super().data_received(data)


def _between_frames(ws: ServerConnection) -> bool:
    protocol = ws.protocol
    if protocol.reader.buffer:
        return False
    g: Any = protocol.parser
    while (inner := g.gi_yieldfrom) is not None:
        g = inner
    return g.gi_code is _AT_EOF


def socket_fd(transport: Any) -> int:
    """The socket of a plain TCP ``transport`` (the fan-out's C loop may write it
    directly while nothing is queued); -1 for any other (TLS, a test's fake)."""
    kind = type(transport)
    if (kind.__module__, kind.__qualname__) not in _PLAIN_TCP \
            or transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    return -1 if sock is None else int(sock.fileno())


def is_open(ws: ServerConnection) -> bool:
    """Whether frames may be written: the WebSocket is OPEN (no close sent or
    received) and the transport is not being torn down."""
    return ws.protocol.state is _OPEN and not ws.transport.is_closing()


def is_closing(ws: ServerConnection) -> bool:
    """Whether the transport is closing or was aborted (its reads are over)."""
    return ws.transport.is_closing()


def buffered(ws: ServerConnection) -> int:
    """Bytes queued on the socket and not yet taken by the kernel."""
    return ws.transport.get_write_buffer_size()


def write(ws: ServerConnection, wire: bytes) -> None:
    """Queue complete frame bytes on the socket; never awaits (check first)."""
    ws.transport.write(wire)


def writelines(ws: ServerConnection, wires: Sequence[bytes]) -> None:
    """Queue several complete frames in one call; never awaits (check first)."""
    ws.transport.writelines(wires)


def abort(ws: ServerConnection) -> None:
    """Drop the connection at once: a close handshake would queue behind a
    backlog that is the reason for dropping it."""
    ws.transport.abort()


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
    if buffered(ws) > limit:
        return _FULL
    if len(wires) == 1:
        write(ws, wires[0])
    else:
        writelines(ws, wires)
    return _SENT


class Peer(Protocol):
    """A connected device as the writer sees it (``gateway.hub.Client``)."""

    @property
    def id(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def ws(self) -> ServerConnection: ...
    @property
    def proto(self) -> Any:  # ``ws.protocol``
        ...
    @property
    def transport(self) -> Any:  # ``ws.transport``
        ...
    @property
    def fd(self) -> int:  # ``socket_fd(transport)``
        ...
    stuck_since: float


class Count(Protocol):
    """A counter (``prometheus_client.Counter`` or one of its labelled children)."""

    def inc(self, amount: float = 1) -> None: ...


class SocketWriter:
    """Writes the same wire bytes to many sockets; owns the skip and stuck rules.

    ``skipped`` counts recipients skipped for backlog unless a call names its
    own counter; ``closed`` counts sockets aborted for staying stuck. ``in_c``:
    run the member loop in C when it is built (False: the Python loop, for tests).
    """

    def __init__(self, skipped: Count, closed: Count, *, in_c: bool = True) -> None:
        self.skipped = skipped
        self.closed = closed
        self.stuck: dict[int, Peer] = {}  # clients whose writes are being skipped
        self._c = _fanout if in_c else None

    def write_each(self, clients: Iterable[Peer | None], wires: Sequence[bytes], limit: int,
                   skip_conn: int | None = None, *, skipped: Count | None = None) -> int:
        """``wires`` to each client but ``skip_conn``, never awaiting; a client with
        over ``limit`` bytes queued is skipped, counted and noted as stuck; ``None``
        (a room member that left, in a big room's list) is passed over.
        Returns how many took them."""
        full: list[Peer] = []
        # Several frames go as one buffer, one write.
        data = wires[0] if len(wires) == 1 else b"".join(wires)
        if self._c is not None:
            unstuck: list[Peer] = []
            written: int = self._c.write_each(clients, data, limit,
                                         -1 if skip_conn is None else skip_conn, _OPEN,
                                         full, unstuck)
            for client in unstuck:
                self.unstuck(client)
        else:
            written = self._write_each(clients, data, limit, skip_conn, full)
        if full:
            (skipped or self.skipped).inc(len(full))
            now = time.monotonic()
            for client in full:
                self.mark_stuck(client, now)
        return written

    def _write_each(self, clients: Iterable[Peer | None], data: bytes, limit: int,
                    skip_conn: int | None, full: list[Peer]) -> int:
        """The member loop in Python: what ``gateway/_fanout.c`` does, through
        each transport's own write."""
        written = 0
        # ``write_wires`` inlined: this loop is the room and group fan-out's hot path
        # (one pass per member per frame).
        for client in clients:
            if client is None or (skip_conn is not None and client.id == skip_conn):
                continue
            if client.proto.state is not _OPEN:
                continue
            transport = client.transport
            if transport.get_write_buffer_size() > limit:
                full.append(client)
                continue
            transport.write(data)
            written += 1
            if client.stuck_since:
                self.unstuck(client)
        return written

    def mark_stuck(self, client: Peer, now: float) -> None:
        if not client.stuck_since:
            client.stuck_since = now
            self.stuck[client.id] = client

    def unstuck(self, client: Peer) -> None:
        """A write went through (or the client is gone): not stuck any more."""
        client.stuck_since = 0.0
        self.stuck.pop(client.id, None)

    def stuck_longer_than(self, seconds: float, now: float) -> list[Peer]:
        """Peers whose writes have been skipped for over ``seconds``."""
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
            abort(client.ws)
        return len(stale)
