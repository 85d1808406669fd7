"""Group chat on real nodes and servers: seq, diffusion, unread, sync, membership."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from store.keys import Keys
from tests.conftest import RUN_NS, settle, uid


def on(http: Any, default: Any) -> Any:
    """The ``http`` fixture with ``default`` as the node when none is named."""
    return lambda user, node=None: http(user, node or default)


async def new_group(http: Any, owner: str, members: list[str], node: Any = None) -> str:
    r = await http(owner, node).post("/v1/groups", json={"name": "team", "members": members})
    assert r.status_code == 200, r.text
    return r.json()["group"]


async def convs(http: Any, user: str, node: Any = None) -> dict[str, Any]:
    r = await http(user, node).get("/v1/conversations")
    assert r.status_code == 200, r.text
    return r.json()


def unread_of(c: dict[str, Any], conv: str) -> int:
    return next(x["unread"] for x in c["conversations"] if x["conv"] == conv)


@pytest.mark.parametrize("wd_max", [100, 0], ids=["write-diffusion", "read-diffusion"])
async def test_group_chat_end_to_end(make_node, connect, http, wd_max):
    n1 = await make_node(group_write_diffusion_max=wd_max)
    n2 = await make_node(group_write_diffusion_max=wd_max)
    await settle(n1, n2)
    a, b, c = uid("a"), uid("b"), uid("c")
    g = await new_group(http, a, [b, c], n1)
    ca, cb = await connect(n1, a), await connect(n2, b)  # c stays offline
    acks = [await ca.request("group_send", group=g, cmid=f"m{i}", body={"i": i})
            for i in range(3)]
    assert [x["seq"] for x in acks] == [1, 2, 3]
    for ack in acks:
        push = await cb.next_push("group_msg")
        assert (push["mid"], push["seq"], push["group"], push["from"]) == \
            (ack["mid"], ack["seq"], g, a)
    one = await ca.request("send", to=c, cmid="direct", body="hi c")
    # Offline c: 1:1 and group messages in mid order, then unread and reads.
    page = (await http(c, n2).get("/v1/sync")).json()
    got = [(m["op"], m["mid"]) for m in page["msgs"]]
    assert got == sorted(got, key=lambda x: x[1])
    assert [m for _, m in got] == [x["mid"] for x in acks] + [one["mid"]]
    assert [m.get("seq") for m in page["msgs"]] == [1, 2, 3, None]
    cc = await convs(http, c, n1)
    assert cc["total_unread"] == 4
    assert unread_of(cc, f"g:{g}") == 3 and unread_of(cc, a) == 1
    assert [x["conv"] for x in cc["conversations"]] == [a, f"g:{g}"]  # newest first
    r = await http(c, n1).post(f"/v1/conversations/g:{g}/read", json={"mid": acks[1]["mid"]})
    assert r.status_code == 200
    cc = await convs(http, c, n2)
    assert unread_of(cc, f"g:{g}") == 1 and cc["total_unread"] == 2
    hist = (await http(c, n1).get(f"/v1/history/g:{g}")).json()
    assert [m["seq"] for m in hist["msgs"]] == [3, 2, 1] and hist["next"] is None
    # A resend of a cmid: the same mid and seq, nothing new.
    again = await ca.request("group_send", group=g, cmid="m1", body={"i": 1})
    assert (again["mid"], again["seq"]) == (acks[1]["mid"], 2)
    assert unread_of(await convs(http, c, n1), f"g:{g}") == 1
    assert unread_of(await convs(http, a, n2), f"g:{g}") == 0  # its own messages are read
    assert unread_of(await convs(http, b, n1), f"g:{g}") == 3
    await cb.request("read", conv=f"g:{g}", mid=acks[-1]["mid"])
    assert unread_of(await convs(http, b, n2), f"g:{g}") == 0


async def test_seq_has_no_gaps_under_concurrent_senders_on_three_nodes(
        make_node, connect, http, mongo_db):
    nodes = [await make_node() for _ in range(3)]
    await settle(*nodes)
    owner = uid("o")
    senders = [uid("s") for _ in range(6)]
    g = await new_group(http, owner, senders, nodes[0])
    clients = [await connect(nodes[i % 3], u) for i, u in enumerate(senders)]

    async def acked(c: Any, cmid: str, i: int) -> dict[str, Any]:
        """As a client does: an ``unavailable`` answer (a dependency timed out
        under the test run's load) is sent again with the same cmid."""
        for _ in range(20):
            reply: dict[str, Any] = await c.request("group_send", group=g, cmid=cmid, body=i)
            if reply["op"] == "ack":
                return reply
            assert reply["code"] == "unavailable", reply
            await asyncio.sleep(0.25)
        raise AssertionError(f"{cmid} never acked: {reply}")

    async def burst(c: Any, tag: int) -> list[int]:
        acks = await asyncio.gather(*(acked(c, f"c{tag}-{i}", i) for i in range(25)))
        return [a["seq"] for a in acks]

    seqs = [s for part in await asyncio.gather(*(burst(c, i) for i, c in enumerate(clients)))
            for s in part]
    assert sorted(seqs) == list(range(1, 151))
    stored = [d["seq"] async for d in mongo_db.group_msgs.find({"g": g}).sort("seq", 1)]
    assert stored == list(range(1, 151))
    assert await mongo_db.group_msgs.count_documents({"g": g, "dead": True}) == 0
    r = await http(owner, nodes[1]).get("/v1/conversations")
    assert unread_of(r.json(), f"g:{g}") == 150


async def test_membership_rules(make_node, connect, http):
    n1, n2 = await make_node(), await make_node()
    http = on(http, n1)
    await settle(n1, n2)
    owner, m, outsider, late = uid("o"), uid("m"), uid("x"), uid("l")
    g = await new_group(http, owner, [m], n1)
    co, cm, cx = await connect(n1, owner), await connect(n2, m), await connect(n1, outsider)
    err = await cx.request("group_send", group=g, cmid="x1", body="hi")
    assert err["code"] == "forbidden"
    assert (await http(outsider).get(f"/v1/history/g:{g}")).status_code == 403
    r = await http(m).post(f"/v1/groups/{g}/members", json={"members": [outsider]})
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert (await http(owner).post("/v1/groups/nosuchgroup/members",
                                   json={"members": [outsider]})).status_code == 404
    first = await co.request("group_send", group=g, cmid="o1", body="before")
    assert (await cm.next_push("group_msg"))["mid"] == first["mid"]
    # A late member sees history from joining on, and its unread starts at 0.
    r = await http(owner, n2).post(f"/v1/groups/{g}/members", json={"members": [late]})
    assert r.status_code == 200
    cl = await connect(n2, late)
    assert unread_of(await convs(http, late), f"g:{g}") == 0
    second = await co.request("group_send", group=g, cmid="o2", body="after")
    assert (await cl.next_push("group_msg"))["mid"] == second["mid"]
    hist = (await http(late).get(f"/v1/history/g:{g}")).json()["msgs"]
    assert [x["mid"] for x in hist] == [second["mid"]]
    assert unread_of(await convs(http, late), f"g:{g}") == 1
    # A removed member: forbidden to send or read, and nothing pushed after removal.
    r = await http(owner, n1).delete(f"/v1/groups/{g}/members/{m}")
    assert r.status_code == 200
    assert (await http(owner).delete(f"/v1/groups/{g}/members/{owner}")).status_code == 400
    third = await co.request("group_send", group=g, cmid="o3", body="after removal")
    assert (await cl.next_push("group_msg"))["mid"] == third["mid"]  # others still get it
    assert (await cm.request("group_send", group=g, cmid="m9", body="x"))["code"] == "forbidden"
    assert (await http(m).get(f"/v1/history/g:{g}")).status_code == 403
    after_removal = await convs(http, m)
    assert all(x["conv"] != f"g:{g}" for x in after_removal["conversations"])
    assert after_removal["total_unread"] == 0  # its unread left with the group
    assert (await convs(http, late))["total_unread"] == 2  # "after" and "after removal"
    await cm.request("ping")  # pushes to m before this pong would be in its queue by now
    pushed = [f["seq"] for f in cm.drain_pushes() if f.get("op") == "group_msg"]
    assert pushed == [2]  # sent while m was still a member; nothing after the removal


async def test_lost_redis_state_is_rebuilt_and_seqs_continue(make_node, connect, http,
                                                             redis_client):
    node = await make_node()
    http = on(http, node)
    owner, m = uid("o"), uid("m")
    g = await new_group(http, owner, [m])
    co = await connect(node, owner)
    for i in range(3):
        await co.request("group_send", group=g, cmid=f"a{i}", body=i)
    # Redis loses every group key (a flush, a failover): MongoDB has the truth.
    keys = Keys(RUN_NS)
    for key in (keys.group_state(g), keys.group_members(g), keys.user_groups(owner),
                keys.user_groups(m)):
        assert await redis_client.delete(key) == 1
    ack = await co.request("group_send", group=g, cmid="after", body="x")
    assert ack["seq"] == 4  # not 1: the seq comes from MongoDB
    assert unread_of(await convs(http, m), f"g:{g}") == 4
    assert unread_of(await convs(http, owner), f"g:{g}") == 0
    cx = await connect(node, uid("x"))
    assert (await cx.request("group_send", group=g, cmid="x", body=1))["code"] == "forbidden"


async def test_a_group_crossing_the_diffusion_threshold_answers_the_same(
        make_node, connect, http):
    node = await make_node(group_write_diffusion_max=3)
    http = on(http, node)
    owner, b, c, d, e = (uid(x) for x in "obcde")
    g = await new_group(http, owner, [b, c])  # 3 members: write diffusion
    co = await connect(node, owner)
    mids = [(await co.request("group_send", group=g, cmid=f"w{i}", body=i))["mid"]
            for i in range(2)]
    await http(owner).post(f"/v1/groups/{g}/members", json={"members": [d, e]})  # 5: read
    mids += [(await co.request("group_send", group=g, cmid=f"r{i}", body=i))["mid"]
             for i in range(2)]
    await http(owner).delete(f"/v1/groups/{g}/members/{d}")
    await http(owner).delete(f"/v1/groups/{g}/members/{e}")  # 3 again: write diffusion
    mids.append((await co.request("group_send", group=g, cmid="w9", body=9))["mid"])
    for user in (b, c):
        page = (await http(user).get("/v1/sync")).json()["msgs"]
        assert [m["mid"] for m in page] == mids and [m["seq"] for m in page] == [1, 2, 3, 4, 5]
        hist = (await http(user).get(f"/v1/history/g:{g}")).json()["msgs"]
        assert [m["mid"] for m in hist] == mids[::-1]
        assert unread_of(await convs(http, user), f"g:{g}") == 5
    # A removed member no longer reads the group (it had only read-diffused messages).
    assert (await http(d).get("/v1/sync")).json()["msgs"] == []
    assert (await http(d).get(f"/v1/history/g:{g}")).status_code == 403
