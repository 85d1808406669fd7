"""Live rooms v2 on real nodes: positions, history on join, recovery after a
reconnect (``recovered`` honest after a trim or a lost history)."""

from __future__ import annotations

import asyncio
from typing import Any

from store.keys import Keys
from testkit.device import Device
from tests.conftest import RUN_NS, settle, uid

UNCAPPED = {"room_rate_cap": 0, "room_send_rate": 1e6, "room_send_burst": 1_000_000,
            "op_rate": 1e6, "op_burst": 1_000_000}


async def room_msgs(dev: Device, n: int, timeout: float = 10) -> tuple[str, list[dict[str, Any]]]:
    """The next ``n`` room messages ``dev`` receives (across frames), and their epoch."""
    got: list[dict[str, Any]] = []
    epochs = set()
    async with asyncio.timeout(timeout):
        while len(got) < n:
            frame = await dev.next_push("room_msgs")
            epochs.add(frame["epoch"])
            got.extend(frame["msgs"])
    assert len(epochs) == 1, epochs
    return epochs.pop(), got


async def send(dev: Device, room: str, *bodies: Any) -> None:
    for body in bodies:
        assert (await dev.request("room_send", room=room, body=body))["op"] == "ok"


async def test_a_member_away_rejoins_with_since_and_gets_exactly_what_it_missed(
        make_node, connect):
    n1, n2 = await make_node(**UNCAPPED), await make_node(**UNCAPPED)
    await settle(n1, n2)
    room, a, b = uid("room"), uid("a"), uid("b")
    sender, member = await connect(n1, a), await connect(n2, b)
    assert (await sender.request("join", room=room))["op"] == "joined"
    joined = await member.request("join", room=room)
    assert joined["pos"] == 0 and joined["epoch"] is None  # a room with no message yet
    await send(sender, room, *range(3))
    epoch, seen = await room_msgs(member, 3)
    assert [m["pos"] for m in seen] == [1, 2, 3] and [m["body"] for m in seen] == [0, 1, 2]
    await member.close()  # the network blips: gone while the room goes on

    await send(sender, room, *range(3, 13))
    back = await connect(n2, b)
    got = await back.request("join", room=room, since={"epoch": epoch, "pos": 3})
    assert got["recovered"] is True and (got["epoch"], got["pos"]) == (epoch, 13)
    assert [m["pos"] for m in got["msgs"]] == list(range(4, 14))
    assert [m["body"] for m in got["msgs"]] == list(range(3, 13))
    assert {m["from"] for m in got["msgs"]} == {a}
    await send(sender, room, "live")
    _, live = await room_msgs(back, 1)
    assert (live[0]["pos"], live[0]["body"]) == (14, "live")
    # Nothing missed: recovered, with nothing to give.
    again = await connect(n1, uid("c"))
    got = await again.request("join", room=room, since={"epoch": epoch, "pos": 14})
    assert (got["recovered"], got["msgs"]) == (True, [])


async def test_history_on_join_gives_the_last_messages_in_order(make_node, connect):
    n1, n2 = await make_node(**UNCAPPED), await make_node(**UNCAPPED)
    await settle(n1, n2)
    room = uid("room")
    sender = await connect(n1, uid("a"))
    await sender.request("join", room=room)
    await send(sender, room, *range(8))
    late = await connect(n2, uid("late"))
    got = await late.request("join", room=room, history=5)
    assert [m["body"] for m in got["msgs"]] == [3, 4, 5, 6, 7]
    assert [m["pos"] for m in got["msgs"]] == [4, 5, 6, 7, 8] and got["pos"] == 8
    assert "recovered" not in got
    plain = await (await connect(n2, uid("p"))).request("join", room=room)
    assert "msgs" not in plain and plain["pos"] == 8 and plain["epoch"] == got["epoch"]


async def test_a_trimmed_history_is_not_recovered(make_node, connect):
    kw = {**UNCAPPED, "room_history": 5}
    n1, n2 = await make_node(**kw), await make_node(**kw)
    await settle(n1, n2)
    room = uid("room")
    sender = await connect(n1, uid("a"))
    await sender.request("join", room=room)
    await send(sender, room, 0)
    epoch = (await sender.request("join", room=room))["epoch"]
    await send(sender, room, *range(1, 9))  # positions 2-9; 5-9 kept
    back = await connect(n2, uid("b"))
    got = await back.request("join", room=room, since={"epoch": epoch, "pos": 1})
    assert got["recovered"] is False
    assert [m["pos"] for m in got["msgs"]] == [5, 6, 7, 8, 9]  # what is kept
    got = await back.request("join", room=room, since={"epoch": epoch, "pos": 4})
    assert got["recovered"] is True and [m["pos"] for m in got["msgs"]] == [5, 6, 7, 8, 9]


