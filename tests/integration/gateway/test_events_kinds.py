"""Group and presence events on ``{ns}.events`` (real RabbitMQ, 2 nodes):
``offline.msg`` for each offline member of a write-diffusion group, one
``offline.group`` for a read-diffusion group, ``presence.online`` /
``presence.offline`` once per real change whatever the devices and nodes do
in between, and offline announced for the users of a node that died or drained."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import aio_pika
import httpx
import pytest

from testkit.device import Device
from testkit.events import EventQueue, bind_events
from testkit.poll import until
from tests.conftest import RUN_NS, base_settings, settle, token, uid

GRACE = {"presence_grace_s": 1.0, "heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}


@pytest.fixture
async def bound() -> AsyncIterator[Callable[[str], Awaitable[EventQueue]]]:
    """Queues of the test's own bound to ``{RUN_NS}.events`` with a pattern."""
    conn = await aio_pika.connect(base_settings().amqp_url.split(",")[0].strip(), timeout=10)
    channel = await conn.channel()

    async def bind(pattern: str) -> EventQueue:
        return EventQueue(await bind_events(channel, RUN_NS, pattern))

    try:
        yield bind
    finally:
        await conn.close()


async def mine(queue: EventQueue, users: set[str], count: int, timeout: float = 15
               ) -> list[dict]:
    """The events about ``users`` (others' come too: the run's earlier nodes
    died with users on them) once ``count`` of them arrived, or ``timeout``."""
    def of_users() -> list[dict]:
        return [e for e in queue.seen if e.get("user") in users]

    async def enough() -> bool:
        await queue.until(len(queue.seen) + 1, timeout=0.2)
        return len(of_users()) >= count

    await until(enough, timeout=timeout)
    return of_users()


async def test_group_events_offline_members_of_small_groups_one_event_for_big(
        make_node, connect, http, bound):
    offline = await bound("offline.#")
    n1 = await make_node(group_write_diffusion_max=3)
    n2 = await make_node(group_write_diffusion_max=3)
    await settle(n1, n2)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    ca = await connect(n1, alice)
    await connect(n2, carol)  # online on the other node: no event for her
    small = (await http(alice, n1).post("/v1/groups", json={
        "name": "small", "members": [bob, carol]})).json()["group"]
    big = (await http(alice, n1).post("/v1/groups", json={
        "name": "big", "members": [bob, carol, dave, uid("e")]})).json()["group"]
    s1 = await ca.request("group_send", group=small, cmid="s1", body={"text": "hello"})
    s2 = await ca.request("group_send", group=small, cmid="s2", body="again")
    assert (await ca.request("group_send", group=small, cmid="s1", body="x"))["mid"] == s1["mid"]
    # An event's unread is bob's badge when the event is made: the big group's
    # message goes only once the small group's events are out, so it is not in it.
    assert len(await offline.until(2)) == 2
    b1 = await ca.request("group_send", group=big, cmid="b1", body="to many")
    got = await offline.until(3)
    small_events = [e for e in got if e["type"] == "offline.msg"]
    assert [(e["user"], e["mid"]) for e in small_events] == [(bob, s1["mid"]), (bob, s2["mid"])]
    assert all(e["conv"] == f"g:{small}" and e["group"] == small and e["from"] == alice
               for e in small_events)
    assert [e["seq"] for e in small_events] == [s1["seq"], s2["seq"]]
    assert [e["preview"] for e in small_events] == ["hello", "again"]
    assert small_events[-1]["unread"] == 2  # the badge: both of the small group's
    big_events = [e for e in got if e["type"] == "offline.group"]
    assert len(big_events) == 1
    e = big_events[0]
    assert (e["group"], e["mid"], e["seq"], e["from"], e["preview"]) == (
        big, b1["mid"], b1["seq"], alice, "to many")
    assert "user" not in e
    assert len(await offline.until(4, timeout=1.0)) == 3  # none more: no duplicates


async def test_server_group_send_makes_the_same_events(make_node, http, bound):
    offline = await bound("offline.msg")
    node = await make_node(group_write_diffusion_max=3, api_keys="k" * 32)
    alice, bob = uid("a"), uid("b")
    g = (await http(alice, node).post("/v1/groups", json={
        "name": "g", "members": [bob]})).json()["group"]
    async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
        r = await c.post(f"http://127.0.0.1:{node.http_port}/v1/server/group_send",
                         headers={"X-API-Key": "k" * 32},
                         json={"from": uid("sys"), "group": g, "cmid": "c1", "body": "notice"})
    assert r.status_code == 200, r.text
    got = await offline.until(2)
    assert sorted(e["user"] for e in got) == sorted([alice, bob])
    assert {e["mid"] for e in got} == {r.json()["mid"]}


