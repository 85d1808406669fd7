"""A 1:1 send that MongoDB stored but whose delivery to the offline stores
failed (Redis cut off between the two) is answered ``unavailable``, and the
node then finishes it by itself once Redis is back: the receiver's sync and
unread count have it although the sender never resends, and a late resend is
acked with the same mid. A device of the receiver online meanwhile gets it pushed.

The node reaches a private redis-server and the run's MongoDB-compatible
store through TCP proxies: the store's proxy holds the insert while the Redis
proxy is cut, so the order is fixed, not timed.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from testkit.poll import until
from tests.conftest import base_settings, uid

pytestmark = pytest.mark.own_redis  # a plain Redis of its own: the cluster pass skips it


async def test_a_send_stored_but_not_delivered_is_finished_by_the_node(
        private, proxy, make_node, connect, http):
    redis = await private("redis")
    to_redis = await proxy(redis.port)
    to_mongo = await proxy(urlsplit(base_settings().mongo_url).port or 27017)
    node = await make_node(redis_url=to_redis.url("redis"), redis_cluster=0,
                           mongo_url=to_mongo.url("mongodb", path="/?directConnection=true"),
                           dep_timeout_s=1.0)
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    cmid = uid("cmid")
    first = await ca.request("send", to=b, cmid=uid("cmid"), body="first")
    assert first["op"] == "ack", first
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in page["msgs"]] == ["first"]  # b's offline store vouches now
    cb = await connect(node, b)  # and a device of b's online: the finished message is pushed

    to_mongo.hold(cmid.encode())  # the insert of this send's message, nothing else
    try:
        sending = asyncio.create_task(ca.request("send", to=b, cmid=cmid, body="held",
                                                 timeout=15))
        # the claim is made in Redis before the insert is sent: once the insert
        # waits at the store's proxy, cutting Redis fails only the delivery
        assert await until(lambda: to_mongo.held, timeout=10)
        to_redis.cut()
    finally:
        to_mongo.release()
    r = await sending
    to_redis.restore()
    assert r["op"] == "error" and r["code"] == "unavailable", r

    async def synced() -> list[dict]:
        page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
        return [m for m in page.get("msgs", []) if m.get("body") == "held"]

    def finished() -> bool:
        return node.metrics.registry.get_sample_value(
            "im_unfinished_sends_total", {"outcome": "finished"}) == 1

    assert await until(finished, timeout=20)  # no resend
    pushed = await cb.next_push("msg")
    assert pushed["body"] == "held" and pushed["from"] == a
    msgs = await synced()
    assert msgs and msgs[0]["from"] == a
    convs = (await http(b, node).get("/v1/conversations")).json()
    assert convs["total_unread"] == 2
    again = await ca.request("send", to=b, cmid=cmid, body="held")
    assert again["op"] == "ack" and again["mid"] == msgs[0]["mid"]
