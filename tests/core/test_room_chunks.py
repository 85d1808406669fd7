"""gateway.rooms.hub / gateway.rooms.ring: a room bigger than ``write_chunk`` is
written by a cursor, a chunk of members per loop turn; each member gets every
frame it lacks in one write, in order (no server: fake sockets)."""

from __future__ import annotations

import asyncio

import orjson

from gateway.hub import Hub
from gateway.metrics import NodeMetrics
from gateway.rooms.hub import RoomHub, RoomLimits
from gateway.rooms.ring import first_pass
from testkit.poll import until
from tests.core.test_wire_and_hub import make_client, metric, parse, tr


def rig(members: int, chunk: int):
    m = NodeMetrics()
    rooms = RoomHub(Hub(m, 1 << 20), m, RoomLimits(window_s=0.0, rate_cap=0,
                                                    write_chunk=chunk, write_at_once=chunk))
    clients = [make_client(f"u{i}") for i in range(members)]
    for c in clients:
        rooms.join(c, "r")
    return m, rooms, clients


def put(rooms: RoomHub, *bodies: int) -> None:
    for b in bodies:
        rooms.deliver_room("r", orjson.dumps({"from": "a", "body": b, "ts": 1}), 0)


def frames_of(client) -> list[list[int]]:
    """The messages' bodies, frame by frame."""
    return [[m["body"] for m in orjson.loads(f.data)["msgs"]]
            for wire in tr(client).out for f in parse(wire)]


def written(clients) -> int:
    return sum(1 for c in clients if tr(c).out)


async def test_a_big_room_is_written_a_chunk_per_turn():
    m, rooms, clients = rig(members=10, chunk=4)
    put(rooms, 1)
    await asyncio.sleep(0)  # the flush: the first chunk at once
    assert written(clients) == 4
    await asyncio.sleep(0)
    assert written(clients) == 8
    await asyncio.sleep(0)
    assert written(clients) == 10
    assert all(frames_of(c) == [[1]] for c in clients)
    assert metric(m, "im_room_deliveries_total") == 10
    assert metric(m, "im_room_writes_total") == 10


async def test_a_small_room_is_written_at_once():
    _, rooms, clients = rig(members=4, chunk=4)
    put(rooms, 1)
    await asyncio.sleep(0)
    assert written(clients) == 4


async def test_frames_added_mid_pass_reach_everyone_in_order_with_fewer_writes():
    m, rooms, clients = rig(members=9, chunk=3)
    put(rooms, 1)
    await asyncio.sleep(0)  # [1] to members 0-2
    put(rooms, 2)  # flushed in the next turn, after that turn's chunk (members 3-5)
    await asyncio.sleep(0)
    put(rooms, 3)
    assert await until(lambda: all(len(frames_of(c)) == 3 for c in clients), timeout=5,
                       every=0.001)
    await asyncio.sleep(0.01)  # the ring's last passes: nothing more goes out
    assert all(frames_of(c) == [[1], [2], [3]] for c in clients)
    # A member gets what it lacks in one write per pass: 2 writes each for 3 frames.
    assert [tr(c).calls for c in clients] == [2] * 9
    assert metric(m, "im_room_frames_total") == 3
    assert metric(m, "im_room_writes_total") == 27
    assert metric(m, "im_room_deliveries_total") == 27


async def test_a_member_joining_mid_ring_gets_only_what_follows():
    _, rooms, clients = rig(members=6, chunk=2)
    put(rooms, 1)
    await asyncio.sleep(0)
    late = make_client("late")
    rooms.join(late, "r")
    put(rooms, 2)
    assert await until(lambda: all(len(frames_of(c)) == 2 for c in clients), timeout=5,
                       every=0.001)
    assert await until(lambda: frames_of(late) == [[2]], timeout=5, every=0.001)


async def test_a_member_that_leaves_mid_pass_is_written_nothing_more():
    _, rooms, clients = rig(members=6, chunk=2)
    put(rooms, 1)
    await asyncio.sleep(0)
    gone = clients[5]  # still in the pass's snapshot, its socket still open
    rooms.leave(gone, "r")
    put(rooms, 2)
    assert await until(lambda: all(len(frames_of(c)) == 2 for c in clients[:5]), timeout=5,
                       every=0.001)
    await asyncio.sleep(0.01)
    assert frames_of(gone) == []


