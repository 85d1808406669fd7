"""One device: a real WebSocket client of the node that pairs replies with requests.

``request`` sends a frame with a fresh ``id`` and waits for the reply carrying
it in ``re``; every other frame is a push: counted by op (``counts``), then
handed to ``on_push`` if given, else queued for ``next_push`` (a bounded queue:
pushes past it are counted in ``dropped``). When the connection closes, every
request still waiting fails with ``DeviceClosed`` and ``on_close`` is called.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

__all__ = ["Device", "DeviceClosed", "ws_url"]

Frame = dict[str, Any]
_rids = itertools.count(1)


class DeviceClosed(ConnectionError):
    """The connection closed before the reply came."""


def ws_url(where: int | str) -> str:
    """The node's WebSocket endpoint: a port of 127.0.0.1, or a ``ws://`` URL as is."""
    return where if isinstance(where, str) else f"ws://127.0.0.1:{where}/ws"


class Device:
    """One WebSocket of one user (see the module docstring)."""

    def __init__(self, ws: ClientConnection, *, on_push: Callable[[Frame], None] | None = None,
                 on_close: Callable[[Device], None] | None = None,
                 queue_max: int = 10_000) -> None:
        self.ws = ws
        self.pushes: asyncio.Queue[Frame] = asyncio.Queue(queue_max)
        self.counts: Counter[str] = Counter()  # pushes received, by op
        self.dropped = 0  # pushes the full queue could not take
        self.on_push = on_push
        self.on_close = on_close
        self._waiting: dict[str, asyncio.Future[Frame]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, where: int | str, token: str, *,
                   on_push: Callable[[Frame], None] | None = None,
                   on_close: Callable[[Device], None] | None = None,
                   **connect_kw: Any) -> Device:
        """Connect to ``where`` (a port of 127.0.0.1 or a ws:// URL) as the token's user.
        ``connect_kw`` go to websockets' ``connect`` (defaults: no compression, no
        proxy, no keepalive pings of ours, 10 s to open)."""
        kw: dict[str, Any] = {"compression": None, "proxy": None, "ping_interval": None,
                              "open_timeout": 10, "close_timeout": 2, **connect_kw}
        ws = await connect(f"{ws_url(where)}?token={token}", **kw)
        return cls(ws, on_push=on_push, on_close=on_close)

    @property
    def closed(self) -> bool:
        return self._reader.done()

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                self._dispatch(orjson.loads(data))
        except ConnectionClosed:
            pass
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(DeviceClosed("connection closed"))
            self._waiting.clear()
            if self.on_close is not None:
                self.on_close(self)

    def _dispatch(self, frame: Frame) -> None:
        fut = self._waiting.pop(frame["re"], None) if "re" in frame else None
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

    async def request(self, op: str, timeout: float = 10, **fields: Any) -> Frame:
        """Send ``{"op": op, "id": <fresh>, **fields}``; the reply. TimeoutError after
        ``timeout``, DeviceClosed if the connection closes first."""
        rid = f"r{next(_rids)}"
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        if self.closed:
            raise DeviceClosed("connection closed")
        self._waiting[rid] = fut
        try:
            await self.ws.send(orjson.dumps({"op": op, "id": rid, **fields}).decode())
            return await asyncio.wait_for(fut, timeout)
        except ConnectionClosed as exc:
            raise DeviceClosed("connection closed") from exc
        finally:
            self._waiting.pop(rid, None)

    async def request_text(self, rid: str, text: str | bytes, timeout: float = 10) -> Frame:
        """Send a frame written by hand (``text`` must carry ``"id": rid``); the reply."""
        fut: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        if self.closed:
            raise DeviceClosed("connection closed")
        self._waiting[rid] = fut
        try:
            await self.ws.send(text if isinstance(text, str) else text.decode())
            return await asyncio.wait_for(fut, timeout)
        except ConnectionClosed as exc:
            raise DeviceClosed("connection closed") from exc
        finally:
            self._waiting.pop(rid, None)

    async def send_raw(self, data: str | bytes) -> None:
        """A frame as is (str: a text frame, bytes: a binary one): no id, no wait."""
        await self.ws.send(data)

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

    def stall(self) -> None:
        """Stop reading: the socket's receive buffer fills and the node sees a
        client that does not keep up."""
        self._reader.cancel()
        self.ws.transport.pause_reading()

    async def wait_closed(self, timeout: float = 10) -> int | None:
        """Until the connection is closed; the close code the node sent."""
        await asyncio.wait_for(self.ws.wait_closed(), timeout)
        return self.ws.close_code

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
