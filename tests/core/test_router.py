"""Router (router/router.py) with the memory broker, fake connection maps and a
fake route store; the inter-node envelope (router/envelope.py). No servers.

``MemoryBroker`` is one node's broker (it keeps one ``node`` name: a second
router started on it would take over its room bindings and its close), so
each router here gets its own, wrapped to record what the router publishes;
the envelopes are decoded with ``envelope.decode``.
"""

from __future__ import annotations

import struct
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
import pytest

from router import controls, envelope
from router.base import BrokerStatus
from router.broker_memory import MemoryBroker
from router.controls import (
    KINDS,
    Close,
    Control,
    Controls,
    GroupAdd,
    GroupDel,
    Revoke,
    RoomKick,
    RoomMute,
    RoomUnmute,
    Unban,
)
from router.router import Router
from router.routing import group_key
from tests.core.fakes import FakeRoutes, settle

CTL = GroupAdd("G")
CTL_WIRE = {"op": "gadd", "g": "G"}


class Sockets:
    """This node's connection maps (``LocalDelivery``, ``GroupDelivery``,
    ``RoomDelivery``): records every write; ``devices`` says how many sockets
    each user has here."""

    def __init__(self, devices: dict[str, int]) -> None:
        self.devices = devices
        self.user_writes: list[tuple[str, bytes, int | None]] = []
        self.group_writes: list[tuple[str, bytes, int | None]] = []
        self.room_writes: list[tuple[str, bytes, int]] = []

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        self.user_writes.append((user, frame, skip_conn))
        return self.devices.get(user, 0)

    def deliver_group(self, group: str, frame: bytes, skip_conn: int | None) -> int:
        self.group_writes.append((group, frame, skip_conn))
        return 1

    def deliver_room(self, room: str, fragment: bytes, prio: int, pos: int = 0,
                     epoch: str | None = None) -> None:
        self.room_writes.append((room, fragment, prio))


class RecordingBroker:
    """A ``MemoryBroker`` that records each publish as (kind, key, envelope)."""

    def __init__(self) -> None:
        self.inner = MemoryBroker()
        self.published: list[tuple[str, str, bytes]] = []

    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None:
        await self.inner.start(node, on_envelope, on_resume)

    async def publish(self, node: str, envelope: bytes) -> None:
        self.published.append(("node", node, envelope))
        await self.inner.publish(node, envelope)

    async def publish_key(self, key: str, envelope: bytes) -> None:
        self.published.append(("room", key, envelope))
        await self.inner.publish_key(key, envelope)

    async def bind_key(self, key: str) -> None:
        await self.inner.bind_key(key)

    async def unbind_key(self, key: str) -> None:
        await self.inner.unbind_key(key)

    def bound_keys(self) -> set[str]:
        return self.inner.bound_keys()

    async def publish_event(self, key: str, body: bytes, event_id: str) -> None:
        self.published.append(("events", key, body))

    def status(self) -> BrokerStatus:
        return self.inner.status()

    async def close(self) -> None:
        await self.inner.close()

    def sent(self, kind: str) -> list[tuple[str, list[envelope.Record]]]:
        """(key, decoded records) of each ``kind`` publish, by key (a flush's order
        of nodes is not defined), then in publish order."""
        out = [(key, list(envelope.decode(env))) for k, key, env in self.published
               if k == kind]
        return sorted(out, key=lambda kv: kv[0])


@dataclass
class Rig:
    router: Router
    local: Sockets
    routes: FakeRoutes
    broker: RecordingBroker
    controls: list[tuple[list[str], Control, int]] = field(default_factory=list)


async def start_rig(node: str, devices: dict[str, int]) -> Rig:
    local, routes, broker = Sockets(devices), FakeRoutes(), RecordingBroker()
    rig: Rig

    async def on_control(users: list[str], ctl: Control) -> None:
        rig.controls.append((users, ctl, len(broker.published)))

    controls = Controls()
    for kind in KINDS:
        controls.handle(kind, on_control)
    router = Router(node, local, broker, routes, rooms=local, groups=local,
                    controls=controls)
    rig = Rig(router, local, routes, broker)
    await router.start()
    return rig


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    r = await start_rig("n1", {"bob": 2})
    yield r
    await r.router.close()


