"""The connection index and the socket writer, on fake sockets (no servers).

The fakes stand in for ``websockets``' ServerConnection: ``protocol.state``
and a transport with ``get_write_buffer_size``, ``write``, ``writelines``
and ``abort``, which is all the writer touches.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from types import SimpleNamespace
from typing import cast

import orjson
import pytest
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.streams import StreamReader

from gateway.groups.hub import GroupHub
from gateway.hub import Client, ConnectionIndex, Hub
from gateway.metrics import NodeMetrics
from gateway.rooms.hub import RoomHub, RoomLimits
from gateway.wire import FANOUT, SocketWriter, Written, write_wires
from testkit.probe import sample


class FakeTransport:
    def __init__(self, buffered: int = 0) -> None:
        self.buffered = buffered
        self.out: list[bytes] = []
        self.calls = 0  # write and writelines calls
        self.aborted = False

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def write(self, data: bytes) -> None:
        self.calls += 1
        self.out.append(data)

    def writelines(self, data: list[bytes]) -> None:
        self.calls += 1
        self.out.extend(data)

    def abort(self) -> None:
        self.aborted = True


def make_client(user: str = "u", state: State = State.OPEN, buffered: int = 0) -> Client:
    ws = SimpleNamespace(protocol=SimpleNamespace(state=state), transport=FakeTransport(buffered))
    return Client(user, ws)  # type: ignore[arg-type]


def tr(client: Client) -> FakeTransport:
    return cast(FakeTransport, client.ws.transport)


class Tally:
    def __init__(self) -> None:
        self.n = 0.0

    def inc(self, amount: float = 1) -> None:
        self.n += amount


def parse(wire: bytes) -> list[Frame]:
    """Every WebSocket frame in ``wire``, read with websockets' own parser."""
    reader = StreamReader()
    reader.feed_data(wire)
    frames = []
    while reader.buffer:
        gen = Frame.parse(reader.read_exact, mask=False)
        try:
            next(gen)
        except StopIteration as done:
            frames.append(done.value)
            continue
        raise AssertionError("incomplete frame")
    return frames


def metric(m: NodeMetrics, name: str) -> float:
    return sample(m.render(), name)


# -- ConnectionIndex ------------------------------------------------------------------------------
def test_add_tells_the_first_connection_and_ignores_repeats():
    index: ConnectionIndex[str] = ConnectionIndex("rooms")
    a, b = make_client("a"), make_client("b")
    assert index.add("r1", a) is True
    assert index.add("r1", b) is False
    assert index.add("r1", a) is False  # already there: nothing changes
    assert index.count("r1") == 2 and index.memberships == 2
    assert dict(index.get("r1") or {}) == {a.id: a, b.id: b}
    assert index.keys_of(a) == {"r1"} and a.rooms == {"r1"}
    assert "r1" in index and "r2" not in index and list(index) == ["r1"] and len(index) == 1


def test_remove_tells_when_the_key_empties_and_the_key_goes():
    index: ConnectionIndex[str] = ConnectionIndex("rooms")
    a, b = make_client("a"), make_client("b")
    index.add("r1", a)
    index.add("r1", b)
    assert index.remove("r1", a) is False
    assert index.remove("r1", a) is False  # not a member any more
    assert index.remove("nowhere", b) is False
    assert index.remove("r1", b) is True
    assert "r1" not in index and len(index) == 0 and index.get("r1") is None
    assert index.count("r1") == 0 and index.memberships == 0


def test_remove_all_returns_keys_left_and_keys_emptied():
    index: ConnectionIndex[str] = ConnectionIndex("groups")
    a, b = make_client("a"), make_client("b")
    for key in ("g1", "g2", "g3"):
        index.add(key, a)
    index.add("g2", b)
    left, emptied = index.remove_all(a)
    assert sorted(left) == ["g1", "g2", "g3"] and sorted(emptied) == ["g1", "g3"]
    assert list(index) == ["g2"] and index.memberships == 1
    assert index.remove_all(a) == ([], [])


