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
