"""A dependency that is down gives ``unavailable`` and no ack; service resumes after.

Each test owns a private server (a real redis-server or SecantusDB on a free
port), kills it with SIGKILL in the middle, and starts it again.
"""

from __future__ import annotations

import asyncio

from tests.conftest import uid


async def send_until_ack(client, to, cmid, body, tries=40):
    for _ in range(tries):
        r = await client.request("send", to=to, cmid=cmid, body=body, timeout=15)
        if r["op"] == "ack":
            return r
        assert r["code"] == "unavailable"
        await asyncio.sleep(0.25)
    raise AssertionError("never acked after the dependency came back")


async def test_mongo_down_gives_unavailable_then_recovers(private, make_node, connect, http):
    mongo = await private("mongo")
    node = await make_node(mongo_url=mongo.url, dep_timeout_s=1.0)
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    first = await ca.request("send", to=b, cmid="before", body=0)
    assert first["op"] == "ack"

    await mongo.kill()
    r = await ca.request("send", to=b, cmid="during", body=1, timeout=15)
    assert r["op"] == "error" and r["code"] == "unavailable" and "mid" not in r
    assert (await http(b, node).get("/healthz")).status_code == 503

    await mongo.start()  # same port, same data directory
    again = await send_until_ack(ca, b, "during", 1)
    assert again["mid"] > first["mid"]
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in page["msgs"]] == [0, 1]
    assert (await http(b, node).get("/v1/conversations")).json()["total_unread"] == 2


async def test_redis_down_gives_unavailable_then_recovers(private, make_node, connect, http):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, dep_timeout_s=1.0)
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    first = await ca.request("send", to=b, cmid="before", body=0)
    assert first["op"] == "ack"

    await redis.kill()
    r = await ca.request("send", to=b, cmid="during", body=1, timeout=15)
    assert r["op"] == "error" and r["code"] == "unavailable"
    # Sync still answers from the MongoDB boxes while Redis is down.
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in page["msgs"]] == [0]
    conv = await http(b, node).get("/v1/conversations")
    assert conv.status_code == 503 and conv.json()["error"]["code"] == "unavailable"

    await redis.start()  # empty: everything Redis held is gone
    again = await send_until_ack(ca, b, "during", 1)
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == [first["mid"], again["mid"]]
