"""gateway.rooms.hub: positioned room messages leave in position order; a missing
position is waited for once, up to ``reorder_s``; then the room's history is
asked for it (``when_gap`` / ``recovered``), and a member is told ``room_gap``
before any jump it cannot be spared (no server: fake sockets, the history
given by the test)."""

from __future__ import annotations

import asyncio

import orjson

from core.room_history import RoomLog
from gateway.hub import Hub
from gateway.metrics import NodeMetrics
from gateway.rooms.hub import RoomHub, RoomLimits
from testkit.poll import until
from tests.core.test_wire_and_hub import make_client, metric, parse, tr


def rig(reorder_s: float = 0.02, recover_s: float = 2.0):
    m = NodeMetrics()
    rooms = RoomHub(Hub(m, 1 << 20), m, RoomLimits(window_s=0.0, rate_cap=0,
                                                    reorder_s=reorder_s, recover_s=recover_s))
    member = make_client("m")
    rooms.join(member, "r")
    return m, rooms, member


def msg(p: int, ts: int = 1) -> bytes:
    return orjson.dumps({"from": "a", "body": p, "ts": ts, "pos": p})


def put(rooms: RoomHub, epoch: str, *poss: int) -> None:
    for p in poss:
        rooms.deliver_room("r", msg(p), 0, p, epoch)


def received(member, gaps: bool = False) -> list[tuple[str, int]]:
    """(epoch, pos) of each message received; with ``gaps``, a ``room_gap`` as
    ("gap:<epoch>", after) where it came."""
    out: list[tuple[str, int]] = []
    for wire in tr(member).out:
        for frame in parse(wire):
            obj = orjson.loads(frame.data)
            if obj["op"] == "room_gap":
                assert obj["room"] == "r"
                if gaps:
                    out.append((f"gap:{obj['epoch']}", obj["after"]))
                continue
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
    _, rooms, member = rig(reorder_s=0.02, recover_s=0.1)  # nobody answers for the history
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 3, 4)
    await asyncio.sleep(0)
    assert received(member) == [("e1", 1)]  # up to the gap at once
    assert await until(lambda: len(received(member)) == 3, timeout=5, every=0.005)
    # told before the jump: what follows position 1 may be missing
    assert received(member, gaps=True) == [("e1", 1), ("gap:e1", 1), ("e1", 3), ("e1", 4)]
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


# -- gaps: the history is asked, the members told ---------------------------------------------


def asking(rooms: RoomHub) -> list[tuple[str, str, int]]:
    asked: list[tuple[str, str, int]] = []
    rooms.when_gap(lambda room, epoch, after: asked.append((room, epoch, after)))
    return asked


async def test_a_gap_past_the_wait_is_filled_from_the_history_in_order():
    m, rooms, member = rig(reorder_s=0.02)
    asked = asking(rooms)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 4, 5)  # 2 and 3 were missed here (a broker outage)
    assert await until(lambda: asked, timeout=5, every=0.005)
    assert asked == [("r", "e1", 1)] and received(member) == [("e1", 1)]
    await asyncio.sleep(0.1)  # several reorder waits: still held, no jump
    assert received(member) == [("e1", 1)]
    rooms.recovered("r", "e1", 1, RoomLog("e1", 5, [msg(p) for p in range(1, 6)]), 1000)
    assert await until(lambda: len(received(member)) == 5, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e1", p) for p in range(1, 6)]  # once each
    assert metric(m, 'im_room_recoveries_total{outcome="recovered"}') == 1


async def test_what_is_no_longer_kept_is_told_as_room_gap_then_the_rest_goes():
    m, rooms, member = rig(reorder_s=0.02)
    asked = asking(rooms)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 9)
    assert await until(lambda: asked, timeout=5, every=0.005)
    rooms.recovered("r", "e1", 1, RoomLog("e1", 9, [msg(p) for p in range(6, 10)]), 1000)
    assert await until(lambda: len(received(member)) == 5, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e1", 1), ("gap:e1", 1), ("e1", 6), ("e1", 7),
                                           ("e1", 8), ("e1", 9)]
    assert metric(m, 'im_room_recoveries_total{outcome="gap"}') == 1


async def test_an_unreadable_history_is_told_at_once():
    m, rooms, member = rig(reorder_s=0.02)
    asked = asking(rooms)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 3)
    assert await until(lambda: asked, timeout=5, every=0.005)
    rooms.recovered("r", "e1", 1, None, 1000)
    assert await until(lambda: len(received(member)) == 2, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e1", 1), ("gap:e1", 1), ("e1", 3)]
    assert metric(m, 'im_room_recoveries_total{outcome="failed"}') == 1


async def test_after_a_broker_outage_a_missed_tail_comes_from_the_history():
    _, rooms, member = rig()
    asked = asking(rooms)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 2)
    assert await until(lambda: len(received(member)) == 2, timeout=5, every=0.005)
    # The link was lost while 3 and 4 were published; nothing later reveals it.
    assert rooms.suspect_all() == [("r", "e1", 2)] and asked == [("r", "e1", 2)]
    rooms.recovered("r", "e1", 2, RoomLog("e1", 4, [msg(p) for p in range(1, 5)]), 1000)
    assert await until(lambda: len(received(member)) == 4, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e1", p) for p in range(1, 5)]


async def test_nothing_missed_means_nothing_sent_twice():
    _, rooms, member = rig()
    asking(rooms)
    rooms.expect("r", "e1", 0)
    put(rooms, "e1", 1, 2)
    assert await until(lambda: len(received(member)) == 2, timeout=5, every=0.005)
    rooms.suspect_all()
    rooms.recovered("r", "e1", 2, RoomLog("e1", 2, [msg(1), msg(2)]), 1000)
    put(rooms, "e1", 3)
    assert await until(lambda: len(received(member)) == 3, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e1", 1), ("e1", 2), ("e1", 3)]


async def test_a_new_epoch_that_does_not_start_at_1_is_a_gap_too():
    _, rooms, member = rig(reorder_s=0.02)
    asked = asking(rooms)
    rooms.expect("r", "e1", 7)
    put(rooms, "e2", 2, 3)  # Redis lost the room; e2's first message never came here
    assert await until(lambda: asked, timeout=5, every=0.005)
    assert asked == [("r", "e2", 0)] and received(member) == []
    rooms.recovered("r", "e2", 0, RoomLog("e2", 3, [msg(1), msg(2), msg(3)]), 1000)
    assert await until(lambda: len(received(member)) == 3, timeout=5, every=0.005)
    assert received(member, gaps=True) == [("e2", 1), ("e2", 2), ("e2", 3)]