async def test_push_writes_locally_at_once_and_batches_one_envelope_per_node(rig: Rig) -> None:
    bob = {"n1/1": "n1", "n2/5": "n2", "n3/7": "n3"}
    rig.router.push("bob", b"f1", bob, skip_conn=1)
    rig.router.push("carol", b"f2", {"n2/9": "n2"})
    assert rig.local.user_writes == [("bob", b"f1", 1), ("carol", b"f2", None)]
    assert rig.router.stats["local_writes"] == 2
    assert rig.broker.published == []  # queued until the end of this loop turn

    assert await settle(lambda: len(rig.broker.published) == 2)
    assert rig.broker.sent("node") == [
        ("n2", [({"u": ["bob"]}, b"f1"), ({"u": ["carol"]}, b"f2")]),
        ("n3", [({"u": ["bob"]}, b"f1")]),
    ]
    rig.router.push("bob", b"f3", bob)  # a later turn: envelopes of its own
    assert await settle(lambda: len(rig.broker.published) == 4)
    assert rig.broker.sent("node") == [
        ("n2", [({"u": ["bob"]}, b"f1"), ({"u": ["carol"]}, b"f2")]),
        ("n2", [({"u": ["bob"]}, b"f3")]),
        ("n3", [({"u": ["bob"]}, b"f1")]),
        ("n3", [({"u": ["bob"]}, b"f3")]),
    ]
    assert await settle(lambda: rig.router.stats["envelopes_out"] == 4)


async def test_routes_to_dead_nodes_are_not_published_and_are_purged(rig: Rig) -> None:
    now = time.time()
    rig.router.set_live({"n2": now - 60, "n3": now + 60})
    dead = rig.routes.connect("bob", "n2", 5)
    rig.routes.connect("bob", "n3", 7)
    rig.routes.connect("bob", "n4", 1)  # not in the view yet: a newer node, routed to
    [routes] = await rig.routes.lookup(["bob"])
    rig.router.push("bob", b"f", routes)

    assert await settle(lambda: len(rig.broker.published) == 2 and bool(rig.routes.purged))
    assert [key for key, _ in rig.broker.sent("node")] == ["n3", "n4"]
    assert rig.routes.purged == {"bob": {dead}}
    assert dead not in rig.routes.routes["bob"]
    assert rig.router.stats["routes_purged"] == 1


async def test_a_view_that_could_not_be_refreshed_declares_no_node_dead(rig: Rig) -> None:
    # Read a minute ago, when n2 beat: its expiry has lapsed since, but no read
    # showed it lapsed (Redis was down): n2 is routed to and nothing is purged.
    now = time.time()
    rig.router.set_live({"n2": now - 50}, read_at=now - 60)
    rig.routes.connect("bob", "n2", 5)
    [routes] = await rig.routes.lookup(["bob"])
    rig.router.push("bob", b"f", routes)
    assert await settle(lambda: len(rig.broker.published) == 1)
    assert [key for key, _ in rig.broker.sent("node")] == ["n2"]
    assert rig.routes.purged == {}
    assert rig.router.live_routes(routes, now) == 1


async def test_push_users_looks_routes_up_once_for_all(rig: Rig) -> None:
    rig.routes.connect("bob", "n2", 1)
    rig.routes.connect("carol", "n2", 2)
    await rig.router.push_users(["bob", "carol", "dave"], b"feed")
    assert await settle(lambda: len(rig.broker.published) == 1)
    assert rig.broker.sent("node") == [("n2", [({"u": ["bob"]}, b"feed"),
                                               ({"u": ["carol"]}, b"feed")])]


