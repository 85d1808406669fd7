"""A device that connects while Redis is down is never left connected and deaf
(docs/protocol.md, "Room delivery under faults"): its route and its groups are
registered once Redis is back, or, past ``IM_REGISTER_GRACE_S``, it is closed
with 1012 so that it reconnects.

Each test owns a private redis-server on a free port, kills it with SIGKILL
and starts it again (empty: everything it held is gone).
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from testkit.poll import until
from tests.conftest import RUN_NS, uid

pytestmark = pytest.mark.own_redis  # a plain Redis of its own: the cluster pass skips it


async def _group(http, node, owner: str, member: str) -> str:
    r = await http(owner, node).post("/v1/groups", json={"name": "g", "members": [member]})
    assert r.status_code == 200, r.text
    return str(r.json()["group"])


async def _acked(client, op: str, **fields):
    async def acked():
        r = await client.request(op, timeout=15, **fields)
        assert r["op"] == "ack" or r["code"] == "unavailable", r
        return r if r["op"] == "ack" else None

    r = await until(acked, timeout=30, every=0.25)
    assert r is not None, f"{op} never acked after Redis came back"
    return r


async def test_a_device_connected_while_redis_was_down_gets_group_pushes_after(
        private, make_node, connect, http):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
    owner, member = uid("o"), uid("m")
    group = await _group(http, node, owner, member)
    sender = await connect(node, owner)

    await redis.kill()
    late = await connect(node, member)  # admitted without the Redis checks, not registered
    assert await until(lambda: node.app.registry.unfinished == 1, timeout=15)

    await redis.start()  # empty: the route and the group cache are rebuilt
    assert await until(lambda: node.app.registry.unfinished == 0, timeout=15)
    ack = await _acked(sender, "group_send", group=group, cmid="after", body="hi")
    push = await late.next_push("group_msg", timeout=10)
    assert (push["mid"], push["body"]) == (ack["mid"], "hi")
    assert not late.closed


async def test_the_route_of_such_a_device_is_written_once_redis_is_back(
        private, make_node, connect):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
    user = uid("u")
    await redis.kill()
    await connect(node, user)
    assert await until(lambda: node.app.registry.unfinished == 1, timeout=15)
    await redis.start()
    r = aioredis.from_url(redis.url)
    try:
        async def routed() -> bool:
            return bool(await r.hgetall(f"{RUN_NS}:rt:{{{user}}}"))

        # Other nodes find the device through this route: without it, 1:1 pushes
        # from users on other nodes would never reach it.
        assert await until(routed, timeout=15)
    finally:
        await r.aclose()


async def test_a_device_whose_registration_cannot_complete_is_closed_with_1012(
        private, make_node, connect):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0,
                           register_grace_s=2.0)
    await redis.kill()
    device = await connect(node, uid("u"))
    assert await device.wait_closed(timeout=20) == 1012
    assert device.close_reason == "registration incomplete: reconnect"
    assert node.app.registry.unfinished == 0


async def test_a_push_sent_while_redis_had_lost_the_routes_comes_once_they_are_back(
        private, make_node, connect, http):
    """Redis restarted empty: every route is gone until each node's next beat
    finds its lease gone and writes them again. A 1:1 message acked in between
    reaches no other node by push; the node replays it to its devices then."""
    redis = await private("redis")
    # The receiver's node beats only when the test says (node.beat()).
    sender_node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
    receiver_node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0,
                                    heartbeat_s=3600.0)
    alice, bob = uid("a"), uid("b")
    group = await _group(http, sender_node, alice, bob)
    sender = await connect(sender_node, alice)
    receiver = await connect(receiver_node, bob)
    route = f"{RUN_NS}:rt:{{{bob}}}"

    async def routed() -> bool:
        r = aioredis.from_url(redis.url)
        try:
            return bool(await r.hgetall(route))
        finally:
            await r.aclose()

    # Bob registered in full before the loss (route written, groups loaded: the
    # last step), else the registry's own repair would replay to him, not the beat.
    assert await until(routed, timeout=10)
    assert await until(lambda: group in receiver_node.app.group_hub.members, timeout=10)
    assert receiver_node.app.registry.unfinished == 0
    await redis.kill()
    await redis.start()  # empty: bob's route is gone
    ack = await _acked(sender, "send", to=bob, cmid="while-unrouted", body="hi")
    assert not await routed()  # no route: no push went out to bob's node

    await receiver_node.beat()  # finds its lease gone: routes again, then the replay
    push = await receiver.next_push("msg", timeout=10)
    assert (push["mid"], push["body"]) == (ack["mid"], "hi")


async def test_routes_purged_while_a_nodes_heartbeat_had_lapsed_come_back_with_the_pushes(
        private, make_node, connect):
    """Redis out of reach longer than the heartbeat's ttl: the first node to
    read the heartbeats again takes the other for dead, drops its pushes and
    purges its routes, until it reads that node's next beat. The node whose
    heartbeat lapsed writes its routes again once the others have read it,
    then replays what came meanwhile. Both nodes beat when the test says."""
    redis = await private("redis")
    opts = dict(redis_url=redis.url, redis_cluster=0, dep_timeout_s=0.5,
                heartbeat_s=3600.0, heartbeat_ttl_s=1.0)
    sender_node = await make_node(**opts)
    receiver_node = await make_node(**opts)
    alice, bob = uid("a"), uid("b")
    sender = await connect(sender_node, alice)
    receiver = await connect(receiver_node, bob)
    route = f"{RUN_NS}:rt:{{{bob}}}"
    r = aioredis.from_url(redis.url)
    try:
        assert await until(lambda: r.exists(route), timeout=10)
        await receiver_node.beat()
        redis.pause()
        await receiver_node.beat()  # fails: Redis does not answer
        redis.resume()
        lapsed_at = receiver_node._beat_ok_at + 1.0

        async def lapsed() -> bool:
            return time.time() > lapsed_at + 0.1

        assert await until(lapsed, timeout=5)
        await sender_node.beat()  # reads bob's node lapsed
        ack = await _acked(sender, "send", to=bob, cmid="while-lapsed", body="hi")
        async def purged() -> bool:
            return await r.exists(route) == 0

        assert await until(purged, timeout=5)  # taken for dead

        await receiver_node.beat()  # late: its heartbeat had lapsed
        await sender_node.beat()  # the sender reads it alive again
        push = await receiver.next_push("msg", timeout=10)  # the replay
        assert (push["mid"], push["body"]) == (ack["mid"], "hi")
        assert await until(lambda: r.exists(route), timeout=5)
        later = await _acked(sender, "send", to=bob, cmid="after", body="again")
        push = await receiver.next_push("msg", timeout=10)
        assert push["mid"] == later["mid"]
    finally:
        await r.aclose()
