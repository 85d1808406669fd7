"""Chat features on two nodes (docs/protocol.md, Chat features): read receipts
and multi-device read sync, recall (tombstones in both views, unread fixed,
MongoDB the truth once Redis lost the user's keys), delete for me, typing;
unread stays exact (the conversations' counts sum to total_unread)."""

from __future__ import annotations

import asyncio

from store.keys import Keys
from tests.conftest import RUN_NS, settle, uid


async def conversations(http, user, node) -> dict:
    r = await http(user, node).get("/v1/conversations")
    assert r.status_code == 200, r.text
    return r.json()


async def unread_of(http, user, node, conv) -> int:
    body = await conversations(http, user, node)
    assert sum(c["unread"] for c in body["conversations"]) == body["total_unread"]
    return next((c["unread"] for c in body["conversations"] if c["conv"] == conv), 0)


async def two_nodes(make_node, **kw):
    n1, n2 = await make_node(**kw), await make_node(**kw)
    await settle(n1, n2)
    return n1, n2


async def test_read_syncs_the_readers_devices_and_tells_the_peer(make_node, connect, http):
    n1, n2 = await two_nodes(make_node)
    alice, bob = uid("a"), uid("b")
    a1, a2, b1 = await connect(n1, alice), await connect(n2, alice), await connect(n2, bob)
    mids = [(await b1.request("send", to=alice, cmid=f"c{i}", body=i))["mid"] for i in range(3)]
    for _ in mids:
        await a1.next_push("msg")
        await a2.next_push("msg")
    assert (await a1.request("read", conv=bob, mid=mids[1]))["op"] == "ok"
    assert await a2.next_push("read") == {"op": "read", "conv": bob, "mid": mids[1], "unread": 1}
    assert await b1.next_push("receipt") == {"op": "receipt", "conv": alice, "mid": mids[1]}
    # Over HTTP on the other node: every device of the reader follows.
    r = await http(alice, n2).post(f"/v1/conversations/{bob}/read", json={"mid": mids[2]})
    assert r.status_code == 200
    for d in (a1, a2):
        assert (await d.next_push("read"))["unread"] == 0
    assert (await b1.next_push("receipt"))["mid"] == mids[2]
    assert [f for f in a1.drain_pushes() if f["op"] == "read"] == []  # nothing doubled
    assert await unread_of(http, alice, n1, bob) == 0
    # The sender's list says how far the peer has read (receipts survive a reload).
    rows = {c["conv"]: c for c in (await conversations(http, bob, n1))["conversations"]}
    assert rows[alice]["peer_read"] == mids[2]
    rows = {c["conv"]: c for c in (await conversations(http, alice, n2))["conversations"]}
    assert rows[bob]["peer_read"] == 0  # bob has read nothing of alice's


async def test_recall_tombstones_both_views_and_fixes_unread(make_node, connect, http,
                                                             redis_client):
    n1, n2 = await two_nodes(make_node)
    alice, bob = uid("a"), uid("b")
    a1, a2, b1 = await connect(n1, alice), await connect(n2, alice), await connect(n2, bob)
    sent = [await a1.request("send", to=bob, cmid=f"c{i}", body={"text": f"m{i}"})
            for i in range(3)]
    mids = [r["mid"] for r in sent]
    assert await unread_of(http, bob, n1, alice) == 3
    assert (await a1.request("recall", mid=mids[1]))["op"] == "ok"
    assert await b1.next_push("recalled") == {"op": "recalled", "mid": mids[1], "conv": alice,
                                              "by": alice}
    assert await a2.next_push("recalled") == {"op": "recalled", "mid": mids[1], "conv": bob,
                                              "by": alice}
    assert await unread_of(http, bob, n1, alice) == 2

    def check(msgs, reader_conv):
        by_mid = {m["mid"]: m for m in msgs}
        gone = by_mid[mids[1]]
        assert gone["recalled"] is True and "body" not in gone
        assert gone["conv"] == reader_conv and gone["from"] == alice
        assert by_mid[mids[0]]["body"] == {"text": "m0"}

    sync = (await http(bob, n2).get("/v1/sync")).json()["msgs"]
    check(sync, alice)
    check((await http(bob, n1).get(f"/v1/history/{alice}")).json()["msgs"], alice)
    check((await http(alice, n1).get(f"/v1/history/{bob}")).json()["msgs"], bob)
    # Redis lost bob's offline store: sync comes from MongoDB, still a tombstone.
    keys = Keys(RUN_NS)
    await redis_client.delete(keys.offline(bob), keys.offline_meta(bob))
    check((await http(bob, n2).get("/v1/sync")).json()["msgs"], alice)
    # Recalling again changes nothing; unread is not taken twice.
    assert (await a1.request("recall", mid=mids[1]))["op"] == "ok"
    assert await unread_of(http, bob, n1, alice) == 2


