"""A sync reads the caller's groups with news, not all its groups: each user's
index of groups with read-diffused messages (store/group_news_redis.py), on
real nodes and servers."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from store.groups_redis import FRAMES_TTL_S, RD_FRAMES
from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, settle, uid

GROUPS = 12


async def _groups(http: Any, node: Any, user: str, n: int) -> list[str]:
    """``n`` read-diffused groups (3 members, the node's threshold 2) with ``user``."""
    out = []
    for i in range(n):
        owner = uid(f"o{i}")
        r = await http(owner, node).post("/v1/groups", json={
            "name": f"g{i}", "members": [user, uid("f")]})
        assert r.status_code == 200, r.text
        out.append((r.json()["group"], owner))
    return [g for g, _ in out]


async def _sync_all(http: Any, node: Any, user: str, since: int) -> tuple[list[int], int]:
    mids: list[int] = []
    while True:
        page = (await http(user, node).get("/v1/sync", params={"since": since})).json()
        mids += [m["mid"] for m in page["msgs"]]
        since = page["next"]
        if not page["more"]:
            return mids, since


async def test_a_sync_from_its_cursor_reads_only_the_groups_with_news(
        make_node, connect, http):
    n1 = await make_node(group_write_diffusion_max=2, http_rate=0, sync_settle_ms=0)
    n2 = await make_node(group_write_diffusion_max=2, http_rate=0, sync_settle_ms=0)
    for n in (n1, n2):  # the members' scores move every 0.3 s at most (5 s by default)
        n.app.groups.news.every_ms = 300
    await settle(n1, n2)
    user, sender = uid("u"), uid("s")
    groups = await _groups(http, n1, user, GROUPS)
    for g in groups:  # the sender joins each (the owners add it)
        owner = (await http(user, n1).get(f"/v1/groups/{g}")).json()["owner"]
        r = await http(owner, n1).post(f"/v1/groups/{g}/members", json={"members": [sender]})
        assert r.status_code == 200, r.text
    cs = await connect(n2, sender)
    first = [(await cs.request("group_send", group=g, cmid=f"a{i}", body=i))["mid"]
             for i, g in enumerate(groups)]
    # The first sync reads every group (no index yet) and seeds the index.
    got, _ = await _sync_all(http, n1, user, 0)
    assert got == first
    # Past the scores' period, news in one group (through the other node).
    await asyncio.sleep(0.6)
    news = (await cs.request("group_send", group=groups[0], cmid="b0", body=0))["mid"]
    got, cursor = await _sync_all(http, n1, user, 0)
    assert got == [*first, news]

    async def cursor_at_news() -> bool:
        # A sync's cursor stays below sends another node had in flight when it last
        # shared its mark (every 0.5 s): once those marks moved on it reaches ``news``.
        nonlocal cursor
        cursor = (await _sync_all(http, n1, user, 0))[1]
        return cursor == news

    assert await until(cursor_at_news, timeout=5)
    _, _, read = await n1.app.groups.sync_rd(user, cursor, 100)
    assert read == 1  # the group of that message only: the others had nothing since
    later = [(await cs.request("group_send", group=groups[i], cmid=f"c{i}", body=i))["mid"]
             for i in (3, 7)]
    rows, _, read = await n1.app.groups.sync_rd(user, cursor, 100)
    assert [mid for mid, _ in rows] == later and read == 3
    assert (await _sync_all(http, n1, user, cursor))[0] == later


async def test_the_index_never_hides_news_a_join_or_a_lost_index(
        make_node, connect, http, redis_client):
    """A group joined after the index was seeded, a message in a group whose
    members' scores were given moments ago, and an index Redis lost: the sync
    from the same cursor answers as a full read would."""
    node = await make_node(group_write_diffusion_max=2, http_rate=0, sync_settle_ms=0)
    user, sender = uid("u"), uid("s")
    g1 = (await http(sender, node).post("/v1/groups", json={
        "name": "a", "members": [user, uid("f")]})).json()["group"]
    cs = await connect(node, sender)
    m1 = (await cs.request("group_send", group=g1, cmid="1", body=1))["mid"]
    got, cursor = await _sync_all(http, node, user, 0)
    assert got == [m1]
    # Moments later (within the marks' period): its score was given already.
    m2 = (await cs.request("group_send", group=g1, cmid="2", body=2))["mid"]
    # A new group with the user in it, then its first message.
    g2 = (await http(sender, node).post("/v1/groups", json={
        "name": "b", "members": [uid("f"), uid("f")]})).json()["group"]
    assert (await http(sender, node).post(f"/v1/groups/{g2}/members",
                                          json={"members": [user]})).status_code == 200
    m3 = (await cs.request("group_send", group=g2, cmid="3", body=3))["mid"]
    got, after = await _sync_all(http, node, user, cursor)
    assert got == [m2, m3]
    news = await redis_client.zrange(Keys(RUN_NS).group_news(user), 0, -1)
    assert {g1.encode(), g2.encode(), b"~"} <= set(news)
    # Redis loses the index: the next sync reads every group again, right.
    assert await redis_client.delete(Keys(RUN_NS).group_news(user)) == 1
    m4 = (await cs.request("group_send", group=g2, cmid="4", body=4))["mid"]
    assert (await _sync_all(http, node, user, cursor))[0] == [m2, m3, m4]
    assert (await _sync_all(http, node, user, after))[0] == [m4]


async def test_without_the_index_a_sync_reads_every_group(make_node, connect, http):
    """``IM_GROUP_NEWS_SYNC=0`` (a rollout from a release without the index):
    every sync reads all the caller's groups and answers the same."""
    node = await make_node(group_write_diffusion_max=2, http_rate=0, sync_settle_ms=0,
                           group_news_sync=0)
    user, sender = uid("u"), uid("s")
    groups = [(await http(sender, node).post("/v1/groups", json={
        "name": f"g{i}", "members": [user, uid("f")]})).json()["group"] for i in range(3)]
    cs = await connect(node, sender)
    first = (await cs.request("group_send", group=groups[0], cmid="1", body=1))["mid"]
    got, cursor = await _sync_all(http, node, user, 0)
    assert got == [first]
    later = (await cs.request("group_send", group=groups[2], cmid="2", body=2))["mid"]
    rows, _, read = await node.app.groups.sync_rd(user, cursor, 100)
    assert [mid for mid, _ in rows] == [later] and read == 3


def _pages(node: Any, source: str) -> float:
    value: float = node.metrics.group_sync_pages.labels(source)._value.get()
    return value


async def test_a_sync_answers_from_the_groups_kept_frames_as_mongodb_would(
        make_node, connect, http, redis_client):
    """The frames of a group's newest read-diffused messages are kept in Redis:
    a sync answers from them, the same frames MongoDB gives (a recalled one
    as its tombstone); a frame too big to keep, or a group whose kept frames
    are gone, is read from MongoDB."""
    node = await make_node(group_write_diffusion_max=2, http_rate=0, sync_settle_ms=0)
    user, sender = uid("u"), uid("s")
    groups = [(await http(sender, node).post("/v1/groups", json={
        "name": f"g{i}", "members": [user, uid("f")]})).json()["group"] for i in range(3)]
    cs = await connect(node, sender)
    sent = [(await cs.request("group_send", group=g, cmid=f"{i}", body={"n": i, "t": "x"}))["mid"]
            for i, g in enumerate([*groups, *groups])]
    assert (await cs.request("recall", mid=sent[1]))["op"] == "ok"

    async def full_page() -> list[dict[str, Any]]:
        page = (await http(user, node).get("/v1/sync", params={"since": 0})).json()
        return [m for m in page["msgs"] if m.get("group")]

    redis_before, mongo_before = _pages(node, "redis"), _pages(node, "mongo")
    kept = await full_page()
    assert [m["mid"] for m in kept] == sent
    assert kept[1]["recalled"] and "body" not in kept[1]
    assert kept[3]["body"] == {"n": 3, "t": "x"}
    assert _pages(node, "mongo") == mongo_before and _pages(node, "redis") == redis_before + 3
    assert 0 < await redis_client.ttl(Keys(RUN_NS).group_frames(groups[0])) <= FRAMES_TTL_S
    # The kept frames gone (Redis lost them, or their TTL passed): MongoDB answers the same.
    for g in groups:
        assert await redis_client.delete(Keys(RUN_NS).group_frames(g)) == 1
    assert await full_page() == kept
    assert _pages(node, "mongo") == mongo_before + 3
    # A frame over the size kept: its group is read from MongoDB, the others not.
    big = (await cs.request("group_send", group=groups[0], cmid="big", body="y" * 3000))["mid"]
    small = (await cs.request("group_send", group=groups[1], cmid="small", body="z"))["mid"]
    rows, _, _ = await node.app.groups.sync_rd(user, sent[-1], 100)
    assert [(mid, orjson.loads(orjson.dumps(f))["body"]) for mid, f in rows] == [
        (big, "y" * 3000), (small, "z")]
    assert _pages(node, "mongo") == mongo_before + 4 and _pages(node, "redis") == redis_before + 4


async def test_a_group_keeps_the_frames_of_its_newest_messages_only(
        make_node, redis_client):
    """Past twice the number kept, the oldest frames go down to that number; a
    sync asking for one gone reads MongoDB."""
    node = await make_node()
    cache, group = node.app.groups.cache, uid("g")
    for seq in range(1, 2 * RD_FRAMES + 1):
        await cache.record([], (), [(group, 1000 + seq, seq, b"f%d" % seq)])
    key = Keys(RUN_NS).group_frames(group)
    assert await redis_client.hlen(key) == RD_FRAMES
    newest = list(range(RD_FRAMES + 1, 2 * RD_FRAMES + 1))
    assert await cache.rd_frames({group: newest[-2:]}) == {
        group: [b"f%d" % q for q in newest[-2:]]}
    assert await cache.rd_frames({group: [RD_FRAMES, newest[0]]}) == {group: None}
