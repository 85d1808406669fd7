"""gateway.rooms.hub: positioned room messages leave in position order; a missing
position is waited for once, up to ``reorder_s`` (no server: fake sockets)."""

from __future__ import annotations

import asyncio

import orjson

from gateway.hub import Hub
from gateway.metrics import NodeMetrics
from gateway.rooms.hub import RoomHub, RoomLimits
from testkit.poll import until
from tests.core.test_wire_and_hub import make_client, metric, parse, tr


def rig(reorder_s: float = 0.02):
    m = NodeMetrics()
    rooms = RoomHub(Hub(m, 1 << 20), m, RoomLimits(window_s=0.0, rate_cap=0,
                                                    reorder_s=reorder_s))
    member = make_client("m")
    rooms.join(member, "r")
    return m, rooms, member


def put(rooms: RoomHub, epoch: str, *poss: int) -> None:
    for p in poss:
        rooms.deliver_room("r", orjson.dumps({"from": "a", "body": p, "ts": 1, "pos": p}), 0,
                           p, epoch)


def received(member) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []
    for wire in tr(member).out:
        for frame in parse(wire):
            obj = orjson.loads(frame.data)
            out.extend((obj["epoch"], m["pos"]) for m in obj["msgs"])
    return out


async def test_a_window_leaves_sorted_with_its_epoch():
    _, rooms, member = rig()
    put(rooms, "e1", 3, 1, 2)
    await asyncio.sleep(0)  # the flush runs in the next loop tick
    assert received(member) == [("e1", 1), ("e1", 2), ("e1", 3)]


async def test_a_missing_position_is_waited_for_once():
    m, rooms, member = rig(reorder_s=0.05)
    rooms.expect("r", "e1", 0)  # joined when the room was at 0
    put(rooms, "e1", 2, 3)
    await asyncio.sleep(0)
    assert received(member) == [] and metric(m, "im_room_held_total") == 1
    put(rooms, "e1", 1)  # another node's, late
    assert await until(lambda: len(received(member)) == 3, timeout=5, every=0.005)
    assert received(member) == [("e1", 1), ("e1", 2), ("e1", 3)]


async def test_a_position_that_never_comes_stops_nothing_for_long():
    _, rooms, member = rig(reorder_s=0.02)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 3, 4)
    await asyncio.sleep(0)
    assert received(member) == [("e1", 1)]  # up to the gap at once
    assert await until(lambda: len(received(member)) == 3, timeout=5, every=0.005)
    assert received(member) == [("e1", 1), ("e1", 3), ("e1", 4)]
    put(rooms, "e1", 2, 5)  # 2 turns up after all: out at once, with what follows
    assert await until(lambda: len(received(member)) == 5, timeout=5, every=0.005)
    assert received(member)[3:] == [("e1", 2), ("e1", 5)]


async def test_a_new_epoch_starts_the_order_again():
    _, rooms, member = rig()
    rooms.expect("r", "e1", 7)
    put(rooms, "e2", 1, 2)  # the room's history was lost: positions start again
    await asyncio.sleep(0)
    assert received(member) == [("e2", 1), ("e2", 2)]


async def test_unpositioned_messages_go_as_they_came():
    _, rooms, member = rig()
    for body in (2, 1):
        rooms.deliver_room("r", orjson.dumps({"from": "a", "body": body, "ts": 1}), 0)
    await asyncio.sleep(0)
    [wire] = tr(member).out
    obj = orjson.loads(parse(wire)[0].data)
    assert "epoch" not in obj and [x["body"] for x in obj["msgs"]] == [2, 1]
