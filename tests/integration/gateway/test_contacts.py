"""Contacts, privacy settings and blocks on real nodes (docs/protocol.md,
"Contacts, privacy settings and blocks"): presence shown to contacts by
default, 1:1 sends refused by a block or ``dm: contacts`` with nothing stored,
typing and receipts only where a send would be allowed, group adds refused
by ``group_add`` or a block, new conversations capped per day, and a change
made through one node in force on another at once."""

from __future__ import annotations

import asyncio

from gateway.node import Node
from testkit.poll import until
from tests.conftest import settle, uid


async def _no(device, op: str) -> None:
    """Nothing of ``op`` arrived (a ping's answer comes after anything queued before)."""
    await device.request("ping")
    assert [f for f in device.drain_pushes() if f["op"] == op] == []


def _changes(node: Node) -> float:
    return node.metrics.controls.labels("RelationChange")._value.get()


async def _told(node: Node, before: float) -> None:
    """``node`` applied a relation change told after ``before`` was read: it
    reaches the other nodes through the broker, not with the answer."""
    assert await until(lambda: _changes(node) > before, timeout=5)


async def test_presence_is_shown_to_contacts_only_by_default(make_node, connect, http):
    node = await make_node(presence_grace_s=0.3)
    watcher, user = uid("w"), uid("u")
    w = await connect(node, watcher)
    await connect(node, user)
    r = await w.request("presence_sub", users=[user])
    assert r["users"] == {user: {"hidden": True}}
    page = (await http(watcher, node).get("/v1/presence", params={"users": user})).json()
    assert page["users"] == {user: {"hidden": True}}
    await w.request("presence_unsub", users=[user])
    # user follows watcher: watcher is now one of user's contacts.
    assert (await http(user, node).post(f"/v1/follow/{watcher}")).status_code == 200
    r = await w.request("presence_sub", users=[user])
    assert r["users"][user]["online"] is True
    page = (await http(watcher, node).get("/v1/presence", params={"users": user})).json()
    assert page["users"][user]["online"] is True
    # presence: nobody hides it from contacts too.
    hu = http(user, node)
    r2 = await hu.request("PATCH", "/v1/settings/privacy", json={"presence": "nobody"})
    assert r2.json() == {"dm": "everyone", "presence": "nobody", "group_add": "everyone"}
    page = (await http(watcher, node).get("/v1/presence", params={"users": user})).json()
    assert page["users"] == {user: {"hidden": True}}


async def test_a_stranger_gets_no_presence_push(make_node, connect):
    node = await make_node(presence_grace_s=0.3)
    watcher, user = uid("w"), uid("u")
    w = await connect(node, watcher)
    await w.request("presence_sub", users=[user])
    later = await connect(node, user)
    await later.close()
    await asyncio.sleep(0.6)  # past the presence grace: an offline push would be out
    await _no(w, "presence")


async def test_a_blocked_users_sends_are_forbidden_and_store_nothing(
        make_node, connect, http, mongo_db):
    n1, n2 = await make_node(), await make_node()
    await settle(n1, n2)
    a, b = uid("a"), uid("b")
    ca, cb = await connect(n1, a), await connect(n2, b)
    first = await ca.request("send", to=b, cmid="before", body="hi")
    assert first["op"] == "ack"
    await cb.next_push("msg")
    # b blocks a through node 2; node 1 refuses a's next send once told.
    told = _changes(n1)
    assert (await http(b, n2).post(f"/v1/blocks/{a}")).json() == {"ok": True}
    await _told(n1, told)
    r = await ca.request("send", to=b, cmid="after", body="hi again")
    assert r["op"] == "error" and r["code"] == "forbidden"
    assert await mongo_db.messages.count_documents({"from": a, "cmid": "after"}) == 0
    await ca.send({"op": "typing", "conv": b})
    assert (await ca.request("read", conv=b, mid=first["mid"]))["op"] == "ok"
    await _no(cb, "typing")
    await _no(cb, "receipt")
    blocks = (await http(b, n2).get("/v1/blocks")).json()
    assert blocks == {"users": [a], "cursor": None}
    # b still writes to a (a block is one way), and unblocking lets a write again.
    assert (await cb.request("send", to=a, cmid="b1", body="yo"))["op"] == "ack"
    told = _changes(n1)
    assert (await http(b, n2).delete(f"/v1/blocks/{a}")).json() == {"ok": True}
    await _told(n1, told)
    assert (await ca.request("send", to=b, cmid="again", body="x"))["op"] == "ack"


