"""The low-level client: one WebSocket to one node, nothing more.

``request`` sends a frame with a fresh ``id`` and waits for the reply carrying it
in ``re``; every other frame is a push: counted by op (``counts``), then handed
to ``on_push`` if given, else queued for ``next_push`` (a bounded queue: pushes
past it are counted in ``dropped``). When the connection closes, every request
still waiting fails with ``Disconnected`` and ``on_close`` is called. No
reconnect, no resend, no sync: that is ``Client``, built on this class; tests
and tools that speak the protocol frame by frame use this one directly.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Callable
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from imgate_client.core.frames import Frame, RequestIds, decode, encode, make, with_token

__all__ = ["Connection", "Disconnected", "with_token"]

_rids = RequestIds("r")

DEFAULT_CONNECT: dict[str, Any] = {
    "compression": None,  # the node offers none
    "proxy": None,
    "ping_interval": None,  # the node pings; a client need not
    "open_timeout": 10,
    "close_timeout": 2,
}


class Disconnected(ConnectionError):
    """The connection closed before the reply came (or was already closed)."""


class Connection:
    """One WebSocket of one user (see the module docstring)."""

    def __init__(self, ws: ClientConnection, *, on_push: Callable[[Frame], None] | None = None,
                 on_close: Callable[[Any], None] | None = None,
                 queue_max: int = 10_000) -> None:
        self.ws = ws
        self.pushes: asyncio.Queue[Frame] = asyncio.Queue(queue_max)
        self.counts: Counter[str] = Counter()  # pushes received, by op
        self.dropped = 0  # pushes the full queue could not take
        self.undecodable = 0  # frames that were not a JSON object
        self.on_push = on_push
        self.on_close = on_close
        self._waiting: dict[object, asyncio.Future[Frame]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str, token: str | None = None, *,
                   on_push: Callable[[Frame], None] | None = None,
                   on_close: Callable[[Any], None] | None = None,
                   queue_max: int = 10_000, **connect_kw: Any) -> Self:
        """Connect to ``url`` (``ws://host:port/ws``) as the token's user.
        ``connect_kw`` go to websockets' ``connect`` (defaults: no compression, no
        proxy, no keepalive pings of ours, 10 s to open). A refused handshake raises
        websockets' ``InvalidStatus`` (its ``response.status_code``: 401, 403, 429)."""
        ws = await connect(with_token(url, token), **{**DEFAULT_CONNECT, **connect_kw})
        return cls(ws, on_push=on_push, on_close=on_close, queue_max=queue_max)

    # -- state -------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """The reader stopped: the connection closed (or ``stall`` was called)."""
        return self._reader.done()

    @property
    def close_code(self) -> int | None:
        """The code of the close frame received (None: none, or not closed yet)."""
        return self.ws.close_code

    @property
    def close_reason(self) -> str | None:
        return self.ws.close_reason

    # -- reading -------------------------------------------------------------------
    async def _read(self) -> None:
        try:
            async for data in self.ws:
                try:
                    frame = decode(data)
                except ValueError:
                    self.undecodable += 1
                    continue
                self._dispatch(frame)
        except ConnectionClosed:
            pass
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(Disconnected("connection closed"))
            self._waiting.clear()
            if self.on_close is not None:
                self.on_close(self)

    def _dispatch(self, frame: Frame) -> None:
        re_ = frame.get("re")
        fut = None
        if re_ is not None:
            with contextlib.suppress(TypeError):  # an unhashable re: not ours
                fut = self._waiting.pop(re_, None)
        if fut is not None:
            if not fut.done():
                fut.set_result(frame)
            return
        self.counts[str(frame.get("op"))] += 1
        if self.on_push is not None:
            self.on_push(frame)
        elif self.pushes.full():
            self.dropped += 1
        else:
            self.pushes.put_nowait(frame)

    # -- writing -------------------------------------------------------------------
    async def request(self, op: str, timeout: float = 10, **fields: Any) -> Frame:
        """Send ``{"op": op, "id": <fresh>, **fields}``; the reply (an ``error`` reply
        is returned, not raised). TimeoutError after ``timeout``, Disconnected if the
        connection closes first."""
        rid = _rids.next()
        return await self._exchange(rid, encode(make(op, rid, **fields)), timeout)

    async def request_text(self, rid: str, text: str | bytes, timeout: float = 10) -> Frame:
        """Send a frame written by hand (``text`` must carry ``"id": rid``); the reply."""
        return await self._exchange(rid, text, timeout)

    async def _exchange(self, rid: object, data: str | bytes, timeout: float) -> Frame:
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        if self.closed:
            raise Disconnected("connection closed")
        self._waiting[rid] = fut
        try:
            await self.ws.send(data if isinstance(data, str) else data.decode())
            # Not wait_for: on 3.11 it can swallow a cancellation that comes as
            # the reply does, and the caller's loop would go on.
            async with asyncio.timeout(timeout):
                return await fut
        except ConnectionClosed as exc:
            raise Disconnected("connection closed") from exc
        finally:
            self._waiting.pop(rid, None)

    async def send(self, frame: Frame) -> None:
        """One frame, encoded, as a text frame; no reply awaited (a reply to its
        ``id``, if it has one, comes as a push). Disconnected if closed."""
        try:
            await self.ws.send(encode(frame).decode())
        except ConnectionClosed as exc:
            raise Disconnected("connection closed") from exc

    async def send_raw(self, data: str | bytes) -> None:
        """A frame as is (str: a text frame, bytes: a binary one): no id, no wait."""
        await self.ws.send(data)

    # -- pushes ----------------------------------------------------------------------
    async def next_push(self, op: str | None = None, timeout: float = 10) -> Frame:
        """The next queued push (of ``op``, skipping others); TimeoutError after ``timeout``."""
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.pushes.get()
                if op is None or frame.get("op") == op:
                    return frame

    def drain_pushes(self) -> list[Frame]:
        """Every queued push, at once (no wait)."""
        out = []
        while not self.pushes.empty():
            out.append(self.pushes.get_nowait())
        return out

    # -- ending ----------------------------------------------------------------------
    def stall(self) -> None:
        """Stop reading: the socket's receive buffer fills and the node sees a
        client that does not keep up (a test's slow consumer)."""
        self._reader.cancel()
        self.ws.transport.pause_reading()

    async def wait_closed(self, timeout: float = 10) -> int | None:
        """Until the connection is closed; the close code the node sent."""
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return self.ws.close_code

    async def close(self, code: int = 1000, reason: str = "") -> None:
        with contextlib.suppress(Exception):
            await self.ws.close(code, reason)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    def abort(self) -> None:
        """Drop the socket at once, no close frame (a network blip)."""
        transport = self.ws.transport
        if transport is not None:
            transport.abort()
