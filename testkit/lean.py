"""A lean client WebSocket, for load: thousands in one process.

No task per socket: each is an ``asyncio.Protocol`` doing the HTTP upgrade and
the RFC 6455 framing itself (a server's frames are unmasked, RFC 6455 5.1:
header, length, slice; under a microsecond of Python a frame); no extension is
offered, so nothing is compressed. Pings are answered (5.5.2). Subclasses
speak a server's protocol on top through ``on_open`` and ``on_text``.
``Device`` is the everyday client; this one serves the benchmarks that hold
many sockets (room subscribers, idle connections).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import os
import time
from collections.abc import Callable
from typing import Any

from websockets.frames import Frame, Opcode

__all__ = ["LeanSocket", "open_lean"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 1.3


class LeanSocket(asyncio.Protocol):
    """One client WebSocket to ``host:port`` at ``path``; ``ready`` is resolved by
    ``on_open`` (by default at the upgrade) or failed if the socket goes first."""

    def __init__(self, host: str, port: int, path: str) -> None:
        self.host, self.port, self.path = host, port, path
        self.transport: asyncio.Transport | None = None
        self.chunks: list[bytes] = []  # bytes of an incomplete frame (or response head)
        self.have = self.need = 0
        self.upgraded = False
        self.closed = False
        self.frag: list[bytes] = []
        self.key = base64.b64encode(os.urandom(16))
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pings: list[asyncio.Future[None]] = []

    # -- hooks ----------------------------------------------------------------
    def on_open(self) -> None:
        """Upgraded; the default is ready at once."""
        self.set_ready(None)

    def on_text(self, payload: bytes, now: float) -> None:
        """A whole data frame (text or binary) and when (``time.time()``) it came."""

    def on_close_frame(self, payload: bytes) -> None:
        """The server closes (it is answered and the socket aborted after this)."""

    def on_lost(self, exc: Exception | None) -> None:
        """The socket is gone."""

    def set_ready(self, result: Any) -> None:
        if not self.ready.done():
            self.ready.set_result(result)

    def fail(self, exc: Exception) -> None:
        if not self.ready.done():
            self.ready.set_exception(exc)
            self.ready.exception()  # retrieved: whoever awaits it still sees it

    # -- transport -------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        assert self.transport is not None
        self.transport.write(
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {self.key.decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n"
            .encode())

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_lost(exc)
        self.fail(ConnectionError(f"closed before it was ready ({exc!r})"))
        for fut in self._pings:
            if not fut.done():
                fut.set_exception(ConnectionError("closed"))

    def data_received(self, data: bytes) -> None:
        now = time.time()
        if self.chunks:  # a frame longer than one read: join once it is all here
            self.chunks.append(data)
            self.have += len(data)
            if self.have < self.need:
                return
            data, self.chunks = b"".join(self.chunks), []
        buf = data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._keep(buf, len(buf) + 1)
                return
            head, buf = buf[:end], buf[end + 4:]
            accept = base64.b64encode(hashlib.sha1(self.key + _GUID).digest())
            if not head.startswith(b"HTTP/1.1 101") or accept not in head:
                self.fail(ConnectionError(f"upgrade refused: {head[:200]!r} {buf[:200]!r}"))
                self.abort()
                return
            self.upgraded = True
            self.on_open()
        pos, n = 0, len(buf)
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length, hdr = b1 & 0x7F, 2
            if length == 126:
                if n - pos < 4:
                    break
                length, hdr = int.from_bytes(buf[pos + 2:pos + 4], "big"), 4
            elif length == 127:
                if n - pos < 10:
                    break
                length, hdr = int.from_bytes(buf[pos + 2:pos + 10], "big"), 10
            end = pos + hdr + length
            if end > n:
                self._keep(buf[pos:], end - pos)
                return
            payload = buf[pos + hdr:end]
            pos = end
            if not self._frame(b0, payload, now):
                return
        if pos < n:
            self._keep(buf[pos:], n - pos + 1)

    def _frame(self, b0: int, payload: bytes, now: float) -> bool:
        """One frame; False once the socket is closing."""
        op = b0 & 0x0F
        if op in (0, 1, 2):
            if not b0 & 0x80:  # a fragment: keep it until the final one
                self.frag.append(payload)
                return True
            if self.frag:
                payload, self.frag = b"".join([*self.frag, payload]), []
            self.on_text(payload, now)
        elif op == 9:
            self.send(payload, Opcode.PONG)
        elif op == 10:
            while self._pings:
                fut = self._pings.pop(0)
                if not fut.done():
                    fut.set_result(None)
                    break
        elif op == 8:
            self.on_close_frame(payload)
            self.send(payload[:2], Opcode.CLOSE)
            self.abort()
            return False
        return True

    def _keep(self, rest: bytes, need: int) -> None:
        """Wait for ``need`` bytes (``rest`` and what comes next) before parsing again."""
        self.chunks, self.have, self.need = [rest], len(rest), need

    def send(self, data: bytes, opcode: Opcode = Opcode.TEXT) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(Frame(opcode, data).serialize(mask=True))

    def ping(self) -> asyncio.Future[None]:
        """A ping; the future is resolved by the pong."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings.append(fut)
        self.send(b"", Opcode.PING)
        return fut

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def open_lean(make: Callable[[], LeanSocket], timeout: float = 30, tries: int = 4,
                    on_retry: Callable[[], None] | None = None) -> LeanSocket:
    """Connect ``make()``'s socket and wait until it is ready; retried (listen backlogs
    overflow when a thousand sockets dial at once)."""
    loop = asyncio.get_running_loop()
    for attempt in range(tries):
        sock = make()
        try:
            async with asyncio.timeout(timeout):
                await loop.create_connection(functools.partial(_same, sock), sock.host,
                                             sock.port)
                await sock.ready
            return sock
        except (OSError, TimeoutError) as exc:
            sock.abort()
            if attempt == tries - 1:
                raise ConnectionError(f"{sock.host}:{sock.port}: {exc!r}") from exc
            if on_retry is not None:
                on_retry()
            await asyncio.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _same(sock: LeanSocket) -> LeanSocket:
    return sock