async def test_a_lost_history_changes_the_epoch_and_is_not_recovered(
        make_node, connect, redis_client):
    n1 = await make_node(**UNCAPPED)
    room = uid("room")
    sender = await connect(n1, uid("a"))
    await sender.request("join", room=room)
    await send(sender, room, *range(4))
    epoch, _ = await room_msgs(sender, 4)
    # What a flush or a failover that lost the writes does to this room.
    keys = Keys(RUN_NS)
    await redis_client.delete(keys.room_meta(room))
    await redis_client.delete(keys.room_history(room))
    await send(sender, room, "after")
    new_epoch, msgs = await room_msgs(sender, 1)
    assert new_epoch != epoch and msgs[0]["pos"] == 1
    member = await connect(n1, uid("b"))
    for pos in (2, 4):  # behind, and at the end of, the lost epoch: never true
        got = await member.request("join", room=room, since={"epoch": epoch, "pos": pos})
        assert got["recovered"] is False and got["epoch"] == new_epoch
        assert [m["body"] for m in got["msgs"]] == ["after"]


async def test_positions_strictly_increase_with_publishers_on_three_nodes(make_node, connect):
    # A generous wait for a missing position: this checks the order, not the
    # broker's speed on a loaded machine (the default is 50 ms).
    nodes = [await make_node(**UNCAPPED, room_reorder_ms=5000) for _ in range(3)]
    await settle(*nodes)
    room, per = uid("room"), 40
    publishers = [await connect(n, uid(f"p{i}")) for i, n in enumerate(nodes)]
    members = [await connect(n, uid(f"m{i}")) for i, n in enumerate(nodes)]
    for dev in publishers + members:
        assert (await dev.request("join", room=room))["op"] == "joined"

    async def publish(i: int, dev: Device) -> None:
        # Pipelined, so the three nodes' messages interleave in Redis and the broker.
        # On CI's loaded machine (the nodes' heartbeats lapsed meanwhile once) the
        # last answers came past the client's usual 10 s: this checks the order.
        replies = await asyncio.gather(*(dev.request("room_send", timeout=60, room=room,
                                                     body=[i, k]) for k in range(per)))
        assert all(r["op"] == "ok" for r in replies)

    await asyncio.gather(*(publish(i, d) for i, d in enumerate(publishers)))
    for dev in members:
        _, msgs = await room_msgs(dev, 3 * per, timeout=60)
        poss = [m["pos"] for m in msgs]
        assert poss == list(range(1, 3 * per + 1))  # every one, in position order
        for i in range(3):  # each publisher's own order kept too
            assert [m["body"][1] for m in msgs if m["body"][0] == i] == list(range(per))


async def test_the_cap_samples_delivery_but_recovery_returns_every_kept_message(
        make_node, connect):
    n1 = await make_node(room_rate_cap=2, room_send_rate=1e6, room_send_burst=1_000_000,
                         op_rate=1e6, op_burst=1_000_000)
    room = uid("room")
    sender, member = await connect(n1, uid("a")), await connect(n1, uid("b"))
    await sender.request("join", room=room)
    joined = await member.request("join", room=room)
    await send(sender, room, "first")
    epoch, _ = await room_msgs(member, 1)
    await asyncio.gather(*(sender.request("room_send", room=room, body=k) for k in range(40)))
    await member.request("ping")
    got = await member.request("join", room=room, since={"epoch": epoch, "pos": 1})
    delivered = [m for f in member.drain_pushes() if f.get("op") == "room_msgs"
                 for m in f["msgs"]]
    assert len(delivered) < 40  # sampled by the cap of 2/s
    assert got["recovered"] is True and [m["pos"] for m in got["msgs"]] == list(range(2, 42))
    assert joined["online"] == 2


async def test_online_counts_connections_and_users(make_node, connect, http):
    n1, n2 = await make_node(), await make_node()
    await settle(n1, n2)
    room, a, b = uid("room"), uid("a"), uid("b")
    a1, a2, b1 = await connect(n1, a), await connect(n1, a), await connect(n2, b)
    got = [await d.request("join", room=room) for d in (a1, a2, b1)]
    assert [(g["online"], g["users"]) for g in got] == [(1, 1), (2, 1), (3, 2)]
    r = await http(a, n2).get(f"/v1/rooms/{room}")
    assert r.json() == {"room": room, "online": 3, "users": 2}
    await a2.request("leave", room=room)
    r = await http(a, n1).get(f"/v1/rooms/{room}")
    assert r.json() == {"room": room, "online": 2, "users": 2}
