"""The offline store in Redis and the boxes in MongoDB behind it: sync stays
complete when Redis trims, acks or loses entries; dedup falls back to MongoDB."""

from __future__ import annotations

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, uid

KEYS = Keys(RUN_NS)


async def test_resend_after_redis_lost_dedup_keys_finds_original_in_mongo(
        node, connect, redis_client, mongo_db):
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    first = await ca.request("send", to=b, cmid="k", body=1)
    await redis_client.delete(KEYS.dedup(a, "k"))
    again = await ca.request("send", to=b, cmid="k", body=1)
    assert again["mid"] == first["mid"]
    assert await mongo_db.messages.count_documents({"from": a}) == 1


async def test_sync_falls_back_to_mongo_when_offline_store_is_trimmed(make_node, connect, http,
                                                                      redis_client):
    node = await make_node(offline_max=3)
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    mids = [(await ca.request("send", to=c, cmid=f"t{i}", body=i))["mid"] for i in range(7)]
    hc = http(c, node)
    # The zset holds only the newest three; a sync from 0 still sees all seven.
    assert await redis_client.zcard(KEYS.offline(c)) == 3
    page = (await hc.get("/v1/sync", params={"since": 0, "limit": 4})).json()
    assert [m["mid"] for m in page["msgs"]] == mids[:4] and page["more"] is True
    page2 = (await hc.get("/v1/sync", params={"since": page["next"], "limit": 4})).json()
    assert [m["mid"] for m in page2["msgs"]] == mids[4:] and page2["more"] is False


async def test_sync_is_complete_when_redis_lost_the_offline_store(node, connect, http,
                                                                 redis_client):
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    mids = [(await ca.request("send", to=c, cmid=f"l{i}", body=i))["mid"] for i in range(3)]
    await redis_client.delete(KEYS.offline(c), KEYS.offline_meta(c))
    # A message after the loss re-creates the store; it must not claim older ones.
    mids.append((await ca.request("send", to=c, cmid="after", body=3))["mid"])
    page = (await http(c).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == mids
    assert [m["body"] for m in page["msgs"]] == [0, 1, 2, 3]


async def test_recv_ack_and_sync_ack_drop_offline_entries(node, connect, http, redis_client):
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    mids = [(await ca.request("send", to=b, cmid=f"r{i}", body=i))["mid"] for i in range(4)]
    key = KEYS.offline(b)
    assert await redis_client.zcard(key) == 4
    await cb.send_raw(f'{{"op":"recv_ack","mids":[{mids[0]},{mids[1]}]}}')
    await cb.request("ping")  # frames are handled in order; the ack has been applied

    async def two_left() -> bool:
        return await redis_client.zcard(key) == 2

    assert await until(two_left, timeout=5)
    r = await http(b).post("/v1/sync/ack", json={"upto": mids[3]})
    assert r.json() == {"ok": True}
    assert await redis_client.zcard(key) == 0
    # Acked entries are gone from Redis, not from the user's history.
    page = (await http(b).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == mids
