"""What ``gateway.wire`` changes of websockets' own connection, on real
connections: ``lighten`` (the handshake's headers cleared, lists for two empty
deques) leaves reading, fragmented messages, pings and drain working, and
``NodeConnection`` reads a lone pong to the oldest ping itself while every
other byte goes to websockets' parser as before."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import Frame, Opcode

from gateway.wire import NodeConnection, _ListQueue, lighten


async def test_a_lightened_connection_reads_fragmented_messages_and_drains():
    """``lighten`` (the handshake's headers cleared, a list for two deques)
    leaves websockets working: fragmented and whole messages arrive intact and
    in order, pings are answered, and a send that must wait for a slow reader
    (``drain``, its waiters in the list) completes once the client reads."""
    seen: list[str] = []
    checked: dict[str, Any] = {}
    done = asyncio.Event()

    async def handler(ws: ServerConnection) -> None:
        request = ws.request
        lighten(ws)
        checked["headers"] = len(request.headers) if request is not None else -1
        checked["waiters"] = type(ws.drain_waiters).__name__
        checked["queue"] = type(ws.recv_messages.frames.queue).__name__
        async for message in ws:
            assert isinstance(message, str)
            seen.append(message)
            if message == "big":
                await ws.send("x" * (4 << 20))  # past the client's buffers: drain() waits
            await ws.send(f"got {len(message)}")
        done.set()

    async with serve(handler, "127.0.0.1", 0, compression=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None,
                           max_size=None) as client:
            sent, replies = [], []
            for i in range(30):
                parts = [f"part{i}-{k}-" + "y" * (i * 37 % 500) for k in range(1 + i % 5)]
                if i % 3:
                    await client.send(iter(parts))  # one message in len(parts) frames
                else:
                    await client.send("".join(parts))
                sent.append("".join(parts))
                if i % 7 == 0:
                    await asyncio.wait_for(await client.ping(), 5)
                replies.append(await asyncio.wait_for(client.recv(), 10))
            await client.send("big")
            sent.append("big")
            await asyncio.sleep(0.2)  # the server's send is blocked on drain meanwhile
            replies += [await asyncio.wait_for(client.recv(), 10) for _ in range(2)]
        await asyncio.wait_for(done.wait(), 5)
    assert checked == {"headers": 0, "waiters": "list", "queue": "_ListQueue"}
    assert seen == sent
    assert [r for r in replies if len(r) < 100] == [f"got {len(s)}" for s in sent]
    assert len(replies[-2]) == 4 << 20


def test_the_list_queue_does_what_the_deque_did():
    a: Any = deque()
    b: Any = _ListQueue()
    for q in (a, b):
        q.append(1)
        q.append(2)
        q.extendleft(reversed([7, 8]))
        q.append(3)
    assert list(a) == list(b) == [7, 8, 1, 2, 3]
    assert [a.popleft() for _ in range(5)] == [b.popleft() for _ in range(5)]
    assert not a and not b and len(b) == 0


async def test_node_connection_reads_pongs_itself_and_leaves_the_rest_to_websockets():
    """``NodeConnection``: a pong of exactly one frame to the oldest pending ping
    is read without websockets' parser (its ``receive_data`` is not called) and
    settles the ping as websockets would (future, latency); a pong coalesced
    with another frame, split over two segments, or answering a later ping goes
    to websockets, which reads it as before."""
    got: asyncio.Queue[str] = asyncio.Queue()
    conns: list[ServerConnection] = []
    parsed = [0]

    async def handler(ws: ServerConnection) -> None:
        receive = ws.protocol.receive_data

        def counting(data: bytes | bytearray) -> None:
            parsed[0] += 1
            receive(data)

        ws.protocol.receive_data = counting  # type: ignore[method-assign]
        conns.append(ws)
        async for message in ws:
            await got.put(str(message))

    def pong(payload: bytes) -> bytes:
        return Frame(Opcode.PONG, payload).serialize(mask=True)

    async with serve(handler, "127.0.0.1", 0, compression=None,
                     create_connection=NodeConnection, ping_interval=None) as srv:
        port = srv.sockets[0].getsockname()[1]
        async with connect(f"ws://127.0.0.1:{port}", compression=None,
                           ping_interval=None) as client:
            await client.send("hello")
            assert await asyncio.wait_for(got.get(), 5) == "hello"
            ws = conns[0]
            before = parsed[0]
            # (a) websockets' own ping, answered by the client: read here
            latency = await asyncio.wait_for(await ws.ping(b"pin1"), 5)
            assert latency >= 0 and ws.latency == latency and not ws.pending_pings
            assert parsed[0] == before
            raw = client.transport
            # (b) a pong in the same segment as a text frame: websockets reads both
            waiter = asyncio.ensure_future(await ws.ping(b"pin2"))
            await asyncio.sleep(0.05)  # the client's own pong went first
            assert waiter.done() and parsed[0] == before  # (read here too)
            ws.pending_pings[b"raw1"] = (asyncio.get_running_loop().create_future(), 0.0)
            raw.write(pong(b"raw1") + Frame(Opcode.TEXT, b"after").serialize(mask=True))
            assert await asyncio.wait_for(got.get(), 5) == "after"
            assert not ws.pending_pings and parsed[0] == before + 1
            # (c) a pong split over two segments
            ws.pending_pings[b"raw2"] = (asyncio.get_running_loop().create_future(), 0.0)
            frame = pong(b"raw2")
            raw.write(frame[:5])
            await asyncio.sleep(0.05)
            raw.write(frame[5:])
            for _ in range(100):
                if not ws.pending_pings:
                    break
                await asyncio.sleep(0.01)
            assert not ws.pending_pings and parsed[0] == before + 3
            # (d) a pong to the later of two pings: websockets settles both
            loop = asyncio.get_running_loop()
            first, second = loop.create_future(), loop.create_future()
            ws.pending_pings[b"old1"] = (first, 0.0)
            ws.pending_pings[b"new1"] = (second, 0.0)
            raw.write(pong(b"new1"))
            await asyncio.wait_for(asyncio.gather(first, second), 5)
            assert not ws.pending_pings and parsed[0] == before + 4
            await client.send("still fine")
            assert await asyncio.wait_for(got.get(), 5) == "still fine"
