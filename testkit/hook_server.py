"""A product's hook endpoint for tests and benchmarks: a small HTTP/1.1 server
on 127.0.0.1 (keep-alive, Content-Length bodies) that checks each request's
signature (core.signing) and answers what ``decide`` says.

    server = await HookServer(secret, decide).start()   # server.url
    ...
    await server.close()

``decide(payload) -> dict | None`` (may be async): the JSON answer, or None to
answer 500. ``calls`` keeps every payload in arrival order; ``bad_signatures``
counts requests whose signature did not verify (answered 401).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from core.signing import verify

__all__ = ["HookServer"]

Decide = Callable[[dict[str, Any]], "dict[str, Any] | None | Awaitable[dict[str, Any] | None]"]


class HookServer:
    def __init__(self, secret: bytes, decide: Decide) -> None:
        self.secret = secret
        self.decide = decide
        self.calls: list[dict[str, Any]] = []
        self.bad_signatures = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/hook"

    async def start(self) -> HookServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in head.decode().split("\r\n")[1:]
                            if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, answer = await self._answer(headers, body)
                data = orjson.dumps(answer) if answer is not None else b""
                writer.write(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                             f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()

    async def _answer(self, headers: dict[str, str], body: bytes
                      ) -> tuple[int, dict[str, Any] | None]:
        if not verify(self.secret, headers.get("x-imgate-timestamp", ""), body,
                      headers.get("x-imgate-signature", "")):
            self.bad_signatures += 1
            return 401, None
        payload = orjson.loads(body)
        self.calls.append(payload)
        answer = self.decide(payload)
        if inspect.isawaitable(answer):
            answer = await answer
        return (200, answer) if answer is not None else (500, None)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._conns):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._conns, return_exceptions=True)


def main() -> None:
    """``python -m testkit.hook_server --port P --secret S [--delay-room SECONDS]``:
    allows everything at once (a room message after ``--delay-room``), until
    killed; prints its URL first."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m testkit.hook_server")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--secret", required=True)
    p.add_argument("--delay-room", type=float, default=0.0)
    a = p.parse_args()

    def decide(payload: dict[str, Any]) -> Any:
        if a.delay_room and payload.get("hook") == "room_send":
            return asyncio.sleep(a.delay_room, {"action": "allow"})
        return {"action": "allow"}

    async def serve() -> None:
        server = HookServer(a.secret.encode(), decide)
        server._server = await asyncio.start_server(server._serve, "127.0.0.1", a.port)
        print(server.url, flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