async def test_two_big_rooms_progress_in_the_same_turns():
    m = NodeMetrics()
    rooms = RoomHub(Hub(m, 1 << 20), m, RoomLimits(window_s=0.0, rate_cap=0, write_chunk=2,
                                                    write_at_once=2))
    a = [make_client(f"a{i}") for i in range(4)]
    b = [make_client(f"b{i}") for i in range(4)]
    for c in a:
        rooms.join(c, "ra")
    for c in b:
        rooms.join(c, "rb")
    rooms.deliver_room("ra", orjson.dumps({"from": "x", "body": 1, "ts": 1}), 0)
    rooms.deliver_room("rb", orjson.dumps({"from": "x", "body": 2, "ts": 1}), 0)
    await asyncio.sleep(0)
    assert (written(a), written(b)) == (2, 2)
    await asyncio.sleep(0)
    assert (written(a), written(b)) == (4, 4)


async def test_a_room_up_to_write_at_once_is_written_in_one_go_whatever_the_chunk():
    m = NodeMetrics()
    rooms = RoomHub(Hub(m, 1 << 20), m, RoomLimits(window_s=0.0, rate_cap=0, write_chunk=2,
                                                    write_at_once=6))
    clients = [make_client(f"u{i}") for i in range(6)]
    for c in clients:
        rooms.join(c, "r")
    put(rooms, 1)
    await asyncio.sleep(0)
    assert written(clients) == 6


async def test_leaving_and_joining_again_mid_ring_writes_each_frame_once():
    _, rooms, clients = rig(members=6, chunk=2)
    put(rooms, 1)
    await asyncio.sleep(0)  # [1] to members 0-1
    back = clients[4]  # not yet written [1]
    rooms.leave(back, "r")
    rooms.join(back, "r")  # again: at the end of the list, from the newest frame on
    rooms.join(clients[0], "r")  # already a member: nothing changes
    put(rooms, 2)
    assert await until(lambda: all(len(frames_of(c)) == 2 for c in clients if c is not back),
                       timeout=5, every=0.001)
    assert await until(lambda: frames_of(back) == [[2]], timeout=5, every=0.001)
    await asyncio.sleep(0.01)
    assert all(frames_of(c) == [[1], [2]] for c in clients if c is not back)
    assert frames_of(back) == [[2]]


async def test_many_members_leaving_mid_ring_leave_the_rest_their_frames_in_order():
    _, rooms, clients = rig(members=40, chunk=5)
    put(rooms, 1)
    await asyncio.sleep(0)  # [1] to members 0-4
    await asyncio.sleep(0)  # and 5-9
    gone = clients[3:40:2]  # half of them, behind and ahead of the cursor
    for c in gone:
        rooms.leave(c, "r")
    put(rooms, 2)
    await asyncio.sleep(0)
    put(rooms, 3)
    stay = [c for c in clients if c not in gone]
    assert await until(lambda: all(len(frames_of(c)) == 3 for c in stay), timeout=5,
                       every=0.001)
    await asyncio.sleep(0.01)  # the ring ran its passes (and closed its holes) and ended
    assert all([b for f in frames_of(c) for b in f] == [1, 2, 3] for c in stay)
    assert all(frames_of(c) in ([], [[1]]) for c in gone)
    assert not rooms._rings  # noqa: SLF001 - the ring ended


def test_a_ring_closes_its_holes_between_passes_keeping_what_each_member_had():
    clients = [make_client(f"u{i}") for i in range(10)]
    ring = first_pass(clients, [b"f1"], 1)
    got: dict[int, list[bytes]] = {}

    def write(run, wires, frags):
        for c in run:
            if c is not None:
                got.setdefault(c.id, []).append(b"".join(wires))
        return sum(c is not None for c in run)

    ring.step(4, write)  # members 0-3 get f1
    ring.add([b"f2"], 1, 0.0)  # mid-pass: 4-9 get f1 f2 now, 0-3 f2 next pass
    for c in clients[5:]:
        ring.left(c.id)  # 5 holes of 10: compacted before the next pass
    assert ring.step(10, write)[2]
    ring.end_pass(0.0)
    assert ring.new_pass()
    assert ring.clients == clients[:5]  # the holes are closed
    assert ring.step(10, write)[2]
    ring.end_pass(0.0)
    assert not ring.new_pass()  # nothing came during that pass: the ring is done
    assert [got[c.id] for c in clients[:4]] == [[b"f1", b"f2"]] * 4
    assert got[clients[4].id] == [b"f1f2"]  # one write for both
    assert all(c.id not in got for c in clients[5:])