async def test_dm_contacts_only_and_typing_to_strangers(make_node, connect, http, mongo_db):
    node = await make_node()
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    r = await http(b, node).request("PATCH", "/v1/settings/privacy", json={"dm": "contacts"})
    assert r.json()["dm"] == "contacts"
    r = await ca.request("send", to=b, cmid="c1", body="hello stranger")
    assert r["op"] == "error" and r["code"] == "forbidden" and "contacts" in r["message"]
    assert await mongo_db.messages.count_documents({"from": a, "cmid": "c1"}) == 0
    await ca.send({"op": "typing", "conv": b})
    await _no(cb, "typing")
    # Once b writes to a, a is b's contact.
    assert (await cb.request("send", to=a, cmid="b1", body="hi"))["op"] == "ack"
    assert (await ca.request("send", to=b, cmid="c2", body="hi back"))["op"] == "ack"
    await ca.send({"op": "typing", "conv": b})
    assert (await cb.next_push("typing"))["from"] == a


async def test_group_adds_refused_by_privacy_or_a_block(make_node, http):
    node = await make_node()
    owner, shy, blocker, open_ = uid("o"), uid("s"), uid("b"), uid("e")
    await http(shy, node).request("PATCH", "/v1/settings/privacy", json={"group_add": "contacts"})
    await http(blocker, node).post(f"/v1/blocks/{owner}")
    r = await http(owner, node).post("/v1/groups", json={"name": "g",
                                                         "members": [shy, blocker, open_]})
    assert sorted(r.json()["refused"]) == sorted([shy, blocker])
    g = r.json()["group"]
    await http(shy, node).post(f"/v1/follow/{owner}")  # owner is now shy's contact
    r = await http(owner, node).post(f"/v1/groups/{g}/members", json={"members": [shy, blocker]})
    assert r.json() == {"ok": True, "refused": [blocker]}


async def test_new_conversations_per_day_are_capped(make_node, connect):
    node = await make_node(max_new_convs_per_day=2)
    a = uid("a")
    ca = await connect(node, a)
    peers = [uid("p") for _ in range(3)]
    for p in peers[:2]:
        assert (await ca.request("send", to=p, cmid=f"to-{p}", body="hi"))["op"] == "ack"
    r = await ca.request("send", to=peers[2], cmid="third", body="hi")
    assert r["code"] == "forbidden" and "IM_MAX_NEW_CONVS_PER_DAY" in r["message"]
    # Conversations already started, and users who wrote first, are not new.
    assert (await ca.request("send", to=peers[0], cmid="again", body="x"))["op"] == "ack"
    writer = uid("w")
    cw = await connect(node, writer)
    assert (await cw.request("send", to=a, cmid="w1", body="hello a"))["op"] == "ack"
    assert (await ca.request("send", to=writer, cmid="reply", body="hi w"))["op"] == "ack"


async def test_privacy_settings_reject_bad_values(make_node, http):
    node = await make_node()
    hu = http(uid("u"), node)
    assert (await hu.get("/v1/settings/privacy")).json() == {
        "dm": "everyone", "presence": "contacts", "group_add": "everyone"}
    for body in ({"dm": "friends"}, {"presence": 1}, {"colour": "red"}):
        r = await hu.request("PATCH", "/v1/settings/privacy", json=body)
        assert r.status_code == 400, body
    assert (await hu.get("/v1/settings/privacy")).json()["dm"] == "everyone"


async def test_a_watch_ends_when_the_watched_user_hides_its_presence(make_node, connect, http):
    n1, n2 = await make_node(presence_grace_s=0.3), await make_node(presence_grace_s=0.3)
    await settle(n1, n2)
    watcher, user, other = uid("w"), uid("u"), uid("o")
    assert (await http(user, n1).post(f"/v1/follow/{watcher}")).status_code == 200
    assert (await http(other, n1).post(f"/v1/follow/{watcher}")).status_code == 200
    w = await connect(n2, watcher)
    r = await w.request("presence_sub", users=[user, other])
    assert r["users"][user] == {"online": False, "last_seen": None}
    # user hides its presence from everyone (told through node 1): node 2 ends the
    # watch, so no change of user reaches the watcher any more; other's still do.
    told = _changes(n2)
    hu = http(user, n1)
    assert (await hu.request("PATCH", "/v1/settings/privacy",
                             json={"presence": "nobody"})).status_code == 200
    await _told(n2, told)
    assert await until(lambda: user not in n2.app.watchers.watchers, timeout=5)
    await connect(n1, user)
    await connect(n1, other)
    while other not in (f := await w.next_push("presence"))["users"]:
        assert user not in f["users"]
    await _no(w, "presence")
    assert (await w.request("presence_sub", users=[user]))["users"] == {user: {"hidden": True}}
