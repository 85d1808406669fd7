"""gateway/wire.py's claim, on a real connection: raw frames written straight to
the transport never land inside one of websockets' own frames, because
websockets writes each of its frames (pings, pongs, close) to the transport in
the step that makes it.

A websockets server (``websockets.asyncio.server.serve`` on 127.0.0.1, as the
node runs it: no compression; no gateway node) writes many raw text frames of
sizes from 0 to 256 KiB (the 7-bit, 16-bit and 64-bit length forms) through
gateway.wire (``write_wires``, one frame and several at once, and a
``SocketWriter`` running its member loop in Python and one running it in C,
which sends on the socket itself while nothing is queued on the transport and
hands what the kernel did not take to the transport) while websockets itself
sends pings (``ws.ping()`` and keepalive pings every 10 ms), answers the
client's pings, and then closes with a code and reason of the test's own. The
sockets' kernel buffers are small (8 KiB), so the stream backs up into the
transport's buffer and many of websockets' frames are made with raw bytes
queued ahead of them (checked).
Every frame websockets makes is logged as it is made (the server protocol's
``send_frame``, wrapped on the instance), every raw one as it is written: the
log is the order the frames were produced in. Two clients check the stream: a
websockets client (every message intact and in order, every ping answered, the
close as sent), and a raw one parsing the bytes with websockets' own
``Frame.parse``: the frames on the wire are exactly the log, in its order (a
frame of websockets queued in one step and written in a later one would be out
of place; one written in pieces would not parse). Then the seam's own rules:
once websockets' close has started, ``is_open`` is False and the writers skip
the socket; ``abort`` (and ``SocketWriter.close_stuck``) drops it without a
close frame.

The order test runs once more on uvloop, the node's event loop (the others run
on asyncio's: the C loop knows both transports). And the C loop's own send of
a frame bigger than the kernel takes: the rest queued on the transport, then
the frames after it, all arrive whole and in order.

pyproject.toml admits the websockets versions this test passes with.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import contextlib
import os
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed, ConnectionClosedError
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import State
from websockets.streams import StreamReader

from gateway.wire import (
    FANOUT,
    SocketWriter,
    Written,
    abort,
    buffered,
    is_closing,
    is_open,
    socket_fd,
    write_wires,
    ws_text_frame,
)

# The three length forms of RFC 6455 5.2 on each side of their bounds.
SIZES = (0, 1, 125, 126, 127, 1_000, 65_535, 65_536, 70_000, 262_144)
NO_LIMIT = 1 << 40  # the writers' backlog bound: never reached here
KERNEL_BUFFER = 8_192  # SO_SNDBUF of the server's sockets, SO_RCVBUF of the clients'
KEEPALIVE_S = 0.01
CLOSE_CODE, CLOSE_REASON = 1001, "done: all frames written"  # 1001: as a draining node
MIN_ROUNDS, MAX_S = 6, 20.0  # rounds of SIZES; the stream's time bound

Logged = tuple[Opcode, bytes]


def payload(i: int, n: int) -> bytes:
    """Text frame ``i``'s payload: ``n`` bytes of ASCII that say which frame it is."""
    seed = f"<{i}>".encode()
    return (seed * (n // len(seed) + 1))[:n]


class _Count:
    def __init__(self) -> None:
        self.n = 0

    def inc(self, amount: float = 1) -> None:
        self.n += int(amount)


@dataclass
class _Peer:
    """A recipient as ``SocketWriter`` sees one (``gateway.hub.Client``)."""

    id: int
    user: str
    ws: ServerConnection
    stuck_since: float = 0.0
    fd: int = -1  # its socket, for the C loop's own send (``socket_fd``); -1: none

    @classmethod
    def of(cls, conn_id: int, ws: ServerConnection) -> _Peer:
        """As the node makes one: with its socket."""
        return cls(conn_id, "u", ws, fd=socket_fd(ws.transport))

    @property
    def proto(self) -> Any:
        return self.ws.protocol

    @property
    def transport(self) -> Any:
        return self.ws.transport


def _small_buffer(sock: Any, which: int) -> None:
    """Shrink a socket's kernel buffer: the stream then backs up into the
    transport's own buffer, so websockets' frames are queued behind raw ones."""
    sock.setsockopt(socket.SOL_SOCKET, which, KERNEL_BUFFER)


async def _client_socket(url: str) -> socket.socket:
    """A TCP connection to ``url`` with a small receive buffer (set before connecting)."""
    host, port = url.removeprefix("ws://").rstrip("/").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _small_buffer(sock, socket.SO_RCVBUF)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    return sock


def _log_own_frames(conn: ServerConnection | ClientConnection, log: list[Logged],
                    backlog: list[int] | None = None) -> None:
    """Log each frame websockets makes on ``conn`` as it makes it (and in
    ``backlog``, the bytes queued on the transport ahead of it)."""
    make = conn.protocol.send_frame

    def send_frame(frame: Frame) -> None:
        log.append((frame.opcode, bytes(frame.data)))
        if backlog is not None:
            backlog.append(conn.transport.get_write_buffer_size())
        make(frame)

    conn.protocol.send_frame = send_frame  # type: ignore[method-assign]


@dataclass
class Stream:
    """What the streaming handler did on one connection."""

    log: list[Logged] = field(default_factory=list)  # every frame, in the order made
    backlog: list[int] = field(default_factory=list)  # queued ahead of each own frame
    explicit_pings: list[bytes] = field(default_factory=list)
    pongs_waited: int = 0  # explicit pings whose pong came back
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: BaseException | None = None

    def own(self, opcode: Opcode) -> list[bytes]:
        return [data for op, data in self.log if op is opcode]

    @property
    def texts(self) -> list[bytes]:
        return self.own(Opcode.TEXT)

    def queued_behind(self, opcode: Opcode) -> int:
        """How many of websockets' ``opcode`` frames were made with bytes
        (raw frames) still queued on the transport ahead of them."""
        own = [op for op, _ in self.log if op is not Opcode.TEXT]
        return sum(op is opcode and ahead > 0 for op, ahead in zip(own, self.backlog,
                                                                   strict=True))

    @property
    def keepalive_pings(self) -> int:
        return len([d for d in self.own(Opcode.PING) if d not in self.explicit_pings])


async def _stream(ws: ServerConnection, s: Stream) -> None:
    """Raw text frames through every writer of gateway.wire, websockets' pings
    among them, until enough keepalive pings and pongs were made; then the close."""
    _log_own_frames(ws, s.log, s.backlog)
    _small_buffer(ws.transport.get_extra_info("socket"), socket.SO_SNDBUF)
    writers = (SocketWriter(_Count(), _Count(), in_c=False), SocketWriter(_Count(), _Count()))
    peer = _Peer.of(1, ws)
    assert peer.fd >= 0
    pending: list[Awaitable[float]] = []
    started, i, rounds = time.monotonic(), 0, 0
    while rounds < MIN_ROUNDS or s.keepalive_pings < 3 or len(s.own(Opcode.PONG)) < 3:
        assert time.monotonic() - started < MAX_S, "no keepalive pings or pongs made"
        for n in SIZES:
            how = i % 4
            if how == 0:  # one frame
                body = payload(i, n)
                assert write_wires(ws, [ws_text_frame(body)], NO_LIMIT) is Written.SENT
                s.log.append((Opcode.TEXT, body))
            elif how == 1:  # two at once (``writelines``)
                first, second = payload(i, n), payload(i, SIZES[-1 - SIZES.index(n)])
                assert write_wires(ws, [ws_text_frame(first), ws_text_frame(second)],
                                   NO_LIMIT) is Written.SENT
                s.log += [(Opcode.TEXT, first), (Opcode.TEXT, second)]
            else:  # the fan-out writer: its loop in Python, then in C
                body = payload(i, n)
                assert writers[how - 2].write_each([peer], [ws_text_frame(body)], NO_LIMIT) == 1
                s.log.append((Opcode.TEXT, body))
            i += 1
            if i % 7 == 0:  # websockets' own ping, between two raw writes
                data = f"ping-{i}".encode()
                s.explicit_pings.append(data)
                pending.append(await ws.ping(data))
            elif i % 4 == 0:  # a turn for keepalive pings and for answering the client's
                await asyncio.sleep(0.002)
        rounds += 1
    assert buffered(ws) >= 0
    for waiter in pending:  # every explicit ping answered
        await asyncio.wait_for(waiter, 10)
        s.pongs_waited += 1
    await ws.close(CLOSE_CODE, CLOSE_REASON)


class _Servers:
    """websockets servers on 127.0.0.1, port 0, each running ``handler(ws, state)``
    on each connection (keepalive pings every 10 ms)."""

    def __init__(self) -> None:
        self.servers: list[Any] = []

    async def start(self, handler: Callable[[ServerConnection, Any], Awaitable[None]],
                    state: Callable[[], Any] = Stream) -> tuple[str, list[Any]]:
        """Its URL and the list of each connection's state as made."""
        states: list[Any] = []

        async def serve_one(ws: ServerConnection) -> None:
            st = state()
            states.append(st)
            try:
                await handler(ws, st)
            except BaseException as exc:
                if isinstance(st, Stream):
                    st.error = exc
                raise
            finally:
                if isinstance(st, Stream):
                    st.done.set()

        srv = await serve(serve_one, "127.0.0.1", 0, compression=None, max_size=None,
                          ping_interval=KEEPALIVE_S, ping_timeout=10)
        self.servers.append(srv)
        port = next(iter(srv.sockets)).getsockname()[1]
        return f"ws://127.0.0.1:{port}/", states

    async def close(self) -> None:
        for srv in self.servers:
            srv.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(srv.wait_closed(), 5)


@pytest.fixture
async def server() -> AsyncIterator[Callable[..., Awaitable[tuple[str, list[Any]]]]]:
    """``start(handler)``: see ``_Servers.start``."""
    servers = _Servers()
    yield servers.start
    await servers.close()


async def test_a_websockets_client_gets_every_frame_the_pongs_and_the_close(server):
    url, states = await server(_stream)
    client_log: list[Logged] = []
    got: list[str | bytes] = []
    answered = 0
    async with connect(url, compression=None, max_size=None, ping_interval=KEEPALIVE_S,
                       ping_timeout=10, sock=await _client_socket(url)) as client:
        _log_own_frames(client, client_log)

        async def ping_now_and_then() -> None:
            nonlocal answered
            with contextlib.suppress(ConnectionClosed):
                for k in range(1_000):
                    await asyncio.wait_for(await client.ping(f"client-{k}".encode()), 10)
                    answered += 1
                    await asyncio.sleep(0.003)

        pinger = asyncio.create_task(ping_now_and_then())
        try:
            async for message in client:  # until the close (ConnectionClosedOK ends it)
                got.append(message)
        finally:
            pinger.cancel()
            await asyncio.gather(pinger, return_exceptions=True)
        rcvd = client.protocol.close_rcvd
    (s,) = states
    await asyncio.wait_for(s.done.wait(), 10)
    assert s.error is None
    texts = s.texts
    assert len(texts) >= MIN_ROUNDS * len(SIZES)
    assert {len(t) for t in texts} >= set(SIZES)
    assert len(got) == len(texts)
    assert [m.encode() if isinstance(m, str) else m for m in got] == texts  # intact, in order
    assert all(isinstance(m, str) for m in got)  # text frames
    # Every ping the server made, explicit and keepalive, reached the client whole:
    # it answered each, in order; the server's explicit pings got their pongs.
    server_pings = s.own(Opcode.PING)
    assert s.keepalive_pings >= 3 and s.pongs_waited == len(s.explicit_pings) > 0
    # Under backpressure: websockets made pings and pongs behind queued raw bytes.
    assert s.queued_behind(Opcode.PING) and s.queued_behind(Opcode.PONG)
    client_pongs = [d for op, d in client_log if op is Opcode.PONG]
    assert client_pongs == server_pings
    # The server's pongs to the client's pings came through whole too.
    assert answered >= 3 and len(s.own(Opcode.PONG)) >= 3
    # A clean close, with the code and reason as sent (not 1006, not a keepalive timeout).
    assert rcvd == Close(CLOSE_CODE, CLOSE_REASON)
    assert client.protocol.close_sent == Close(CLOSE_CODE, CLOSE_REASON)
    assert s.own(Opcode.CLOSE) == [Close(CLOSE_CODE, CLOSE_REASON).serialize()]


class RawClient:
    """A WebSocket client of the test's own: the handshake by hand, the server's
    bytes parsed with ``Frame.parse``; answers pings, sends its own now and then."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.buffer = StreamReader()
        self.frames: list[Frame] = []
        self.sent_pings: list[bytes] = []
        self.bytes_read = 0

    @classmethod
    async def open(cls, url: str) -> RawClient:
        host, port = url.removeprefix("ws://").rstrip("/").split(":")
        reader, writer = await asyncio.open_connection(sock=await _client_socket(url))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write((f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                      f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                      "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 101 "), head
        assert b"sec-websocket-extensions" not in head.lower()  # no compression: raw bytes
        return cls(reader, writer)

    def send(self, opcode: Opcode, data: bytes) -> None:
        self.writer.write(Frame(opcode, data).serialize(mask=True))  # client frames: masked

    async def _read(self) -> bytes:
        chunk = await asyncio.wait_for(self.reader.read(65_536), 10)
        self.bytes_read += len(chunk)
        self.buffer.feed_data(chunk)
        return chunk

    async def next_frame(self) -> Frame | None:
        """The next frame; None at the end of the stream (between two frames)."""
        while not self.buffer.buffer:
            if not await self._read():
                return None
        parser = Frame.parse(self.buffer.read_exact, mask=False, max_size=None)
        while True:
            try:
                next(parser)  # more bytes needed
            except StopIteration as done:
                frame: Frame = done.value
                return frame
            assert await self._read(), "the connection ended inside a frame"

    async def run(self) -> Close:
        """Until the server ends the connection; the close it sent (echoed at once)."""
        close: Close | None = None
        while (frame := await self.next_frame()) is not None:
            self.frames.append(frame)
            assert frame.fin and not (frame.rsv1 or frame.rsv2 or frame.rsv3)
            if close is not None:  # a pong to a ping that crossed the close: nothing else
                assert frame.opcode is Opcode.PONG, frame
            elif frame.opcode is Opcode.PING:
                self.send(Opcode.PONG, bytes(frame.data))
            elif frame.opcode is Opcode.CLOSE:
                close = Close.parse(bytes(frame.data))
                self.send(Opcode.CLOSE, bytes(frame.data))
            elif frame.opcode is Opcode.TEXT and len(self.frames) % 9 == 0:
                ping = f"raw-{len(self.frames)}".encode()
                self.sent_pings.append(ping)
                self.send(Opcode.PING, ping)
        self.writer.close()
        assert close is not None, "the connection ended without a close frame"
        return close


async def test_the_bytes_on_the_wire_are_the_frames_in_the_order_made(server):
    await _frames_in_the_order_made(server)


def test_on_uvloop_too_the_bytes_on_the_wire_are_the_frames_in_the_order_made():
    """The node's event loop: its transport is the other kind the C loop knows."""
    uvloop = pytest.importorskip("uvloop")

    async def on_uvloop() -> str:
        servers = _Servers()
        try:
            await _frames_in_the_order_made(servers.start)
        finally:
            await servers.close()
        return type(asyncio.get_running_loop()).__module__

    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a loop of its own, apart
        assert pool.submit(uvloop.run, on_uvloop()).result(timeout=MAX_S + 60) == "uvloop"


async def _frames_in_the_order_made(
        start: Callable[..., Awaitable[tuple[str, list[Any]]]]) -> None:
    url, states = await start(_stream)
    raw = await RawClient.open(url)
    close = await asyncio.wait_for(raw.run(), MAX_S + 20)
    (s,) = states
    await asyncio.wait_for(s.done.wait(), 10)
    assert s.error is None
    seen = [(f.opcode, bytes(f.data)) for f in raw.frames]
    # The whole stream is the frames in the order they were made: raw text frames
    # and websockets' own pings, pongs and close, none inside another, none moved.
    assert seen == s.log
    assert len(s.texts) >= MIN_ROUNDS * len(SIZES) and {len(t) for t in s.texts} >= set(SIZES)
    assert s.keepalive_pings >= 3 and s.pongs_waited == len(s.explicit_pings) > 0
    assert s.queued_behind(Opcode.PING) and s.queued_behind(Opcode.PONG)
    # The server answered the raw client's pings, each with its own payload, in order.
    pongs = [d for op, d in seen if op is Opcode.PONG]
    assert len(pongs) >= 3 and pongs == raw.sent_pings[:len(pongs)]
    assert close == Close(CLOSE_CODE, CLOSE_REASON)
    assert raw.bytes_read > sum(len(t) for t in s.texts)


# -- the seam's rules around a close and an abort --------------------------------
@dataclass
class Checks:
    seen: dict[str, Any] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


async def _close_then_write(ws: ServerConnection, c: Checks) -> None:
    writer = SocketWriter(_Count(), _Count())
    peer = _Peer.of(7, ws)
    try:
        assert is_open(ws)
        assert write_wires(ws, [ws_text_frame(b"before")], NO_LIMIT) is Written.SENT
        closing = asyncio.create_task(ws.close(1000, "going away now"))
        for _ in range(100):  # websockets' close starts (its frame made and written)
            if ws.protocol.state is not State.OPEN:
                break
            await asyncio.sleep(0)
        c.seen["state"] = ws.protocol.state
        c.seen["is_open"] = is_open(ws)
        c.seen["write_wires"] = write_wires(ws, [ws_text_frame(b"after")], NO_LIMIT)
        c.seen["write_each"] = writer.write_each([peer], [ws_text_frame(b"after")], NO_LIMIT)
        c.seen["skipped"] = writer.skipped.n  # type: ignore[attr-defined]
        await closing
        c.seen["closed_state"] = ws.protocol.state
        c.seen["write_after_closed"] = write_wires(ws, [ws_text_frame(b"late")], NO_LIMIT)
    finally:
        c.done.set()


async def test_once_the_close_started_the_writers_skip_the_socket(server):
    url, states = await server(_close_then_write, Checks)
    got: list[str | bytes] = []
    async with connect(url, compression=None, ping_interval=None) as client:
        async for message in client:
            got.append(message)
    (c,) = states
    await asyncio.wait_for(c.done.wait(), 10)
    assert c.seen["state"] is State.CLOSING
    assert c.seen["is_open"] is False
    assert c.seen["write_wires"] is Written.CLOSED
    assert c.seen["write_each"] == 0 and c.seen["skipped"] == 0  # skipped, not "full"
    assert c.seen["closed_state"] is State.CLOSED
    assert c.seen["write_after_closed"] is Written.CLOSED
    assert got == ["before"]  # nothing after websockets' close frame
    assert client.protocol.close_rcvd == Close(1000, "going away now")


async def _dropped(ws: ServerConnection, c: Checks) -> None:
    assert ws.request is not None
    how = c.seen["how"] = ws.request.path.strip("/")
    writer = SocketWriter(_Count(), _Count())
    try:
        assert write_wires(ws, [ws_text_frame(b"hello")], NO_LIMIT) is Written.SENT
        await asyncio.sleep(0.05)  # on its way before the drop
        if how == "abort":
            abort(ws)
        else:  # stuck for longer than allowed: SocketWriter aborts it
            peer = _Peer.of(9, ws)
            writer.mark_stuck(peer, time.monotonic() - 60)
            c.seen["closed_stuck"] = writer.close_stuck(30, time.monotonic())
            c.seen["closed_count"] = writer.closed.n  # type: ignore[attr-defined]
            c.seen["still_stuck"] = dict(writer.stuck)
        c.seen["is_closing"] = is_closing(ws)
        c.seen["is_open"] = is_open(ws)
        # Still OPEN to websockets until the transport reports the loss: the fan-out
        # writes, and the transport drops it (its socket is not written, in C either).
        c.seen["write_each"] = writer.write_each([_Peer.of(10, ws)], [ws_text_frame(b"gone")],
                                                 NO_LIMIT)
        await asyncio.wait_for(ws.wait_closed(), 10)
        c.seen["state"] = ws.protocol.state
        c.seen["write_after"] = write_wires(ws, [ws_text_frame(b"late")], NO_LIMIT)
        c.seen["close_sent"] = ws.protocol.close_sent
    finally:
        c.done.set()


@pytest.mark.parametrize("how", ["abort", "close_stuck"])
async def test_abort_drops_the_socket_without_a_close(server, how):
    url, states = await server(_dropped, Checks)
    got: list[str | bytes] = []
    async with connect(url + how, compression=None, ping_interval=None) as client:
        with pytest.raises(ConnectionClosedError):
            async for message in client:
                got.append(message)
    (c,) = states
    await asyncio.wait_for(c.done.wait(), 10)
    assert c.seen["how"] == how
    assert c.seen["is_closing"] is True and c.seen["is_open"] is False
    assert c.seen["write_each"] == 1 and "gone" not in got
    if how == "close_stuck":
        assert c.seen["closed_stuck"] == 1 and c.seen["closed_count"] == 1
        assert c.seen["still_stuck"] == {}
    assert c.seen["state"] is State.CLOSED and c.seen["write_after"] is Written.CLOSED
    assert c.seen["close_sent"] is None  # no close handshake: dropped
    assert got == ["hello"]
    assert client.protocol.close_rcvd is None  # 1006: the TCP connection just ended


# -- the C loop's own send ---------------------------------------------------------
BIG = 262_144  # far more than the kernel takes at once with 8 KiB buffers


async def _short_send(ws: ServerConnection, c: Checks) -> None:
    _small_buffer(ws.transport.get_extra_info("socket"), socket.SO_SNDBUF)
    writer, peer = SocketWriter(_Count(), _Count()), _Peer.of(1, ws)
    try:
        c.seen["queued_before"] = buffered(ws)
        c.seen["first"] = writer.write_each([peer], [ws_text_frame(payload(0, BIG))], NO_LIMIT)
        c.seen["queued_after"] = buffered(ws)  # what the kernel did not take
        for i in range(1, 4):  # behind it: through the transport, in order
            writer.write_each([peer], [ws_text_frame(payload(i, 1_000 * i))], NO_LIMIT)
        await ws.close(CLOSE_CODE, CLOSE_REASON)
    finally:
        c.done.set()


async def test_the_c_loop_hands_what_the_kernel_did_not_take_to_the_transport(server):
    if FANOUT != "c":
        pytest.skip("the C loop is not built here")
    url, states = await server(_short_send, Checks)
    async with connect(url, compression=None, max_size=None, ping_interval=None,
                       sock=await _client_socket(url)) as client:
        got = [m async for m in client]
    (c,) = states
    await asyncio.wait_for(c.done.wait(), 10)
    frame = len(ws_text_frame(payload(0, BIG)))
    # Sent in part by the C loop itself, the rest queued on the transport.
    assert c.seen["queued_before"] == 0 and 0 < c.seen["queued_after"] < frame
    assert c.seen["first"] == 1
    texts = [m.encode() if isinstance(m, str) else m for m in got]
    assert texts == [payload(0, BIG)] + [payload(i, 1_000 * i) for i in range(1, 4)]