async def test_publish_group_delivers_locally_and_one_envelope_per_group(rig: Rig) -> None:
    rig.router.publish_group("g1", b"m1", skip_conn=3)
    rig.router.publish_group("g2", b"m2")
    rig.router.publish_group("g1", b"m3")
    assert rig.local.group_writes == [("g1", b"m1", 3), ("g2", b"m2", None),
                                      ("g1", b"m3", None)]
    assert await settle(lambda: len(rig.broker.published) == 2)
    assert rig.broker.sent("room") == [
        (group_key("g1"), [({"g": "g1"}, b"m1"), ({"g": "g1"}, b"m3")]),
        (group_key("g2"), [({"g": "g2"}, b"m2")]),
    ]


async def test_tell_applies_here_then_tells_each_live_node(rig: Rig) -> None:
    now = time.time()
    rig.router.set_live({"n2": now + 60, "n3": now - 60})
    rig.routes.connect("bob", "n1", 1)
    rig.routes.connect("bob", "n2", 2)
    rig.routes.connect("carol", "n2", 3)
    rig.routes.connect("dave", "n3", 4)  # a dead node has nothing to be told
    rig.routes.connect("erin", "n4", 5)
    users = ["bob", "carol", "dave", "erin", "frank"]
    await rig.router.tell(users, CTL)

    assert rig.controls == [(users, CTL, 0)]  # here first, before any publish
    assert rig.broker.sent("node") == [  # confirmed before tell returned
        ("n2", [({"u": ["bob", "carol"], "c": CTL_WIRE}, b"")]),
        ("n4", [({"u": ["erin"], "c": CTL_WIRE}, b"")]),
    ]


async def test_incoming_envelopes_reach_controls_users_groups_and_rooms(rig: Rig) -> None:
    env = envelope.encode([
        ({"u": ["bob"], "c": {"op": "gdel", "g": "G"}}, b""),
        ({"u": ["bob", "nobody"]}, b"msg"),
        ({"g": "G"}, b"gm"),
        ({"r": "R", "p": 1}, b"rm1"),
        ({"r": "R"}, b"rm0"),
    ])
    await rig.broker.publish("n1", env)  # the memory broker hands it to its own node
    assert await settle(lambda: bool(rig.controls))
    assert [(u, c) for u, c, _ in rig.controls] == [(["bob"], GroupDel("G"))]
    assert rig.local.user_writes == [("bob", b"msg", None), ("nobody", b"msg", None)]
    assert rig.local.group_writes == [("G", b"gm", None)]
    assert rig.local.room_writes == [("R", b"rm1", 1), ("R", b"rm0", 0)]
    s = rig.router.stats
    assert (s["envelopes_in"], s["remote_writes"], s["group_msgs_in"], s["room_msgs_in"]) == (
        1, 2, 1, 2)


async def test_an_envelope_published_by_one_router_is_delivered_by_another(rig: Rig) -> None:
    other = await start_rig("n2", {"bob": 1})
    try:
        rig.router.push("bob", b"hello", {"n2/1": "n2"})
        assert await settle(lambda: len(rig.broker.published) == 1)
        [(_, node, env)] = rig.broker.published
        await other.broker.publish(node, env)  # the wire between the two brokers
        assert other.local.user_writes == [("bob", b"hello", None)]
        assert other.router.stats["remote_writes"] == 1
    finally:
        await other.router.close()


def test_envelope_round_trip() -> None:
    records: list[envelope.Record] = [
        ({"u": ["bob", "ünïcode"]}, b'{"op":"msg"}'),
        ({"g": "G"}, b""),
        ({"r": "R", "p": 1}, bytes(range(256))),
        ({}, b"\x00" * 70_000),
    ]
    data = envelope.encode(records)
    assert list(envelope.decode(data)) == records
    assert envelope.encode([]) == b"" and list(envelope.decode(b"")) == []


def record(header: bytes, frame: bytes) -> bytes:
    n = struct.Struct(">I")
    return n.pack(len(header)) + header + n.pack(len(frame)) + frame


