"""Live rooms on real nodes, RabbitMQ between them, counts in real Redis."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import orjson

from testkit.device import Device
from testkit.http import HttpUser
from testkit.poll import until
from testkit.probe import sample
from tests.conftest import settle, token, uid

FAST = {"heartbeat_s": 0.5, "heartbeat_ttl_s": 1.5, "room_report_s": 0.1}
UNCAPPED = {"room_rate_cap": 0, "room_send_rate": 1e6, "room_send_burst": 1_000_000,
            "op_rate": 1e6, "op_burst": 1_000_000}


async def room_msgs(client: Device, n: int, timeout: float = 10) -> list[dict[str, Any]]:
    """The next ``n`` room messages this client receives (across frames)."""
    got: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while len(got) < n:
            frame = await client.next_push("room_msgs")
            got.extend(frame["msgs"])
    return got


async def online_is(port: int, room: str, expected: int) -> bool:
    return await online(port, room) == expected


async def online(port: int, room: str) -> int:
    probe = HttpUser(port, token("probe"))
    try:
        r = await probe.get(f"/v1/rooms/{room}")
    finally:
        await probe.aclose()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["room"] == room
    return int(body["online"])


async def test_members_on_three_nodes_receive_and_a_fourth_node_gets_nothing(
        make_node, connect):
    nodes = [await make_node() for _ in range(4)]
    await settle(*nodes)
    room, other = uid("room"), uid("room")
    members = [await connect(n, uid("m")) for n in nodes[:3]]
    for m in members:
        assert (await m.request("join", room=room))["op"] == "joined"
    bystander = await connect(nodes[3], uid("b"))
    await bystander.request("join", room=other)  # node 4 serves another room only
    for i in range(5):
        assert (await members[0].request("room_send", room=room, body={"i": i}))["op"] == "ok"
    for m in members:
        assert [x["body"]["i"] for x in await room_msgs(m, 5)] == [0, 1, 2, 3, 4]
    assert nodes[3].app.router.stats["room_msgs_in"] == 0
    assert nodes[3].app.router.stats["envelopes_in"] == 0
    assert nodes[1].app.router.stats["room_msgs_in"] == 5  # from the sender's node, via RabbitMQ
    # The sender's node delivered locally and dropped its own echo from the exchange.
    assert nodes[0].app.router.stats["room_msgs_in"] == 0


async def test_node_unbinds_lazily_after_its_last_member_leaves(make_node, connect):
    n1 = await make_node(**FAST)
    n2 = await make_node(**FAST, room_unbind_delay_s=0.3)
    n3 = await make_node(**FAST)
    await settle(n1, n2, n3)
    room = uid("room")
    sender, churner, witness = (await connect(n1, uid("s")), await connect(n2, uid("c")),
                                await connect(n3, uid("w")))
    await sender.request("join", room=room)
    await witness.request("join", room=room)
    for _ in range(10):  # churn: one bind, no unbind while it lasts
        await churner.request("join", room=room)
        await churner.request("leave", room=room)
    assert n2.app.live.bind_ops == 1
    # The unbind, once the room stayed empty (counted when RabbitMQ confirmed it).
    assert await until(lambda: n2.app.live.bind_ops == 2, timeout=5)
    assert n2.app.live.snapshot()["bound"] == 0
    for i in range(3):
        await sender.request("room_send", room=room, body=i)
    assert len(await room_msgs(witness, 3)) == 3  # RabbitMQ routed them by now
    assert n2.app.router.stats["room_msgs_in"] == 0


async def test_prio_messages_survive_the_cap_and_drops_are_counted(make_node, connect):
    node = await make_node(room_rate_cap=5, room_send_rate=1e6, room_send_burst=1_000_000)
    room = uid("room")
    sender, member = await connect(node, uid("s")), await connect(node, uid("m"))
    await sender.request("join", room=room)
    await member.request("join", room=room)
    started = time.monotonic()
    sent = []
    for i in range(80):
        prio = 1 if i % 8 == 0 else 0
        sent.append((i, prio))
        await sender.send_raw(orjson.dumps({"op": "room_send", "room": room, "body": i,
                                            "prio": prio}))
    await sender.request("room_send", room=room, body="end", prio=1)
    got: list[Any] = []
    async with asyncio.timeout(10):
        while "end" not in got:
            got.extend(x["body"] for x in (await member.next_push("room_msgs"))["msgs"])
    elapsed = time.monotonic() - started
    prio_sent = [i for i, p in sent if p]
    normal_got = [b for b in got if b != "end" and b % 8 != 0]
    assert [b for b in got if b != "end" and b % 8 == 0] == prio_sent  # every prio, in order
    assert got == sorted(got, key=lambda b: 10**9 if b == "end" else b)  # order kept
    # The cap: a burst of 5, then 5 a second, shared with the prio messages.
    assert len(normal_got) <= 5 + 5 * elapsed
    dropped = _metric(node, 'im_room_msgs_dropped_total{reason="cap"}')
    assert dropped == 70 - len(normal_got) > 0


def _metric(node: Any, name: str) -> float:
    return sample(node.metrics.render(), name)


async def test_stalled_client_does_not_delay_the_others_and_is_closed(make_node, connect):
    node = await make_node(**UNCAPPED, room_buffer_max=65_536, stuck_close_s=5.0,
                           room_report_s=0.1)
    room = uid("room")
    sender = await connect(node, uid("s"))
    others = [await connect(node, uid("o")) for _ in range(2)]
    # The stalled member: a tiny receive buffer, and it never reads.
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", node.ws_port))
    stalled = await connect(node, uid("z"), sock=sock, max_size=None)
    for c in [sender, *others, stalled]:
        await c.request("join", room=room)
    assert await online(node.http_port, room) == 4
    stalled.stall()
    pad = "x" * 3500
    n = 1500
    for i in range(n):
        await sender.send_raw(orjson.dumps({"op": "room_send", "room": room,
                                            "body": {"i": i, "pad": pad}}))
    for o in others:
        msgs = await room_msgs(o, n, timeout=30)
        assert [m["body"]["i"] for m in msgs] == list(range(n))  # nothing lost, in order
    # 5.25 MB is more than the kernel holds for the stalled socket (tcp_wmem's 4 MB
    # at most), so its write buffer is over the bound now: the next messages skip
    # it. (A slow store can put the whole flood in one or two flushes, each
    # checked once against the bound, so the skip may come only now.)
    for i in range(n, n + 20):
        await sender.send_raw(orjson.dumps({"op": "room_send", "room": room,
                                            "body": {"i": i, "pad": pad}}))
    for o in others:
        assert [m["body"]["i"] for m in await room_msgs(o, 20)] == list(range(n, n + 20))
    assert _metric(node, "im_room_writes_skipped_total") > 0  # the stall was real
    # The others had every message before the stalled one was given up on: it
    # held nobody up while it was stuck.
    assert _metric(node, 'im_closed_total{reason="stuck"}') == 0
    assert await until(lambda: _metric(node, 'im_closed_total{reason="stuck"}') == 1,
                       timeout=15)
    assert await until(lambda: online_is(node.http_port, room, 3))


async def test_online_counts_follow_joins_leaves_and_a_node_death(make_node, connect,
                                                                  node_process):
    n1, n2 = await make_node(**FAST), await make_node(**FAST)
    proc = await node_process(**FAST)
    await settle(n1, n2)
    room = uid("room")
    on1 = [await connect(n1, uid("a")) for _ in range(3)]
    on2 = [await connect(n2, uid("b")) for _ in range(2)]
    on3 = [await connect(proc, uid("c")) for _ in range(4)]
    replies = [await c.request("join", room=room) for c in on1 + on2 + on3]
    assert replies[0]["online"] == 1
    assert [r["online"] for r in replies] == list(range(1, 10))
    assert await online(n1.http_port, room) == 9
    assert await online(proc.http_port, room) == 9
    await on1[0].request("leave", room=room)
    assert await online(n2.http_port, room) == 8
    await on2[0].close()  # a disconnect leaves every room
    assert await until(lambda: online_is(n1.http_port, room, 7))
    proc.kill()  # its 4 members vanish when its heartbeat lapses
    assert await until(lambda: online_is(n1.http_port, room, 3), timeout=10)
    assert await online(n2.http_port, room) == 3