def test_idle_connections_hold_no_sets():
    rooms: ConnectionIndex[str] = ConnectionIndex("rooms")
    groups: ConnectionIndex[str] = ConnectionIndex("groups")
    c = make_client()
    assert c.rooms is None and c.groups is None and rooms.keys_of(c) == frozenset()
    groups.add("g", c)
    assert c.rooms is None and c.groups == {"g"}  # each index keeps its own slot
    rooms.add("r", c)
    rooms.add("s", c)
    rooms.remove("r", c)
    assert c.rooms == {"s"}
    rooms.remove("s", c)
    groups.remove_all(c)
    assert c.rooms is None and c.groups is None  # back to idle: the sets are gone


# -- write_wires and Client.write ------------------------------------------------------------------
def test_write_wires_checks_state_then_bound():
    wire = b"\x81\x02hi"
    assert write_wires(make_client(state=State.CLOSING).ws, [wire], 10) is Written.CLOSED
    assert write_wires(make_client(buffered=11).ws, [wire], 10) is Written.FULL
    ok = make_client(buffered=10)
    assert write_wires(ok.ws, [wire], 10) is Written.SENT
    assert tr(ok).out == [wire]


def test_client_write_frames_a_reply_and_never_marks_stuck():
    c = make_client()
    assert c.write(b'{"op":"ok","id":1}', 1 << 30)
    [frame] = parse(b"".join(tr(c).out))
    assert frame.opcode is Opcode.TEXT and frame.fin and frame.data == b'{"op":"ok","id":1}'
    full = make_client(buffered=100)
    assert not full.write(b"{}", 10) and full.stuck_since == 0.0
    assert not make_client(state=State.CLOSED).write(b"{}", 10)


# -- SocketWriter ---------------------------------------------------------------------------------
@pytest.fixture(params=["python", "c"])
def in_c(request: pytest.FixtureRequest) -> bool:
    """The writer's member loop: in Python, and in C where it is built."""
    if request.param == "c" and FANOUT != "c":
        pytest.skip("the C loop is not built here (no C compiler at install)")
    return bool(request.param == "c")


def test_the_c_loop_is_built_where_a_c_compiler_is():
    assert FANOUT == "c" or shutil.which("cc") is None, \
        "a C compiler is here but gateway._fanout is not built: pip install -e . again"


def test_writer_writes_the_same_bytes_to_each_and_skips_closed_sockets_silently(in_c):
    skipped = Tally()
    writer = SocketWriter(skipped, Tally(), in_c=in_c)
    wire = b"\x81\x02hi"
    open_a, open_b = make_client("a"), make_client("b")
    closed = make_client("c", state=State.CLOSED)
    assert writer.write_each([open_a, None, closed, open_b], [wire], 100) == 2  # None: a hole
    assert tr(open_a).out[0] is wire and tr(open_b).out[0] is wire
    assert tr(closed).out == []
    assert skipped.n == 0 and writer.stuck == {}  # closing is not backlog


def test_writer_skips_conn_and_writes_several_frames_in_order(in_c):
    writer = SocketWriter(Tally(), Tally(), in_c=in_c)
    a, b = make_client("a"), make_client("b")
    wires = [b"\x81\x01x", b"\x81\x01y"]
    assert writer.write_each([a, b], wires, 100, skip_conn=a.id) == 1
    assert tr(a).out == [] and b"".join(tr(b).out) == b"".join(wires)
    assert tr(b).calls == 1  # several frames, one write


def test_writer_counts_skips_over_the_bound_and_marks_then_clears_stuck(in_c):
    default, rooms = Tally(), Tally()
    writer = SocketWriter(default, Tally(), in_c=in_c)
    slow, fast = make_client("slow", buffered=500), make_client("fast")
    assert writer.write_each([slow, fast], [b"w"], 100) == 1
    assert default.n == 1 and tr(slow).out == []
    assert slow.stuck_since > 0 and writer.stuck == {slow.id: slow}
    first = slow.stuck_since
    assert writer.write_each([slow], [b"w"], 100, skipped=rooms) == 0
    assert rooms.n == 1 and default.n == 1  # a call may name its own counter
    assert slow.stuck_since == first  # stuck since the first skip
    tr(slow).buffered = 0
    assert writer.write_each([slow], [b"w"], 100) == 1
    assert slow.stuck_since == 0.0 and writer.stuck == {}


