"""The node's keepalive (gateway/ws/keepalive.py): one timer pings every
connection once per IM_KEEPALIVE_S; a client that answers stays, however
long it is idle; a peer that never answers (a raw socket that completed the
handshake and then went silent) is closed after one unanswered interval."""

from __future__ import annotations

import asyncio
import base64
import os

from testkit.poll import until
from tests.conftest import token, uid


async def silent_peer(port: int, user: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A WebSocket handshake over a raw socket; afterwards it never answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((f"GET /ws?token={token(user)} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                  "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                  f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return reader, writer


async def test_an_answering_client_stays_and_a_silent_peer_is_closed(make_node, connect):
    node = await make_node(keepalive_s=1)
    alive = await connect(node, uid("a"))
    reader, writer = await silent_peer(node.ws_port, uid("s"))
    got = b""
    try:
        async with asyncio.timeout(10):
            while chunk := await reader.read(4096):  # pings come, then the end
                got += chunk
    finally:
        writer.close()
    assert b"\x89\x04" in got  # it was pinged (a 4-byte ping frame) before it was closed
    closed = node.metrics.closed.labels("keepalive")
    await until(lambda: closed._value.get() == 1)
    sessions = node.app.sessions
    assert sessions.keepalive is not None and sessions.keepalive.pings >= 2
    assert (await alive.request("ping"))["op"] == "pong"  # pinged too, answered, still here
