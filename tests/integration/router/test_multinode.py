"""Several nodes in one test, RabbitMQ between them (real broker, real Redis)."""

from __future__ import annotations

import time

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, settle, uid

KEYS = Keys(RUN_NS)


async def three(make_node):
    return [await make_node() for _ in range(3)]


async def test_users_on_different_nodes_chat_and_bystander_node_gets_nothing(
        make_node, connect):
    n1, n2, n3 = await three(make_node)
    await settle(n1, n2, n3)
    a, b, c = uid("a"), uid("b"), uid("c")
    ca, cb, _ = await connect(n1, a), await connect(n2, b), await connect(n3, c)
    had: dict[int, set[str]] = {id(ca): set(), id(cb): set()}

    async def next_new(dev):
        """The next push of a message not pushed to ``dev`` before: a push may come
        again (clients drop repeats by mid), as when a starved node rewrote its
        routes, but a new one must be the message just acked."""
        while (mid := (await dev.next_push("msg"))["mid"]) in had[id(dev)]:
            pass
        had[id(dev)].add(mid)
        return mid

    for i in range(5):
        ack = await ca.request("send", to=b, cmid=f"ab{i}", body=i)
        assert await next_new(cb) == ack["mid"]
        ack = await cb.request("send", to=a, cmid=f"ba{i}", body=i)
        assert await next_new(ca) == ack["mid"]
    assert n3.app.router.stats["envelopes_in"] == 0  # holds none of a's or b's devices
    assert n1.app.router.stats["envelopes_in"] >= 1 and n2.app.router.stats["envelopes_in"] >= 1


async def test_multi_device_across_nodes(make_node, connect):
    n1, n2, n3 = await three(make_node)
    await settle(n1, n2, n3)
    a, b = uid("a"), uid("b")
    a1, a3, b2, b3 = (await connect(n1, a), await connect(n3, a), await connect(n2, b),
                      await connect(n3, b))
    ack = await a1.request("send", to=b, cmid="x", body="to b")
    for dev in (a3, b2, b3):
        assert (await dev.next_push("msg"))["mid"] == ack["mid"]
    ack2 = await b2.request("send", to=a, cmid="y", body="to a")
    for dev in (a1, a3, b3):
        assert (await dev.next_push("msg"))["mid"] == ack2["mid"]
    await a1.request("ping")
    assert a1.pushes.empty()  # the sending device gets no copy of its own message


async def test_user_moving_between_nodes(make_node, connect):
    n1, n2, n3 = await three(make_node)
    await settle(n1, n2, n3)
    a, b = uid("a"), uid("b")
    ca, cb = await connect(n1, a), await connect(n2, b)
    await ca.request("send", to=b, cmid="1", body=1)
    await cb.next_push("msg")
    await cb.close()
    cb3 = await connect(n3, b)
    w = uid("w")
    cw = await connect(n2, w)  # a witness left on n2
    before = n2.app.router.stats["envelopes_in"]
    ack = await ca.request("send", to=b, cmid="2", body=2)
    assert (await cb3.next_push("msg"))["mid"] == ack["mid"]
    # RabbitMQ keeps n1's envelopes to n2's queue in order: once the witness has
    # its message, anything sent to n2 before it has arrived too.
    ack = await ca.request("send", to=w, cmid="3", body=3)
    assert (await cw.next_push("msg"))["mid"] == ack["mid"]
    assert n2.app.router.stats["envelopes_in"] == before + 1  # b left n2: only the witness's


async def test_routes_to_a_dead_node_are_ignored_and_purged(make_node, connect, redis_client):
    n1 = await make_node()
    a, b = uid("a"), uid("b")
    ca = await connect(n1, a)
    key = KEYS.routes(b)
    await redis_client.hset(key, "n9-dead00/1", "n9-dead00")
    # Its heartbeat lapsed a while ago.
    await redis_client.zadd(KEYS.nodes(), {"n9-dead00": time.time() - 30})
    await n1.beat()
    await ca.request("send", to=b, cmid="d", body=1)

    async def purged() -> bool:
        return not await redis_client.hexists(key, "n9-dead00/1")

    assert await until(purged, timeout=5)
    # Nothing went to a node (a's presence went to its key, watched by nobody).
    assert n1.app.router.stats["node_envelopes_out"] == 0


async def test_node_ids_are_leased_uniquely(make_node):
    nodes = [await make_node() for _ in range(4)]
    numbers = {n.lease.number for n in nodes}
    assert len(numbers) == 4
    assert len({n.name for n in nodes}) == 4


async def test_node_newer_than_our_view_is_routed_to(make_node, connect):
    n1, n2 = await make_node(), await make_node()
    n1.app.router.set_live({})  # n1 has not yet seen n2's heartbeat
    a, b = uid("a"), uid("b")
    ca, cb = await connect(n1, a), await connect(n2, b)
    ack = await ca.request("send", to=b, cmid="new", body=1)
    assert (await cb.next_push("msg"))["mid"] == ack["mid"]


async def test_a_busy_loop_is_not_a_lapsed_heartbeat(make_node, caplog):
    """The keeper's thread writes the heartbeat while the node's loop is busy;
    the loop applies those beats late, all at once. That is no lapse: other
    nodes saw the heartbeat on time, so nothing is rewritten or replayed (a
    replay pushed again, out of order, what devices had already had)."""
    node = await make_node(heartbeat_s=0.3, heartbeat_ttl_s=1.0)
    await node.beat()
    time.sleep(2.0)  # noqa: ASYNC251 - the busy loop itself; the keeper beats every 0.3 s meanwhile
    # The thread's beats queued for the loop are applied now.
    assert await until(lambda: node._beat_ok_at > time.time() - 0.5, timeout=5)
    assert node._routes_lost_after is None
    assert not [r for r in caplog.records if "heartbeat lapsed" in r.getMessage()]
