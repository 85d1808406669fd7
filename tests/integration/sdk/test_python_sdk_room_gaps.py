"""The Python SDK's room gap handling against real nodes: the SDK client's node
loses its RabbitMQ link (a TCP proxy, cut and restored) while a publisher on
another node sends numbered room messages throughout. The application sees
every message in position order exactly once, or a ``RoomGap`` covering what
it did not see before the messages after it: never a silent jump. With a tiny
room history (3) the node cannot give the missed messages back and sends
``room_gap``: the SDK rejoins ``since`` and tells what is gone."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from imgate_client import Client, Event, RoomGap, RoomMessages

from testkit.poll import until
from tests.conftest import settle, token, uid
from tests.integration.router.test_failover import amqp_port, amqp_through

UNCAPPED = {"room_rate_cap": 0, "room_send_rate": 1e6, "room_send_burst": 1_000_000}


def stream_of(events: list[Event], room: str) -> list[tuple[str, Any]]:
    """What the application saw of ``room``, in order: ("msg", pos, body) per message,
    ("gap", missing ranges, reason) per RoomGap."""
    out: list[tuple[str, Any]] = []
    for ev in events:
        if isinstance(ev, RoomMessages) and ev.room == room:
            out.extend(("msg", (m["pos"], m["body"])) for m in ev.msgs)
        elif isinstance(ev, RoomGap) and ev.room == room:
            out.append(("gap", (ev.missing, ev.reason)))
    return out


def check_no_silent_jump(stream: list[tuple[str, Any]], first: int, last: int) -> tuple[
        list[int], set[int]]:
    """Positions first..last: each shown once, in order, or told missing by a gap that
    came before the message after it. Returns (shown, told)."""
    shown: list[int] = []
    told: set[int] = set()
    prev = first - 1
    for kind, what in stream:
        if kind == "gap":
            missing, _ = what
            for a, b in missing:
                assert a > prev, (what, prev, stream)  # never about what was shown
                told.update(range(a, b + 1))
            continue
        pos, _body = what
        assert pos > prev, f"pos {pos} after {prev}: out of order or twice: {stream}"
        hole = set(range(prev + 1, pos)) - told
        assert not hole, f"silent jump {prev} -> {pos} (not told: {sorted(hole)}): {stream}"
        shown.append(pos)
        prev = pos
    assert prev == last, (prev, last, stream)
    return shown, told


async def _publisher(sender: Client, room: str, n: int, sent: list[int],
                     pause: float = 0.02) -> None:
    for i in range(n):
        await sender.room_send(room, i)
        sent.append(i)
        await asyncio.sleep(pause)


async def _clients(cut_off: Any, other: Any) -> tuple[Client, Client, list[Event]]:
    events: list[Event] = []
    member = Client([f"ws://127.0.0.1:{cut_off.ws_port}/ws"], token=token(uid("m")),
                    on_event=events.append)
    sender = Client([f"ws://127.0.0.1:{other.ws_port}/ws"], token=token(uid("s")))
    await member.connect()
    await sender.connect()
    return member, sender, events


async def test_a_cut_broker_link_mid_stream_every_message_once_in_order_or_told(
        make_node, proxy):
    amqp = await proxy(amqp_port())
    cut_off = await make_node(amqp_url=amqp_through(amqp), **UNCAPPED)
    other = await make_node(**UNCAPPED)
    await settle(cut_off, other)
    room = uid("room")
    member, sender, events = await _clients(cut_off, other)
    pub: asyncio.Task[None] | None = None
    try:
        j = await member.join(room)
        await sender.join(room)
        first = (j.reply.get("pos") or 0) + 1
        sent: list[int] = []
        pub = asyncio.create_task(_publisher(sender, room, 60, sent))
        assert await until(lambda: len(sent) >= 15, timeout=20)
        amqp.cut()  # mid-stream: the member's node hears nothing from the broker
        assert await until(lambda: len(sent) >= 35, timeout=20)
        amqp.restore()
        await asyncio.wait_for(pub, 30)
        assert await until(lambda: cut_off.app.router.broker_connected(), timeout=20)
        last = first + 59

        def done() -> bool:
            s = stream_of(events, room)
            return any(k == "msg" and w[0] == last for k, w in s)

        assert await until(done, timeout=30), stream_of(events, room)
        shown, told = check_no_silent_jump(stream_of(events, room), first, last)
        assert len(shown) + len(told) == 60
        bodies = {w[0]: w[1] for k, w in stream_of(events, room) if k == "msg"}
        assert all(bodies[p] == p - first for p in shown)  # the right message at each pos
    finally:
        if pub is not None and not pub.done():
            pub.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pub
        await member.close()
        await sender.close()


async def test_room_gap_from_a_node_with_a_tiny_history_is_recovered_and_told(
        make_node, proxy):
    amqp = await proxy(amqp_port())
    # Three kept per room: most of what the member's node misses is gone.
    cut_off = await make_node(amqp_url=amqp_through(amqp), room_history=3, **UNCAPPED)
    other = await make_node(room_history=3, **UNCAPPED)
    await settle(cut_off, other)
    room = uid("room")
    member, sender, events = await _clients(cut_off, other)
    try:
        j = await member.join(room)
        await sender.join(room)
        first = (j.reply.get("pos") or 0) + 1
        for i in range(2):
            await sender.room_send(room, i)
        assert await until(lambda: len(stream_of(events, room)) == 2, timeout=10)
        amqp.cut()
        for i in range(2, 12):
            await sender.room_send(room, i)
        amqp.restore()
        assert await until(lambda: cut_off.app.router.broker_connected(), timeout=20)
        await sender.room_send(room, 12)
        last = first + 12

        def done() -> bool:
            return any(k == "msg" and w[0] == last for k, w in stream_of(events, room))

        assert await until(done, timeout=30), stream_of(events, room)
        stream = stream_of(events, room)
        shown, told = check_no_silent_jump(stream, first, last)
        gaps = [ev for ev in events if isinstance(ev, RoomGap)]
        assert gaps, stream  # the node said room_gap; the SDK told what is gone
        assert told and min(told) == first + 2, (told, stream)
        assert shown[:2] == [first, first + 1] and shown[-1] == last
        assert sorted(set(shown) | told) == list(range(first, last + 1))
        assert all(g.reason == "not_kept" for g in gaps), gaps
    finally:
        await member.close()
        await sender.close()
