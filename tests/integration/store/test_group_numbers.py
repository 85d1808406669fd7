"""The groups' numbers summary (``gn`` hashes, ``store/groups_redis.py``) on a
real node and Redis: the conversation list reads it, and a summary entry that
is gone, or that only a send wrote to, is filled from the group's state (itself
rebuilt from MongoDB) so that every count stays right."""

from __future__ import annotations

from store.keys import Keys
from tests.conftest import RUN_NS, uid


async def _row(http_user, group: str) -> dict:
    page = (await http_user.get("/v1/conversations", params={"limit": 200})).json()
    return next(r for r in page["conversations"] if r["conv"] == f"g:{group}")


async def test_the_summary_is_filled_again_and_stays_right(make_node, connect, http,
                                                           redis_client):
    node = await make_node()
    owner, me = uid("o"), uid("me")
    g = (await http(owner, node).post("/v1/groups", json={"name": "g", "members": [me]})
         ).json()["group"]
    co = await connect(node, owner)
    acks = [await co.request("group_send", group=g, cmid=f"m{i}", body=i) for i in range(3)]
    hm = http(me, node)
    keys = Keys(RUN_NS)
    entry = (await redis_client.hget(keys.group_numbers(g), g)).decode()
    assert entry.startswith("1,3,") and (await _row(hm, g))["unread"] == 3

    # The entry gone: the list reads the group's state and writes the entry again.
    await redis_client.hdel(keys.group_numbers(g), g)
    assert (await _row(hm, g))["unread"] == 3
    assert (await redis_client.hget(keys.group_numbers(g), g)).decode() == entry

    # State and entry both gone, then a send: the entry it writes is not known
    # complete, so the list rebuilds the state from MongoDB.
    await redis_client.delete(keys.group_state(g))
    await redis_client.hdel(keys.group_numbers(g), g)
    await co.request("group_send", group=g, cmid="m3", body=3)
    assert (await redis_client.hget(keys.group_numbers(g), g)).decode().startswith("0,4,")
    row = await _row(hm, g)
    assert row["unread"] == 4 and row["last"]["body"] == 3
    assert (await redis_client.hget(keys.group_numbers(g), g)).decode().startswith("1,4,")

    # A recall leaves the unread count through the summary too.
    assert (await co.request("recall", mid=acks[2]["mid"]))["op"] == "ok"
    assert (await _row(hm, g))["unread"] == 3
    assert (await hm.get("/v1/conversations")).json()["total_unread"] == 3


async def _sync_all(client, limit: int) -> list[int]:
    mids, since = [], 0
    for _ in range(100):
        page = (await client.get("/v1/sync", params={"since": since, "limit": limit})).json()
        mids += [m["mid"] for m in page["msgs"]]
        since = page["next"]
        if not page["more"]:
            return mids
    raise AssertionError("the sync did not end")


async def test_a_sync_of_many_groups_follows_their_indexes(make_node, connect, http,
                                                          redis_client):
    """Read-diffused groups (more members than IM_GROUP_WRITE_DIFFUSION_MAX): the
    sync learns from each group's index which groups hold its next messages;
    with the indexes gone it reads MongoDB and answers the same."""
    node = await make_node(group_write_diffusion_max=2, sync_settle_ms=0)
    me, owners = uid("me"), [uid("o") for _ in range(3)]
    groups = [(await http(owners[i % 3], node).post(
        "/v1/groups", json={"name": f"g{i}", "members": [me, uid("x")]})).json()["group"]
        for i in range(24)]
    senders = [await connect(node, o) for o in owners]
    sent = []
    for k in range(2):
        for i, g in enumerate(groups):
            r = await senders[i % 3].request("group_send", group=g, cmid=f"{g}{k}", body=k)
            sent.append(r["mid"])
    hm = http(me, node)
    assert await _sync_all(hm, 7) == sorted(sent)
    keys = Keys(RUN_NS)
    assert await redis_client.zscore(keys.group_rd(groups[0]), "~") == 0
    await redis_client.delete(*[keys.group_rd(g) for g in groups])
    assert await _sync_all(hm, 7) == sorted(sent)


async def test_a_groups_newest_message_is_read_at_its_lastmid_or_found_without_it(
        node, connect, http):
    owner = uid("o")
    g = (await http(owner, node).post("/v1/groups", json={"name": "g", "members": []})
         ).json()["group"]
    co = await connect(node, owner)
    acks = [await co.request("group_send", group=g, cmid=f"m{i}", body=i) for i in range(3)]
    store = node.stores.groups
    doc = await store.get(g)
    assert doc is not None and doc["lastmid"] == acks[-1]["mid"]
    newest = await store.last(g, doc["lastmid"])
    assert newest is not None and (newest.mid, newest.seq) == (acks[-1]["mid"], 3)
    # A lastmid that names no stored message (its send failed): the newest by mid.
    for hint in (0, acks[-1]["mid"] + 1):
        found = await store.last(g, hint)
        assert found is not None and found.mid == acks[-1]["mid"]
