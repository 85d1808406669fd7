"""A dependency that is down gives ``unavailable`` and no ack; service resumes after.

Each test owns a private server (a real redis-server or SecantusDB on a free
port), kills it with SIGKILL in the middle, and starts it again.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest
from pymongo import AsyncMongoClient

from gateway.node import StartupError
from testkit.poll import until
from tests.conftest import RUN_NS, base_settings, uid


async def until_acked(client, op, **fields):
    """Resend ``op`` (same cmid) until acked; meanwhile only ``unavailable``."""
    async def acked():
        r = await client.request(op, timeout=15, **fields)
        assert r["op"] == "ack" or r["code"] == "unavailable", r
        return r if r["op"] == "ack" else None

    r = await until(acked, timeout=30, every=0.25)
    assert r is not None, "never acked after the dependency came back"
    return r


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
    again = await until_acked(ca, "send", to=b, cmid="during", body=1)
    assert again["mid"] > first["mid"]
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in page["msgs"]] == [0, 1]
    assert (await http(b, node).get("/v1/conversations")).json()["total_unread"] == 2


@pytest.mark.own_redis  # a plain Redis of its own: the Redis Cluster pass skips it
async def test_redis_down_gives_unavailable_then_recovers(private, make_node, connect, http):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
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
    # ... admitted without the ban/revocation check, which needs Redis (counted).
    assert node.metrics.sanctions_unchecked._value.get() >= 1
    conv = await http(b, node).get("/v1/conversations")
    assert conv.status_code == 503 and conv.json()["error"]["code"] == "unavailable"

    await redis.start()  # empty: everything Redis held is gone
    again = await until_acked(ca, "send", to=b, cmid="during", body=1)
    page = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == [first["mid"], again["mid"]]


async def test_group_send_with_mongo_down_then_back_keeps_seqs_whole(private, make_node,
                                                                    connect, http):
    mongo = await private("mongo")
    node = await make_node(mongo_url=mongo.url, dep_timeout_s=1.0)
    owner, m = uid("o"), uid("m")
    r = await http(owner, node).post("/v1/groups", json={"name": "g", "members": [m]})
    g = r.json()["group"]
    co = await connect(node, owner)
    assert (await co.request("group_send", group=g, cmid="a", body=0))["seq"] == 1

    await mongo.kill()
    r = await co.request("group_send", group=g, cmid="b", body=1, timeout=15)
    assert r["op"] == "error" and r["code"] == "unavailable" and "seq" not in r

    await mongo.start()
    r = await until_acked(co, "group_send", group=g, cmid="b", body=1)
    again = await co.request("group_send", group=g, cmid="b", body=1)
    assert (again["mid"], again["seq"]) == (r["mid"], r["seq"])  # acked once
    page = (await http(m, node).get("/v1/sync")).json()["msgs"]
    assert [x["body"] for x in page] == [0, 1]
    # Every seq up to the group's counter holds the message or a tombstone: no hole.
    client: AsyncMongoClient = AsyncMongoClient(mongo.url)
    try:
        docs = [d async for d in client[RUN_NS].group_msgs.find({"g": g}).sort("seq", 1)]
        group_doc = await client[RUN_NS].groups.find_one({"_id": g})
        assert group_doc is not None
        counter = group_doc["seq"]
    finally:
        await client.close()
    assert [d["seq"] for d in docs] == list(range(1, counter + 1))
    assert [d["seq"] for d in docs if not d.get("dead")] == [1, r["seq"]]


@pytest.mark.own_redis  # a plain Redis of its own: the Redis Cluster pass skips it
async def test_room_send_without_redis_is_never_acked_and_a_new_epoch_follows(
        private, make_node, connect):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
    room = uid("room")
    sender, member = await connect(node, uid("a")), await connect(node, uid("b"))
    await sender.request("join", room=room)
    epoch = (await member.request("join", room=room))["epoch"]
    assert (await sender.request("room_send", room=room, body=0))["op"] == "ok"
    first = (await member.next_push("room_msgs"))
    assert epoch is None and first["msgs"][0]["pos"] == 1

    await redis.kill()
    r = await sender.request("room_send", room=room, body=1, timeout=15)
    assert r["op"] == "error" and r["code"] == "unavailable"  # no position, no ok
    await member.request("ping")
    assert [f for f in member.drain_pushes() if f.get("op") == "room_msgs"] == []

    await redis.start()  # empty: the room's position and history are gone

    async def sent() -> bool:
        r = await sender.request("room_send", room=room, body=2, timeout=15)
        assert r["op"] == "ok" or r["code"] == "unavailable", r
        return r["op"] == "ok"

    assert await until(sent, timeout=30, every=0.25)
    frame = await member.next_push("room_msgs")
    assert frame["epoch"] != first["epoch"] and frame["msgs"][0]["pos"] == 1

    async def rejoined() -> dict | None:
        got = await member.request("join", room=room, since={"epoch": first["epoch"], "pos": 1})
        assert got["op"] == "joined" or got["code"] == "unavailable", got
        return got if got["op"] == "joined" else None

    got = await until(rejoined, timeout=30, every=0.25)
    assert got["recovered"] is False and [m["body"] for m in got["msgs"]] == [2]


async def test_a_node_waits_for_a_store_that_is_late_then_gives_up_with_one_line(
        make_node, proxy, caplog):
    late = await proxy(urlsplit(base_settings().mongo_url).port or 27017)
    late.cut()  # every connection refused, as a store still starting
    url = late.url("mongodb", path="")
    starting = asyncio.create_task(make_node(mongo_url=url, dep_timeout_s=0.5,
                                             startup_wait_s=20))
    await until(lambda: "waiting for MongoDB" in caplog.text, timeout=10)
    assert not starting.done()
    late.restore()
    node = await asyncio.wait_for(starting, 20)
    assert await node.healthy()

    with pytest.raises(StartupError) as stopped:
        await make_node(mongo_url="mongodb://127.0.0.1:1", dep_timeout_s=0.3, startup_wait_s=1)
    assert str(stopped.value) == "cannot reach MongoDB at mongodb://127.0.0.1:1"


@pytest.mark.own_redis
async def test_while_redis_is_down_sync_counts_reactions_from_mongodb(private, make_node,
                                                                      connect, http):
    redis = await private("redis")
    node = await make_node(redis_url=redis.url, redis_cluster=0, dep_timeout_s=1.0)
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    mid = (await ca.request("send", to=b, cmid="c1", body="hi"))["mid"]
    assert (await cb.request("react", mid=mid, emoji="+1", on=True))["op"] == "ok"
    assert (await ca.request("react", mid=mid, emoji="+1", on=True))["op"] == "ok"
    await redis.kill()
    # The counts live in Redis; MongoDB has who reacted: the sync (from the
    # boxes) counts them there, and a sync asking for changes keeps its cursor.
    page = (await http(b, node).get("/v1/sync", params={"since": 0, "changes": 1})).json()
    assert [(m["mid"], m.get("reactions")) for m in page["msgs"]] == [(mid, {"+1": 2})]
    assert page["next"] == 0
    refused = await cb.request("react", mid=mid, emoji="+1", on=False, timeout=15)
    assert refused["code"] == "unavailable"