async def test_recall_is_the_senders_within_the_window(make_node, connect, http):
    node = await make_node(recall_window_s=1.0)
    alice, bob = uid("a"), uid("b")
    a, b = await connect(node, alice), await connect(node, bob)
    mid = (await a.request("send", to=bob, cmid="c1", body="x"))["mid"]
    refused = await b.request("recall", mid=mid)
    assert (refused["op"], refused["code"]) == ("error", "forbidden")
    assert (await a.request("recall", mid=mid + 12345))["code"] == "not_found"
    assert (await a.request("recall", mid="x"))["code"] == "bad_request"
    late = (await a.request("send", to=bob, cmid="c2", body="y"))["mid"]
    await asyncio.sleep(1.1)  # past the window (a time limit, not a race)
    assert (await a.request("recall", mid=late))["code"] == "forbidden"
    assert await unread_of(http, bob, node, alice) == 2  # nothing changed
    hist = (await http(bob, node).get(f"/v1/history/{alice}")).json()["msgs"]
    assert [m.get("recalled") for m in hist] == [None, None]


async def test_recall_racing_a_read_keeps_unread_exact(make_node, connect, http):
    n1, n2 = await two_nodes(make_node)
    for round_ in range(5):
        alice, bob = uid("a"), uid("b")
        a, b = await connect(n1, alice), await connect(n2, bob)
        mids = [(await a.request("send", to=bob, cmid=f"c{i}", body=i))["mid"]
                for i in range(4)]
        read_upto = mids[round_ % 4]
        recall_one = mids[(round_ + 1) % 4]
        await asyncio.gather(b.request("read", conv=alice, mid=read_upto),
                             a.request("recall", mid=recall_one))
        expect = sum(1 for m in mids if m > read_upto and m != recall_one)
        assert await unread_of(http, bob, n1, alice) == expect, round_


async def test_delete_for_me_leaves_the_peers_copy(make_node, connect, http, redis_client):
    n1, n2 = await two_nodes(make_node)
    alice, bob = uid("a"), uid("b")
    a = await connect(n1, alice)
    mids = [(await a.request("send", to=bob, cmid=f"c{i}", body=i))["mid"] for i in range(3)]
    r = await http(bob, n2).delete(f"/v1/messages/{mids[2]}")  # the newest, unread
    assert r.status_code == 200 and r.json() == {"ok": True}
    assert [m["mid"] for m in (await http(bob, n1).get("/v1/sync")).json()["msgs"]] == mids[:2]
    hist = (await http(bob, n2).get(f"/v1/history/{alice}")).json()["msgs"]
    assert [m["mid"] for m in hist] == mids[1::-1]
    assert [m["mid"] for m in (await http(alice, n2).get(f"/v1/history/{bob}")).json()["msgs"]
            ] == mids[::-1]
    assert await unread_of(http, bob, n1, alice) == 2
    row = next(c for c in (await conversations(http, bob, n1))["conversations"]
               if c["conv"] == alice)
    assert row["last"]["mid"] == mids[1]  # the newest left
    for path in (f"/v1/messages/{mids[2]}", f"/v1/messages/{mids[0] + 1}"):
        gone = await http(bob, n1).delete(path)
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"
    assert (await http(bob, n1).delete("/v1/messages/x")).status_code == 400
    # MongoDB is the truth: with bob's offline store lost, sync still skips it.
    keys = Keys(RUN_NS)
    await redis_client.delete(keys.offline(bob), keys.offline_meta(bob))
    assert [m["mid"] for m in (await http(bob, n1).get("/v1/sync")).json()["msgs"]] == mids[:2]


