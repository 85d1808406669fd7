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
    first = await ca.until_taken("send", to=b, cmid="k", body=1)
    await redis_client.delete(KEYS.dedup(a, "k"))
    again = await ca.until_taken("send", to=b, cmid="k", body=1)
    assert again["mid"] == first["mid"]
    assert await mongo_db.messages.count_documents({"from": a}) == 1


async def test_sync_falls_back_to_mongo_when_offline_store_is_trimmed(make_node, connect, http,
                                                                      redis_client):
    node = await make_node(offline_max=3)
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    mids = [(await ca.until_taken("send", to=c, cmid=f"t{i}", body=i))["mid"] for i in range(7)]
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
    mids = [(await ca.until_taken("send", to=c, cmid=f"l{i}", body=i))["mid"] for i in range(3)]
    await redis_client.delete(KEYS.offline(c), KEYS.offline_meta(c))
    # A message after the loss re-creates the store; it must not claim older ones.
    mids.append((await ca.until_taken("send", to=c, cmid="after", body=3))["mid"])
    page = (await http(c).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == mids
    assert [m["body"] for m in page["msgs"]] == [0, 1, 2, 3]


async def test_recv_ack_and_sync_ack_drop_offline_entries(node, connect, http, redis_client):
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    mids = [(await ca.until_taken("send", to=b, cmid=f"r{i}", body=i))["mid"] for i in range(4)]
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


def _synced(node, source: str) -> float:
    got = node.metrics.registry.get_sample_value("im_sync_cursor_age_seconds_count",
                                                 {"source": source})
    return got or 0.0


async def test_after_a_redis_loss_the_first_sync_from_mongodb_lets_redis_answer_the_next(
        node, connect, http, redis_client):
    """After a Redis loss the offline store vouches only for what came since,
    and every client's cursor is older: the first sync that read the boxes puts
    its page in the store, the next sync from there is answered by Redis, the
    same, and a message delivered meanwhile is there once."""
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    mids = [(await ca.until_taken("send", to=c, cmid=f"l{i}", body=i))["mid"] for i in range(3)]
    await redis_client.delete(KEYS.offline(c), KEYS.offline_meta(c))
    mids.append((await ca.until_taken("send", to=c, cmid="after", body=3))["mid"])
    hc = http(c, node)
    from_mongo = _synced(node, "mongo")
    first = (await hc.get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in first["msgs"]] == mids
    assert _synced(node, "mongo") == from_mongo + 1
    assert await redis_client.hget(KEYS.offline_meta(c), "floor") == b"0"
    assert node.metrics.registry.get_sample_value("im_offline_fills_total",
                                                  {"outcome": "filled"}) == 1

    mids.append((await ca.until_taken("send", to=c, cmid="later", body=4))["mid"])
    from_redis = _synced(node, "redis")
    second = (await hc.get("/v1/sync", params={"since": 0})).json()
    assert _synced(node, "redis") == from_redis + 1 and _synced(node, "mongo") == from_mongo + 1
    assert second["msgs"][:4] == first["msgs"]
    assert [m["mid"] for m in second["msgs"]] == mids
    assert [m["body"] for m in second["msgs"]] == [0, 1, 2, 3, 4]


async def test_a_fill_gives_way_to_the_delivery_it_came_before(node, redis_client):
    """A message stored in MongoDB and read by a sync before its delivery
    reached Redis: the delivery still counts it (unread, conversation list)
    and the store holds it once."""
    from store.records import Delivery

    offline = node.stores.offline
    a, c = uid("a"), uid("c")
    mid = node.app.chat.mids.next()
    frame = b'{"op":"msg","mid":%d,"from":"%s","body":"x"}' % (mid, a.encode())
    page = await offline.page(c, 0, 10)
    assert not page.complete
    assert await offline.fill(c, 0, page.version, [(mid, frame)], whole=True)
    await offline.deliver([Delivery(c, a, mid, frame, True)], [])
    members = await redis_client.zrange(KEYS.offline(c), 0, -1)
    assert members == [frame]
    total, rows = await offline.conversations(c, 10)
    assert total == 1 and [(r.conv, r.mid, r.unread) for r in rows] == [(a, mid, 1)]


async def test_a_fill_read_before_a_recall_writes_nothing(node, connect, http, redis_client):
    """What a sync read from MongoDB before a recall is not put back as it
    was; an ack between the two reads does not stop the fill (clients ack
    every push), and a recalled message keeps its tombstone."""
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    mids = [(await ca.until_taken("send", to=c, cmid=f"f{i}", body=i))["mid"] for i in range(3)]
    offline = node.stores.offline
    frames = await redis_client.zrange(KEYS.offline(c), 0, -1)
    rows = list(zip(mids, frames, strict=True))
    # A store that vouches for less than the page: the floor above its start.
    await redis_client.hset(KEYS.offline_meta(c), "floor", mids[0])
    before = await offline.page(c, 0, 10)
    assert not before.complete
    await ca.until_taken("recall", mid=mids[2])
    assert not await offline.fill(c, 0, before.version, rows, whole=True)
    assert await redis_client.hget(KEYS.offline_meta(c), "floor") == str(mids[0]).encode()
    before = await offline.page(c, 0, 10)
    await offline.ack(c, upto=mids[1])
    assert await offline.fill(c, 0, before.version, rows, whole=True)
    assert await redis_client.hget(KEYS.offline_meta(c), "floor") == b"0"
    at_recalled = await redis_client.zrangebyscore(KEYS.offline(c), mids[2], mids[2])
    assert len(at_recalled) == 1 and b"recalled" in at_recalled[0]
    page = (await http(c, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == mids
    assert page["msgs"][2].get("recalled") is True