MALFORMED = {
    "truncated length": b"\x00\x00",
    "truncated header": struct.pack(">I", 10) + b"{}",
    "truncated frame": record(b"{}", b"abc")[:-1],
    "frame length missing": struct.pack(">I", 2) + b"{}",
    "header not json": record(b"{nope", b"x"),
    "header not an object": record(b"[1,2]", b"x"),
    "garbage after a good record": envelope.encode([({"u": ["bob"]}, b"x")]) + b"\x01",
}


@pytest.mark.parametrize("data", MALFORMED.values(), ids=list(MALFORMED))
def test_malformed_envelopes_raise(data: bytes) -> None:
    with pytest.raises(envelope.EnvelopeError):
        list(envelope.decode(data))


async def test_malformed_envelopes_are_counted_and_dropped(rig: Rig) -> None:
    for data in MALFORMED.values():
        rig.router.on_envelope(data)
    assert rig.router.stats["bad_envelopes"] == len(MALFORMED)
    assert rig.router.stats["envelopes_in"] == len(MALFORMED)
    assert rig.controls == [] and rig.local.group_writes == []
    rig.router.on_envelope(envelope.encode([({"u": ["bob"]}, orjson.dumps({"ok": 1}))]))
    assert rig.local.user_writes[-1] == ("bob", b'{"ok":1}', None)  # still serving


# -- controls --------------------------------------------------------------------------------


@pytest.mark.parametrize("ctl", [
    GroupAdd("G"), GroupDel("G"), Close("disconnected by the server"), Close("banned", ban=True),
    Revoke(1700000000.5), Unban(), RoomMute("R", 1700000000.0), RoomUnmute("R"), RoomKick("R"),
])
def test_every_control_crosses_the_wire_unchanged(ctl: Control) -> None:
    assert controls.decode(orjson.loads(orjson.dumps(controls.encode(ctl)))) == ctl


def test_the_wire_form_is_the_one_older_nodes_send() -> None:
    assert controls.encode(GroupAdd("G")) == {"op": "gadd", "g": "G"}
    assert controls.encode(Close("banned", ban=True)) == {"op": "close", "reason": "banned",
                                                          "ban": 1}
    assert controls.encode(Revoke(5.0)) == {"op": "revoke", "before": 5.0}
    assert controls.encode(RoomMute("R", 9.0)) == {"op": "rmute", "room": "R", "until": 9.0}


@pytest.mark.parametrize("raw", [
    None, [], {}, {"op": "nope"}, {"op": "gadd"}, {"op": "gadd", "g": 1}, {"op": "rmute",
    "room": "R"}, {"op": "rmute", "room": "R", "until": True}, {"op": "revoke", "before": "x"},
    {"op": "rkick"},
])
def test_unknown_or_malformed_controls_decode_to_none(raw: object) -> None:
    assert controls.decode(raw) is None


async def test_a_malformed_control_is_dropped_and_counted(rig: Rig) -> None:
    env = envelope.encode([({"u": ["bob"], "c": {"op": "gadd"}}, b""), ({"u": ["bob"]}, b"m")])
    await rig.broker.publish("n1", env)
    assert await settle(lambda: bool(rig.local.user_writes))
    assert rig.controls == [] and rig.router.stats["bad_controls"] == 1


def test_controls_dispatch_by_kind_and_name_the_kinds_without_a_handler() -> None:
    seen: list[tuple[list[str], Control]] = []
    c = Controls()
    c.handle(GroupAdd, lambda users, ctl: seen.append((users, ctl)))
    with pytest.raises(ValueError, match="GroupAdd already has a handler"):
        c.handle(GroupAdd, lambda users, ctl: None)
    assert c.apply(["u"], GroupAdd("G")) is None and seen == [(["u"], GroupAdd("G"))]
    assert c.apply(["u"], GroupDel("G")) is None and len(seen) == 1  # no handler: nothing
    assert "GroupAdd" not in c.missing() and "RoomKick" in c.missing()