async def test_typing_reaches_the_peer_once_per_interval(make_node, connect, http):
    n1, n2 = await two_nodes(make_node)
    alice, bob, carol = uid("a"), uid("b"), uid("c")
    a, b = await connect(n1, alice), await connect(n2, bob)
    await a.send_raw(f'{{"op":"typing","conv":"{bob}"}}')
    assert await b.next_push("typing") == {"op": "typing", "conv": alice, "from": alice}
    await a.send_raw(f'{{"op":"typing","conv":"{bob}"}}')  # within 2 s: dropped
    g = (await http(alice, n1).post("/v1/groups", json={"name": "g", "members": [bob, carol]})
         ).json()["group"]
    c = await connect(n2, carol)
    await c.request("ping")
    await a.request("ping")
    await a.send_raw(f'{{"op":"typing","conv":"g:{g}"}}')
    for d in (b, c):
        assert await d.next_push("typing") == {"op": "typing", "conv": f"g:{g}", "from": alice}
    assert [f for f in b.drain_pushes() if f["op"] == "typing"] == []
    bad = await a.request("typing", conv="bad id")
    assert bad["code"] == "bad_request"


async def test_recall_in_small_and_big_groups(make_node, connect, http, redis_client):
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=3)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a, b = await connect(n1, alice), await connect(n2, bob)
    small = (await http(alice, n1).post("/v1/groups", json={
        "name": "s", "members": [bob, carol]})).json()["group"]
    big = (await http(alice, n1).post("/v1/groups", json={
        "name": "b", "members": [bob, carol, dave]})).json()["group"]
    await b.request("ping")
    for g in (small, big):
        mids = [(await a.request("group_send", group=g, cmid=f"{g}{i}", body=f"t{i}"))["mid"]
                for i in range(3)]
        assert await unread_of(http, carol, n1, f"g:{g}") == 3
        assert (await b.request("recall", mid=mids[1]))["code"] == "forbidden"
        assert (await a.request("recall", mid=mids[1]))["op"] == "ok"
        got = await b.next_push("recalled")
        assert got == {"op": "recalled", "mid": mids[1], "conv": f"g:{g}", "by": alice}
        assert await unread_of(http, carol, n2, f"g:{g}") == 2
        hist = (await http(carol, n2).get(f"/v1/history/g:{g}")).json()["msgs"]
        by_mid = {m["mid"]: m for m in hist}
        assert by_mid[mids[1]]["recalled"] is True and "body" not in by_mid[mids[1]]
        assert by_mid[mids[0]]["body"] == "t0"
        sync = {m["mid"]: m for m in (await http(carol, n1).get("/v1/sync")).json()["msgs"]}
        assert sync[mids[1]].get("recalled") is True and "body" not in sync[mids[1]]
        # Recalling the newest shows its tombstone as the conversation's last.
        assert (await a.request("recall", mid=mids[2]))["op"] == "ok"
        assert (await b.next_push("recalled"))["mid"] == mids[2]
        row = next(c for c in (await conversations(http, carol, n1))["conversations"]
                   if c["conv"] == f"g:{g}")
        assert row["unread"] == 1 and row["last"]["recalled"] is True
        # The group's state lost from Redis: rebuilt from MongoDB, recalls included.
        await redis_client.delete(Keys(RUN_NS).group_state(g))
        assert await unread_of(http, carol, n2, f"g:{g}") == 1
        assert await unread_of(http, bob, n2, f"g:{g}") == 1


async def test_a_read_of_a_message_not_in_that_conversation_pushes_no_receipt(node, connect):
    """A receipt goes to a 1:1 peer only for a message of that conversation: a
    `read` naming any other user or mid is `not_found` and tells no one."""
    alice, bob, mallory = uid("a"), uid("b"), uid("m")
    a, b, m = await connect(node, alice), await connect(node, bob), await connect(node, mallory)
    mid = (await a.request("send", to=bob, cmid="c1", body="hi"))["mid"]
    await b.next_push("msg")
    own = (await m.request("send", to=alice, cmid="c2", body="yo"))["mid"]
    await a.next_push("msg")
    for conv, target in ((bob, mid), (bob, own), (alice, mid)):  # another's message
        r = await m.request("read", conv=conv, mid=target)
        assert r["op"] == "error" and r["code"] == "not_found", r
    r = await m.request("read", conv=alice, mid=own)  # its own conversation: fine
    assert r["op"] == "ok"
    await a.next_push("receipt")
    await asyncio.sleep(0.3)  # pushes from the refused reads would be here by now
    assert [f for f in b.drain_pushes() if f["op"] == "receipt"] == []
    assert [f for f in a.drain_pushes() if f["op"] == "receipt"] == []