def test_writer_closes_sockets_stuck_too_long(caplog):
    closed = Tally()
    writer = SocketWriter(Tally(), closed)
    old, recent = make_client("old"), make_client("recent")
    writer.mark_stuck(old, 100.0)
    writer.mark_stuck(recent, 125.0)
    assert writer.stuck_longer_than(30, 131.0) == [old]
    with caplog.at_level(logging.INFO, logger="gateway.wire"):
        assert writer.close_stuck(30, 131.0) == 1
    assert tr(old).aborted and not tr(recent).aborted
    assert closed.n == 1 and old.stuck_since == 0.0 and list(writer.stuck) == [recent.id]
    assert "closing a stuck connection of old (write buffer full for 31s)" in caplog.text
    assert writer.close_stuck(30, 131.0) == 0


# -- the users of the writer: Hub, GroupHub, RoomHub ----------------------------------------------
def test_hub_frames_a_push_once_for_every_device_and_keeps_its_metrics():
    m = NodeMetrics()
    hub = Hub(m, write_buffer_max=100)
    phone, laptop, slow = make_client("bob"), make_client("bob"), make_client("bob", buffered=101)
    for c in (phone, laptop, slow):
        hub.add(c)
    frame = orjson.dumps({"op": "msg", "body": "hi"})
    assert hub.deliver_to_user("bob", frame, skip_conn=None) == 2
    assert tr(phone).out[0] is tr(laptop).out[0]  # framed once
    [parsed] = parse(tr(phone).out[0])
    assert parsed.opcode is Opcode.TEXT and parsed.data == frame
    assert metric(m, "im_pushes_total") == 2 and metric(m, "im_push_skipped_total") == 1
    assert hub.writer.stuck == {slow.id: slow}
    hub.remove(slow)  # a gone client is not stuck any more
    assert hub.writer.stuck == {} and hub.count == 2
    assert hub.deliver_to_user("nobody", frame, None) == 0


def test_group_hub_delivers_once_per_local_device():
    m = NodeMetrics()
    hub = Hub(m, 1 << 20)
    groups = GroupHub(hub)
    a, b, c = make_client("a"), make_client("b"), make_client("c")
    for client in (a, b, c):
        hub.add(client)
    assert groups.add(a, "g") is True and groups.add(b, "g") is False
    assert "g" in groups.members and groups.user_devices("a") == [a]
    assert groups.deliver_group("g", b"{}", skip_conn=a.id) == 1
    assert tr(a).out == [] and parse(tr(b).out[0])[0].data == b"{}"
    assert groups.deliver_group("other", b"{}") == 0
    assert groups.remove(a, "g") is False and groups.remove_all(b) == ["g"]
    assert "g" not in groups.members and a.groups is None and b.groups is None


async def test_room_flush_writes_one_wire_to_every_member_and_skips_the_backed_up():
    m = NodeMetrics()
    hub = Hub(m, 1 << 20)
    rooms = RoomHub(hub, m, RoomLimits(window_s=0.0, rate_cap=0, buffer_max=100))
    a, b, slow = make_client("a"), make_client("b"), make_client("s", buffered=101)
    assert [rooms.join(c, "r") for c in (a, b, slow)] == [True, False, False]
    assert rooms.count("r") == 3 and rooms.memberships == 3 and len(rooms.members) == 1
    rooms.deliver_room("r", b'{"from":"a","body":1,"ts":1}', 0)
    rooms.deliver_room("r", b'{"from":"b","body":2,"ts":2}', 0)
    await asyncio.sleep(0)  # the flush runs in the next loop tick
    assert tr(a).out[0] is tr(b).out[0] and tr(slow).out == []
    [frame] = parse(tr(a).out[0])
    assert [x["body"] for x in orjson.loads(frame.data)["msgs"]] == [1, 2]
    assert metric(m, "im_room_writes_total") == 2 and metric(m, "im_room_deliveries_total") == 4
    assert metric(m, "im_room_writes_skipped_total") == 1
    assert metric(m, "im_push_skipped_total") == 0 and hub.writer.stuck == {slow.id: slow}
    left, emptied = rooms.leave_all(slow)
    assert (left, emptied) == (["r"], [])
    assert rooms.leave(a, "r") is False and rooms.leave(b, "r") is True
    assert "r" not in rooms.members and metric(m, "im_rooms") == 0
