"""A TCP proxy on 127.0.0.1 in front of a server, to cut and slow the link
(as aio-pika's tests do in front of their broker).

``cut()`` closes every connection through the proxy at once (both sides see
the connection reset) and refuses new ones (accepted and closed) until
``restore()``; ``slow(delay_s)`` holds every chunk that crosses, in either
direction, for ``delay_s`` before passing it on (order kept); ``hold(match)``
keeps every chunk bound for the server that contains ``match`` (every chunk if
empty) until ``release()``, in ``held`` for a test to see (a connection's later
chunks wait behind it). Connections and chunk sizes are bounded; only 127.0.0.1
is served and dialled.
"""

from __future__ import annotations

import asyncio
import contextlib

__all__ = ["TcpProxy"]

CHUNK = 65_536


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.writers = (client, upstream)
        self.tasks: list[asyncio.Task[None]] = []

    def abort(self) -> None:
        for w in self.writers:
            w.transport.abort()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``target_host:target_port`` (see the module)."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1", *,
                 max_connections: int = 256, connect_timeout: float = 5) -> None:
        if target_host not in ("127.0.0.1", "localhost"):
            raise ValueError("the proxy only forwards to 127.0.0.1")
        self.target = (target_host, target_port)
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.port = 0
        self.delay = 0.0
        self.is_cut = False
        self.held: list[bytes] = []  # chunks to the server waiting for ``release``
        self._gate: asyncio.Event | None = None
        self._match = b""
        self.accepted = 0  # connections forwarded since start
        self.refused = 0  # connections closed at once (cut, or too many)
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    def url(self, scheme: str, userinfo: str = "", path: str = "/") -> str:
        """A URL through the proxy, e.g. ``url("amqp", "guest:guest@")``."""
        return f"{scheme}://{userinfo}127.0.0.1:{self.port}{path}"

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Drop every current connection; refuse new ones until ``restore``."""
        self.is_cut = True
        for link in list(self._links):
            link.abort()

    def slow(self, delay_s: float) -> None:
        """Hold every chunk ``delay_s`` before passing it on, both ways."""
        self.delay = delay_s

    def hold(self, match: bytes = b"") -> None:
        """Keep what clients send to the server that contains ``match``."""
        self._match = match
        if self._gate is None:
            self._gate = asyncio.Event()

    def release(self) -> None:
        """Pass on what was held, in order, and stop holding."""
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.set()
        self.held = []

    def restore(self) -> None:
        """Accept and forward again, without delay."""
        self.is_cut = False
        self.delay = 0.0

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        links = list(self._links)
        for link in links:
            link.abort()
        tasks = [t for link in links for t in link.tasks]
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut or len(self._links) >= self.max_connections:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.target), self.connect_timeout)
        except (OSError, TimeoutError):
            self.refused += 1
            writer.transport.abort()
            return
        if self.is_cut:  # cut while we dialled
            self.refused += 1
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self.accepted += 1
        link = _Link(writer, up_writer)
        self._links.add(link)
        link.tasks = [asyncio.create_task(self._pipe(reader, up_writer, upstream=True)),
                      asyncio.create_task(self._pipe(up_reader, writer))]
        try:
            await asyncio.gather(*link.tasks, return_exceptions=True)
        finally:
            link.abort()
            self._links.discard(link)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, *,
                    upstream: bool = False) -> None:
        try:
            while data := await src.read(CHUNK):
                if upstream and (gate := self._gate) is not None and self._match in data:
                    self.held.append(data)
                    await gate.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.is_cut:
                    return
                dst.write(data)
                await dst.drain()
        except (OSError, ConnectionError):
            pass
        finally:
            # One side is done: the whole link goes (a half-open AMQP or RESP
            # connection is of no use to anyone).
            dst.transport.abort()
