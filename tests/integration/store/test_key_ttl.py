"""Every Redis key a 1:1 send writes for a user expires, and what a user's
keys answered is answered again, rebuilt from MongoDB, once they expired."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any

from core.errors import Unavailable
from store.keys import Keys
from testkit.poll import bounded, until
from tests.conftest import RUN_NS, uid

KEYS = Keys(RUN_NS)
# Sends in flight at once. More only queue in the test store (one process,
# much slower than mongod) and, on CI's loaded machine, time out there and are
# resent, which is more work for a store that is behind: 64 at once kept it
# behind past this test, and the tests after it met its timeouts.
SENDS_AT_ONCE = 8


def user_keys(user: str) -> list[str]:
    k = KEYS
    return [k.offline(user), k.offline_meta(user), k.inbox_meta(user), k.unread_mids(user),
            k.convs(user), k.conv_last(user)]


async def scan(redis: Any, pattern: str) -> list[bytes]:
    return [key async for key in redis.scan_iter(match=pattern, count=1000)]


async def acked_send(client: Any, to: str, cmid: str, body: str) -> dict[str, Any]:
    """Sent, and resent with the same cmid while the store is busy (as clients do)."""
    for _ in range(10):
        reply: dict[str, Any] = await client.request("send", to=to, cmid=cmid, body=body)
        if reply["op"] == "ack":
            return reply
        assert reply.get("code") == "unavailable", reply
        await asyncio.sleep(0.5)
    raise AssertionError(f"never acked: {reply}")


async def service_send(chat: Any, sender: str, to: str, cmid: str, body: bytes) -> None:
    """``ChatService.send``, again with the same cmid while the store answers
    ``unavailable`` (as clients do: on CI's loaded machine the test store can
    answer past the node's timeout; the keys are the point)."""
    for attempt in range(10):
        try:
            await chat.send(sender, to, cmid, body)
            return
        except Unavailable:
            if attempt == 9:
                raise
            await asyncio.sleep(0.5)


# The test store's timeout for these tests' nodes: under CI's load the one-process
# test store answered 10,000 sends' writes past the usual 2 s, and the calls after
# them too, once behind. These tests are about the keys, not the store's speed.
STORE_TIMEOUT_S = 30.0


async def test_sends_to_ten_thousand_invented_ids_leave_no_key_without_a_ttl(
        make_node, connect, http, redis_client):
    """A sender who makes up recipients can fill Redis only for a while: every
    key written for them (and for the sender) has a TTL."""
    node = await make_node(dep_timeout_s=STORE_TIMEOUT_S)
    tag = uid("ttl")
    sender = f"{tag}-s"
    targets = [f"{tag}-{i}" for i in range(10_000)]
    chat = node.app.chat
    started = time.monotonic()
    await bounded((service_send(chat, sender, t, f"c{i}", b'"hi"')
                   for i, t in enumerate(targets)), SENDS_AT_ONCE)
    # And what a client does next: list, read, recall, delete (each writes keys).
    ca = await connect(node, sender)
    reply = await ca.request("send", to=targets[0], cmid="again", body="x")
    await http(targets[0], node).ok("POST", f"/v1/conversations/{sender}/read",
                              json={"mid": reply["mid"]})
    await ca.request("recall", mid=reply["mid"])
    await http(sender, node).ok("GET", "/v1/conversations")
    await http(targets[1], node).ok("GET", "/v1/conversations")
    await http(sender, node).ok("POST", f"/v1/follow/{targets[2]}")  # the following set
    await http(targets[3], node).ok("GET", "/v1/timeline")
    elapsed = time.monotonic() - started

    found = await scan(redis_client, f"{RUN_NS}:*{{{tag}-*")
    assert KEYS.following(sender).encode() in found
    assert len(found) >= 2 * len(targets)  # at least the offline zset and floor of each
    pipe = redis_client.pipeline(transaction=False)
    for key in found:
        pipe.ttl(key)
    ttls = await pipe.execute()
    forever = [k.decode() for k, t in zip(found, ttls, strict=True) if t == -1]
    assert forever == [], f"{len(forever)} keys without a TTL, e.g. {forever[:5]}"
    print(f"10,000 sends to invented ids and the calls after them: {elapsed:.1f} s")


async def conversations(u: Any) -> dict[str, Any]:
    return await u.ok("GET", "/v1/conversations", params={"limit": 50})


async def answers(u: Any, peers: list[str]) -> dict[str, Any]:
    """What a user is told: conversations (unread included), sync, history."""
    msgs, _ = await u.sync_all(0)
    history = {p: (await u.ok("GET", f"/v1/history/{p}", params={"limit": 100}))["msgs"]
               for p in peers}
    return {"conversations": await conversations(u), "sync": msgs, "history": history}


async def gone(redis: Any, user: str) -> bool:
    return await redis.exists(*user_keys(user)) == 0


async def test_after_the_keys_expire_every_answer_is_rebuilt_the_same(
        make_node, connect, http, redis_client, mongo_db):
    node = await make_node(user_key_ttl_s=2, offline_ttl_s=2, dep_timeout_s=STORE_TIMEOUT_S)
    alice, bob, carol, dan, erin = (uid(p) for p in ("al", "bo", "ca", "da", "er"))
    ca, cb, cc, cd = [await connect(node, u) for u in (alice, bob, carol, dan)]
    ha = http(alice, node)

    async def send(dev: Any, to: str, body: Any) -> int:
        return int((await dev.request("send", to=to, cmid=uid("m"), body=body))["mid"])

    await send(cb, alice, "b1")
    # The first list rebuilds (a new user's keys are never complete before);
    # everything after is the scripts' doing, compared below with a rebuild.
    await conversations(ha)
    b2 = await send(cb, alice, "b2")
    await send(cb, alice, {"text": "x" * 600})  # kept as a preview in the list
    b4 = await send(cb, alice, "b4")
    await ca.request("read", conv=bob, mid=b2)  # bob: 2 left unread
    c1 = await send(cc, alice, "c1")
    await send(ca, carol, "a->c")
    await ca.request("read", conv=carol, mid=c1)  # carol: all read, last is alice's
    d1 = await send(cd, alice, "d1")
    d2 = await send(cd, alice, "d2")
    await cd.request("recall", mid=d2)  # dan: the last is a tombstone, 1 unread
    await send(ca, erin, "to erin")  # erin: only sent
    await send(ca, erin, "to erin 2")
    e3 = await send(ca, erin, "to erin 3")
    await ha.ok("DELETE", f"/v1/messages/{e3}")  # deleted for alice: erin's last is the 2nd
    await ha.ok("DELETE", f"/v1/messages/{b4}")  # deleted unread: no longer counted
    peers = [bob, carol, dan, erin]
    before = await answers(ha, peers)
    by_conv = {c["conv"]: c for c in before["conversations"]["conversations"]}
    assert [c["conv"] for c in before["conversations"]["conversations"]] == [
        erin, dan, carol, bob]
    assert {c: r["unread"] for c, r in by_conv.items()} == {bob: 1, carol: 0, dan: 1, erin: 0}
    assert before["conversations"]["total_unread"] == 2
    assert by_conv[dan]["last"]["recalled"] is True
    assert by_conv[erin]["last"]["body"] == "to erin 2"
    assert await mongo_db.reads.find_one({"_id": f"{alice}|{bob}"}) is not None

    assert await until(lambda: gone(redis_client, alice), timeout=15)
    after = await answers(ha, peers)
    assert after == before
    assert not await gone(redis_client, alice)  # rebuilt (and expiring again)
    ttls = [await redis_client.ttl(k) for k in user_keys(alice)[2:]]
    assert all(0 < t <= 2 for t in ttls), ttls

    # Keys that expired take deliveries and reads before anyone lists them:
    # the rebuild that follows merges them in, losing none.
    assert await until(lambda: gone(redis_client, alice), timeout=15)
    d3 = await send(cd, alice, "d3")
    await ca.request("read", conv=dan, mid=d1)  # d2 is recalled: d3 alone is unread
    b5 = await send(cb, alice, "b5")
    listed = await conversations(ha)
    rows = {c["conv"]: c for c in listed["conversations"]}
    assert [c["conv"] for c in listed["conversations"]] == [bob, dan, erin, carol]
    assert rows[bob]["unread"] == 2 and rows[bob]["last"]["mid"] == b5
    assert rows[dan]["unread"] == 1 and rows[dan]["last"]["mid"] == d3
    assert listed["total_unread"] == 3


async def test_an_inbox_left_by_a_version_without_read_marks_keeps_what_was_read(
        node, http, redis_client, mongo_db):
    """Before inbox TTLs no read mark was stored in MongoDB: the unread keys
    were the only record. The first rebuild takes its marks from those keys
    (and stores them), so nothing read before an upgrade is unread after it."""
    me, alice, bob = uid("me"), uid("a"), uid("b")
    chat = node.app.chat
    a = [(await chat.send(alice, me, f"a{i}", b'"x"')).mid for i in range(3)]
    b = [(await chat.send(bob, me, f"b{i}", b'"y"')).mid for i in range(2)]
    # What the old version left: alice's last message unread, bob's all read.
    await redis_client.delete(KEYS.inbox_meta(me), KEYS.unread_mids(me), KEYS.convs(me),
                              KEYS.conv_last(me))
    await redis_client.hset(KEYS.inbox_meta(me), mapping={"*": 1, alice: 1, bob: 0})
    await redis_client.zadd(KEYS.legacy_unread_mids(me, alice), {str(a[2]): a[2]})
    page = (await http(me).get("/v1/conversations")).json()
    assert {r["conv"]: r["unread"] for r in page["conversations"]} == {alice: 1, bob: 0}
    assert page["total_unread"] == 1
    marks = {d["_id"]: d["mid"] async for d in mongo_db.reads.find(
        {"_id": {"$in": [f"{me}|{alice}", f"{me}|{bob}"]}})}
    assert marks == {f"{me}|{alice}": a[2] - 1, f"{me}|{bob}": b[1]}
    assert not await redis_client.exists(KEYS.legacy_unread_mids(me, alice))
    assert set(await redis_client.hkeys(KEYS.inbox_meta(me))) <= {b"~", b"v"}


@contextlib.contextmanager
def box_reads(node: Any) -> Iterator[list[str]]:
    """The users whose MongoDB box the node's offline store reads meanwhile
    (the real source, its ``inbox_entries`` calls counted)."""
    offline = node.stores.offline
    source = offline.source
    reads: list[str] = []

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(source, name)

        async def inbox_entries(self, owner: str, limit: int) -> Any:
            reads.append(owner)
            return await source.inbox_entries(owner, limit)

    offline.source = Counting()
    try:
        yield reads
    finally:
        offline.source = source


async def test_calls_that_find_an_inbox_lost_share_one_rebuild(node, connect, http, redis_client):
    """After a Redis loss every call of a user finds its inbox incomplete: the
    node reads the user's box from MongoDB once for all of them, not per call."""
    me, peer = uid("me"), uid("peer")
    cp = await connect(node, peer)
    for i in range(3):
        await acked_send(cp, me, f"m{i}", f"hi {i}")
    await redis_client.delete(KEYS.inbox_meta(me), KEYS.unread_mids(me), KEYS.convs(me),
                              KEYS.conv_last(me))
    h = http(me, node)
    with box_reads(node) as reads:
        pages = await asyncio.gather(*(h.ok("GET", "/v1/conversations") for _ in range(8)))
    assert reads == [me]
    assert all(p["total_unread"] == 3 for p in pages)


async def test_a_call_that_found_the_inbox_lost_after_its_rebuild_ended_reads_nothing_again(
        node, connect, http, redis_client):
    """A call that found the keys incomplete but asks for a rebuild only after
    another one (of this node or another) completed them: no second MongoDB
    read (it happened under a loaded machine, between a read and its ask)."""
    me, peer = uid("me"), uid("peer")
    cp = await connect(node, peer)
    await acked_send(cp, me, "m0", "hi")
    await redis_client.delete(KEYS.inbox_meta(me), KEYS.unread_mids(me), KEYS.convs(me),
                              KEYS.conv_last(me))
    h = http(me, node)
    assert (await h.ok("GET", "/v1/conversations"))["total_unread"] == 1  # rebuilt here
    with box_reads(node) as reads:
        assert await node.stores.offline._rebuild(me)  # noqa: SLF001 - the late caller's ask
    assert reads == []


async def test_a_read_made_while_the_inbox_is_rebuilt_neither_restarts_nor_is_undone(
        node, connect, http, redis_client):
    """A user who reads while its inbox is rebuilt (after a Redis loss, every
    message read as it arrives) must not keep the rebuild from finishing: the
    read is kept beside the incomplete keys and the rebuild's merge applies it,
    where MongoDB's read mark, read before the read, would put its mids back."""
    me, peer = uid("me"), uid("peer")
    cp = await connect(node, peer)
    mids = []
    for i in range(3):
        mids.append((await acked_send(cp, me, f"m{i}", f"hi {i}"))["mid"])
    await redis_client.delete(KEYS.inbox_meta(me), KEYS.unread_mids(me), KEYS.convs(me),
                              KEYS.conv_last(me))
    offline: Any = node.stores.offline
    source = offline.source
    reads: list[str] = []
    marks_read, go_on = asyncio.Event(), asyncio.Event()

    class Held:  # the real MongoDB source: box reads counted, held after the marks are read
        def __getattr__(self, name: str) -> Any:
            return getattr(source, name)

        async def inbox_entries(self, owner: str, limit: int) -> Any:
            reads.append(owner)
            return await source.inbox_entries(owner, limit)

        async def read_marks(self, user: str, convs: Any) -> Any:
            got = await source.read_marks(user, convs)
            marks_read.set()
            await go_on.wait()
            return got

    offline.source = Held()
    h = http(me, node)
    try:
        listing = asyncio.create_task(h.ok("GET", "/v1/conversations"))
        await asyncio.wait_for(marks_read.wait(), 10)
        # Read up to the second message while the rebuild holds marks from before.
        reading = asyncio.create_task(
            h.ok("POST", f"/v1/conversations/{peer}/read", json={"mid": mids[1]}))
        await until(lambda: redis_client.hexists(KEYS.inbox_meta(me), f"r|{peer}"), timeout=10)
        go_on.set()
        await asyncio.wait_for(asyncio.gather(listing, reading), 10)
    finally:
        go_on.set()
        offline.source = source
    assert reads == [me]  # one rebuild, not started over
    page = await h.ok("GET", "/v1/conversations")
    assert page["total_unread"] == 1
    assert {r["conv"]: r["unread"] for r in page["conversations"]} == {peer: 1}
    assert set(await redis_client.hkeys(KEYS.inbox_meta(me))) == {b"~"}


async def test_the_rebuild_reads_1to1_entries_only_old_ones_included(
        node, connect, http, redis_client, mongo_db, monkeypatch):
    """A box holds many more write-diffused group entries than 1:1 ones: the
    rebuild's bounded read skips them (so a quiet 1:1 conversation under a
    busy group is still listed, its unread whole), and still finds 1:1 entries
    written before group and 1:1 entries were told apart."""
    import store.offline_redis

    monkeypatch.setattr(store.offline_redis, "REBUILD_SCAN", 4)
    me, peer, old_peer, member = uid("me"), uid("peer"), uid("old"), uid("m")
    cp, co = await connect(node, peer), await connect(node, old_peer)
    await acked_send(co, me, "o0", "old")
    # As a version before the field wrote it: no "d" on either side's entry.
    await mongo_db.boxes.update_many({"owner": {"$in": [me, old_peer]}}, {"$unset": {"d": ""}})
    for i in range(2):
        await acked_send(cp, me, f"m{i}", f"hi {i}")
    r = await http(member, node).post("/v1/groups", json={"name": "busy", "members": [me]})
    group = r.json()["group"]
    cm = await connect(node, member)
    for i in range(6):
        reply = await cm.request("group_send", group=group, cmid=f"g{i}", body=i)
        assert reply["op"] == "ack", reply
    assert await mongo_db.boxes.count_documents({"owner": me, "d": 0}) == 6
    await redis_client.delete(KEYS.inbox_meta(me), KEYS.unread_mids(me), KEYS.convs(me),
                              KEYS.conv_last(me))
    page = await http(me, node).ok("GET", "/v1/conversations")
    unread = {c["conv"]: c["unread"] for c in page["conversations"]}
    assert unread == {peer: 2, old_peer: 1, f"g:{group}": 6}
