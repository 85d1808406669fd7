"""Test clients: a real WebSocket client that pairs replies with requests."""

from __future__ import annotations

import asyncio
import inspect
import itertools
import time
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

_rids = itertools.count(1)


class WsClient:
    """A device: ``request`` waits for the reply carrying ``re``; pushes queue up."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.pushes: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._waiting: dict[object, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, port: int, token: str, **kw: Any) -> WsClient:
        ws = await connect(f"ws://127.0.0.1:{port}/ws?token={token}", **kw)
        return cls(ws)

    async def _read(self) -> None:
        try:
            async for data in self.ws:
                self._dispatch(orjson.loads(data))
        except ConnectionClosed:
            pass

    def _dispatch(self, frame: dict[str, Any]) -> None:
        fut = self._waiting.pop(frame.get("re"), None) if "re" in frame else None
        if fut is not None and not fut.done():
            fut.set_result(frame)
        else:
            self.pushes.put_nowait(frame)

    async def request(self, op: str, timeout: float = 10, **fields: Any) -> dict[str, Any]:
        rid = f"r{next(_rids)}"
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        await self.ws.send(orjson.dumps({"op": op, "id": rid, **fields}).decode())
        return await asyncio.wait_for(fut, timeout)

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data)

    async def next_push(self, op: str | None = None, timeout: float = 10) -> dict[str, Any]:
        while True:
            frame = await asyncio.wait_for(self.pushes.get(), timeout)
            if op is None or frame.get("op") == op:
                return frame

    async def close(self) -> None:
        await self.ws.close()
        self._reader.cancel()


async def until(check: Any, timeout: float = 10, every: float = 0.05) -> Any:
    """Poll ``check()`` (sync or async) until it is truthy or ``timeout`` passes;
    for state written in the background (counts, trims, fan-outs)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(every)
