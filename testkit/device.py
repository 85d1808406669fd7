"""One device: the SDK's low-level client (``imgate_client.Connection``, one
WebSocket frame by frame) as the tests and benchmarks open it.

``request`` sends a frame with a fresh ``id`` and waits for the reply carrying
it in ``re``; every other frame is a push: counted by op (``counts``), then
handed to ``on_push`` if given, else queued for ``next_push`` (a bounded queue:
pushes past it are counted in ``dropped``). When the connection closes, every
request still waiting fails with ``DeviceClosed`` and ``on_close`` is called.
What this module adds to ``Connection``: ``open`` takes a port of 127.0.0.1 as
well as a URL, and the names the tests use (``DeviceClosed``, ``ws_url``).
A client that reconnects, resends and syncs on its own is ``imgate_client.Client``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from imgate_client import Connection, Disconnected

__all__ = ["Device", "DeviceClosed", "ws_url"]

Frame = dict[str, Any]

DeviceClosed = Disconnected  # the connection closed before the reply came


def ws_url(where: int | str) -> str:
    """The node's WebSocket endpoint: a port of 127.0.0.1, or a ``ws://`` URL as is."""
    return where if isinstance(where, str) else f"ws://127.0.0.1:{where}/ws"


class Device(Connection):
    """One WebSocket of one user (see the module docstring)."""

    @classmethod
    async def open(cls, where: int | str, token: str, *,  # type: ignore[override]
                   on_push: Callable[[Frame], None] | None = None,
                   on_close: Callable[[Device], None] | None = None,
                   **connect_kw: Any) -> Device:
        """Connect to ``where`` (a port of 127.0.0.1 or a ws:// URL) as the token's user.
        ``connect_kw`` go to websockets' ``connect`` (defaults: no compression, no
        proxy, no keepalive pings of ours, 10 s to open)."""
        url = ws_url(where)
        return await super().open(f"{url}{'&' if '?' in url else '?'}token={token}", None,
                                  on_push=on_push,
                                  on_close=on_close, **connect_kw)

    async def until_taken(self, op: str, tries: int = 10, **fields: Any) -> Frame:
        """``request(op, **fields)``, asked again (the same fields: a send's cmid
        makes it idempotent) while the node answers ``unavailable``, as clients
        do: for a test's setup steps, which a loaded machine's test store can
        answer past the node's timeout. Any other error fails the test."""
        for attempt in range(tries):
            reply = await self.request(op, **fields)
            if reply.get("op") != "error":
                return reply
            assert reply.get("code") == "unavailable", reply
            if attempt < tries - 1:
                await asyncio.sleep(0.5)
        raise AssertionError(f"{op} never taken: {reply}")