async def test_presence_once_per_change_across_devices_and_nodes(make_node, connect, bound):
    presence = await bound("presence.#")
    n1, n2 = await make_node(**GRACE), await make_node(**GRACE)
    await settle(n1, n2)
    u = uid("p")
    d1 = await connect(n1, u)
    assert [e["type"] for e in await mine(presence, {u}, 1)] == ["presence.online"]
    d2 = await connect(n2, u)  # a second device on another node: no news
    await d1.close()  # one device left
    await d2.close()
    d3 = await connect(n1, u)  # back within the grace: neither offline nor online
    await d3.request("ping")
    await d3.close()
    got = await mine(presence, {u}, 2, timeout=10)
    assert [e["type"] for e in got] == ["presence.online", "presence.offline"]
    assert all(e["user"] == u and isinstance(e["ts"], int) for e in got)
    assert got[1]["ts"] >= got[0]["ts"]
    # Nothing else arrives, whoever checks last.
    assert len(await mine(presence, {u}, 3, timeout=2.5)) == 2
    await connect(n2, u)
    assert [e["type"] for e in await mine(presence, {u}, 3)][-1] == "presence.online"


@pytest.mark.parametrize("end", ["kill", "drain"])
async def test_users_of_a_node_that_dies_or_drains_go_offline(make_node, node_process,
                                                              connect, bound, end):
    presence = await bound("presence.#")
    survivor = await make_node(**GRACE)
    doomed = await node_process(drain_timeout_s=2, **GRACE)
    users = [uid("k") for _ in range(3)]
    for u in users:
        await connect(doomed, u)
    got = await mine(presence, set(users), 3)
    assert sorted(e["user"] for e in got if e["type"] == "presence.online") == sorted(users)
    doomed.kill() if end == "kill" else doomed.term()
    # A beat of the survivor sees the heartbeat lapse (kill: after its ttl;
    # drain: at once), then the grace, then the survivor checks them.
    async def offline_seen() -> list[dict]:
        await survivor.beat()
        return [e for e in await mine(presence, set(users), 6, timeout=0.3)
                if e["type"] == "presence.offline"]

    async def all_offline() -> bool:
        return len(await offline_seen()) >= 3

    await until(all_offline, timeout=20)
    offs = await offline_seen()
    assert sorted(e["user"] for e in offs) == sorted(users)
    assert survivor.metrics.events.labels("presence.offline", "published")._value.get() >= 3


async def test_events_say_which_devices_are_connected(make_node, connect, bound):
    """``presence.*`` count the user's devices and name their platforms;
    with ``IM_OFFLINE_PUSH_PLATFORMS`` a receiver connected on none of them
    (a desktop only) still gets ``offline.msg``, saying what is connected, and
    one with such a device connected gets none."""
    presence, offline = await bound("presence.#"), await bound("offline.#")
    node = await make_node(**GRACE, offline_push_platforms="ios,android")
    u, bob, alice = uid("p"), uid("b"), uid("a")
    d = await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?device=ph&platform=ios", token(u))
    online = (await mine(presence, {u}, 1))[0]
    assert (online["type"], online["devices"], online["platforms"]) == (
        "presence.online", 1, ["ios"])
    await d.close()
    gone = (await mine(presence, {u}, 2, timeout=10))[1]
    assert (gone["type"], gone["devices"], gone["platforms"]) == ("presence.offline", 0, [])
    desk = await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?device=pc&platform=desktop",
                             token(bob))
    ca = await connect(node, alice)
    first = await ca.request("send", to=bob, cmid="m1", body="wake your phone")
    got = (await mine(offline, {bob}, 1))[0]
    assert (got["mid"], got["platforms"]) == (first["mid"], ["desktop"])
    phone = await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?device=ph&platform=android",
                              token(bob))
    await phone.request("ping")
    await ca.request("send", to=bob, cmid="m2", body="the phone is here")
    assert len(await mine(offline, {bob}, 2, timeout=2.5)) == 1  # none for the second
    for x in (desk, phone):
        await x.close()
