"""A connect storm of users the node has not seen (their groups not in Redis):
what they need from MongoDB is read in one query per batch of connections
(``GroupsMongo.user_groups_many``), not one per user; every device still gets
its groups' pushes."""

from __future__ import annotations

import asyncio

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, uid


def group_member_finds(node) -> float:
    """``find`` commands the node sent to ``group_members`` so far."""
    total = 0.0
    for metric in node.metrics.store_commands.collect():
        for sample in metric.samples:
            labels = sample.labels
            if sample.name.endswith("_count") and labels.get("command") == "find" \
                    and labels.get("collection") == "group_members":
                total += sample.value
    return total


async def test_a_storm_of_new_users_reads_their_groups_once_per_batch(make_node, connect, http,
                                                                    redis_client):
    node = await make_node()
    owner = uid("o")
    users = [uid("s") for _ in range(60)]
    r = await http(owner, node).post("/v1/groups", json={"name": "g", "members": users[:30]})
    assert r.status_code == 200, r.text
    group = r.json()["group"]
    # Half of them in no group: their groups' hashes are not in Redis until they
    # connect (the creation filled the members'): each would cost a find of its own.
    before = group_member_finds(node)
    devices = await asyncio.gather(*(connect(node, u) for u in users))
    keys = Keys(RUN_NS)

    async def all_loaded() -> bool:  # (a device's groups load after its handshake)
        pipe = redis_client.pipeline(transaction=False)
        for u in users:
            pipe.hexists(keys.user_groups(u), "~")
        return all(await pipe.execute())

    assert await until(all_loaded)
    finds = group_member_finds(node) - before
    assert 1 <= finds <= 12, finds  # one per batch of connections, not 30 or 60
    o = await connect(node, owner)
    assert (await o.request("group_send", group=group, cmid="c1", body="hi"))["op"] == "ack"
    for d in devices[:30]:
        assert (await d.next_push("group_msg"))["body"] == "hi"
