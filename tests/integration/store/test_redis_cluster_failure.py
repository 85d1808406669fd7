"""A Redis Cluster master killed: sends answer ``unavailable`` (never
``internal``, never a false ack), ``/healthz`` says 503, and after the master
is back everything works. The cluster is private to this test (free ports,
scripts/redis_cluster.sh), so the run's Redis topology does not matter: it is
marked ``own_redis`` and runs in CI's single-Redis pass only."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from redis.crc import key_slot

from testkit.clusters import LocalRedisCluster
from testkit.poll import until
from tests.conftest import RUN_NS, uid
from tests.integration.store.test_dependency_failures import until_acked


@pytest.fixture
async def cluster() -> AsyncIterator[LocalRedisCluster]:
    c = LocalRedisCluster()  # free ports
    try:
        yield await c.start()
    finally:
        await c.stop()


@pytest.mark.own_redis
async def test_a_master_killed_gives_unavailable_then_recovers(cluster, make_node, connect,
                                                              http):
    node = await make_node(redis_url=cluster.seeds, redis_cluster=1, dep_timeout_s=1.0)
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    first = await ca.request("send", to=b, cmid="before", body=0)
    assert first["op"] == "ack"
    hb = http(b, node)
    assert (await hb.get("/healthz")).status_code == 200

    # Kill a master that does not hold b's keys: a master restarted without
    # replicas or persistence comes back empty (a flush of its slots, whose
    # effect on unread docs/reference/chat.md states), and b's unread must stay exact.
    victim = next(n for n in (1, 2, 3) if not cluster.owns(n, key_slot(f"{{{b}}}".encode())))
    await cluster.stop_node(victim)
    # /healthz reads every primary: 503 as soon as one does not answer.
    assert (await hb.get("/healthz")).status_code == 503
    alive = next(n for n in (1, 2, 3) if n != victim)
    # Once the others mark it failed, no key of the cluster is served.
    assert await until(lambda: cluster.state(alive), timeout=20) and \
        await until(lambda: _is(cluster.state(alive), "fail"), timeout=20)
    for i in range(5):
        r = await ca.request("send", to=b, cmid=f"during{i}", body=i + 1, timeout=15)
        assert r["op"] == "error" and r["code"] == "unavailable" and "mid" not in r, r
    assert (await hb.get("/healthz")).status_code == 503

    await cluster.start_node(victim)
    assert await until(lambda: _status(hb, 200), timeout=30)
    for i in range(5):
        again = await until_acked(ca, "send", to=b, cmid=f"during{i}", body=i + 1)
        assert again["mid"] > first["mid"]
    page = (await hb.get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in page["msgs"]] == [0, 1, 2, 3, 4, 5]
    assert (await hb.get("/v1/conversations")).json()["total_unread"] == 6
    # No push for a refused send. Pushes are at-least-once: after the master came
    # back empty the node pushes again what came since the loss (by mid: once each).
    pushed = {f["mid"]: f["body"] for f in cb.drain_pushes() if f.get("op") == "msg"}
    assert sorted(pushed.values()) == list(range(6))


async def _is(state, want: str) -> bool:
    return (await state) == want


async def _status(client, code: int) -> bool:
    return (await client.get("/healthz")).status_code == code


@pytest.mark.own_redis
async def test_routes_lost_with_a_master_are_written_again_and_pushes_reach_the_device(
        cluster, make_node, connect):
    """The master holding a device's route restarts empty while the device stays
    connected. The lease lives on another master, so only the node's canary on
    that master tells it: its next beat rewrites its routes and replays, and a
    1:1 message from another node reaches the device by push."""
    n1 = await make_node(redis_url=cluster.seeds, redis_cluster=1, dep_timeout_s=1.0)
    n2 = await make_node(redis_url=cluster.seeds, redis_cluster=1, dep_timeout_s=1.0,
                         heartbeat_s=3600.0)  # beats when the test says (n2.beat())
    # b's keys on another master than n2's lease (whose loss the lease would tell).
    number = int(n2.name[1:].split("-")[0])
    lease = key_slot(f"{RUN_NS}:nodeid:{number}".encode())
    a, b = uid("a"), uid("b")
    while any(cluster.owns(n, lease) and cluster.owns(n, key_slot(f"{{{b}}}".encode()))
              for n in (1, 2, 3)):
        b = uid("b")
    ca, cb = await connect(n1, a), await connect(n2, b)
    first = await until_acked(ca, "send", to=b, cmid="before", body=0)
    assert (await cb.next_push("msg"))["mid"] == first["mid"]  # routed: b's route is written

    victim = next(n for n in (1, 2, 3) if cluster.owns(n, key_slot(f"{{{b}}}".encode())))
    await cluster.stop_node(victim)
    await cluster.start_node(victim)  # empty: b's route is gone
    ack = await until_acked(ca, "send", to=b, cmid="after", body=1)

    await n2.beat()  # its canary on that master is gone: routes again, then the replay
    push = await cb.next_push("msg", timeout=10)
    assert (push["mid"], push["body"]) == (ack["mid"], 1)
    again = await until_acked(ca, "send", to=b, cmid="later", body=2)
    assert (await cb.next_push("msg", timeout=10))["mid"] == again["mid"]  # routed again
