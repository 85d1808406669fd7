"""Edit, reactions, replies and per-conversation settings on two nodes
(docs/protocol.md, "Edit, reactions, replies, conversation settings"): every
device told, an offline user sees the edit and the reactions after sync,
MongoDB the truth once Redis lost its copies, a recalled message neither
edited nor reacted to, ``reply_to`` kept within its conversation, a muted
conversation publishing no offline push event while unread still counts."""

from __future__ import annotations

import asyncio

import httpx

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, settle, uid
from tests.integration.gateway.test_events import events  # noqa: F401 - a fixture

KEY = "k-" + "0123456789abcdef" * 2


async def two_nodes(make_node, **kw):
    n1, n2 = await make_node(**kw), await make_node(**kw)
    await settle(n1, n2)
    return n1, n2


async def by_mid(http, user, node, path) -> dict[int, dict]:
    r = await http(user, node).get(path)
    assert r.status_code == 200, r.text
    return {m["mid"]: m for m in r.json()["msgs"]}


async def row_of(http, user, node, conv) -> dict:
    r = await http(user, node).get("/v1/conversations")
    assert r.status_code == 200, r.text
    return next(c for c in r.json()["conversations"] if c["conv"] == conv)


async def new_group(http, owner, node, members) -> str:
    r = await http(owner, node).post("/v1/groups", json={"name": "g", "members": members})
    assert r.status_code == 200, r.text
    return str(r.json()["group"])


# -- edit ----------------------------------------------------------------------------
async def test_an_edit_reaches_every_device_and_an_offline_user_syncs_the_new_body(
        make_node, connect, http, redis_client):
    n1, n2 = await two_nodes(make_node)
    alice, bob = uid("a"), uid("b")
    a1, a2 = await connect(n1, alice), await connect(n2, alice)
    mids = [(await a1.request("send", to=bob, cmid=f"c{i}", body={"text": f"m{i}"}))["mid"]
            for i in range(2)]
    for _ in mids:
        await a2.next_push("msg")
    assert (await a1.request("edit", mid=mids[1], body={"text": "fixed"}))["op"] == "ok"
    pushed = await a2.next_push("edited")
    assert pushed["mid"] == mids[1] and pushed["conv"] == bob
    assert pushed["body"] == {"text": "fixed"} and isinstance(pushed["edited"], int)
    # bob was offline: his sync, history and conversation list have the new body.
    sync = await by_mid(http, bob, n2, "/v1/sync")
    assert sync[mids[1]]["body"] == {"text": "fixed"}
    assert sync[mids[1]]["edited"] == pushed["edited"]
    assert sync[mids[0]]["body"] == {"text": "m0"} and "edited" not in sync[mids[0]]
    hist = await by_mid(http, bob, n1, f"/v1/history/{alice}")
    assert hist[mids[1]]["body"] == {"text": "fixed"} and hist[mids[1]]["edited"]
    assert (await row_of(http, bob, n1, alice))["last"]["body"] == {"text": "fixed"}
    assert (await row_of(http, alice, n2, bob))["last"]["body"] == {"text": "fixed"}
    # bob online now: a second edit reaches him on the other node too.
    b = await connect(n2, bob)
    assert (await a2.request("edit", mid=mids[1], body="again"))["op"] == "ok"
    got = await b.next_push("edited")
    assert (got["mid"], got["conv"], got["body"]) == (mids[1], alice, "again")
    assert got["edited"] > pushed["edited"]
    # Redis lost bob's offline store: sync reads MongoDB, still the new body.
    keys = Keys(RUN_NS)
    await redis_client.delete(keys.offline(bob), keys.offline_meta(bob))
    assert (await by_mid(http, bob, n1, "/v1/sync"))[mids[1]]["body"] == "again"
    # Only the sender; never after a recall; an unknown mid is not_found.
    assert (await b.request("edit", mid=mids[1], body="mine"))["code"] == "forbidden"
    assert (await a1.request("edit", mid=mids[1] + 12345, body="x"))["code"] == "not_found"
    assert (await a1.request("edit", mid=mids[1]))["code"] == "bad_request"  # no body
    assert (await a1.request("recall", mid=mids[0]))["op"] == "ok"
    refused = await a1.request("edit", mid=mids[0], body="back")
    assert refused["code"] == "forbidden"
    hist = await by_mid(http, bob, n1, f"/v1/history/{alice}")
    assert hist[mids[0]]["recalled"] is True and "body" not in hist[mids[0]]


async def test_the_edit_window_closes(make_node, connect, http):
    node = await make_node(edit_window_s=1.0)
    alice, bob = uid("a"), uid("b")
    a = await connect(node, alice)
    mid = (await a.request("send", to=bob, cmid="c1", body="typo"))["mid"]
    await asyncio.sleep(1.1)  # past the window (a time limit, not a race)
    refused = await a.request("edit", mid=mid, body="late")
    assert (refused["code"], refused["message"]) == ("forbidden", "the edit window has passed")
    assert (await by_mid(http, bob, node, "/v1/sync"))[mid]["body"] == "typo"


async def test_edits_in_small_and_big_groups(make_node, connect, http):
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=3)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a, b = await connect(n1, alice), await connect(n2, bob)
    small = await new_group(http, alice, n1, [bob, carol])
    big = await new_group(http, alice, n1, [bob, carol, dave])  # read diffusion
    await b.request("ping")
    for g in (small, big):
        conv = f"g:{g}"
        mids = [(await a.request("group_send", group=g, cmid=f"{g}{i}", body=f"t{i}"))["mid"]
                for i in range(2)]
        await until(lambda mids=mids: carol_sees(http, carol, n1, mids), timeout=10)
        assert (await b.request("edit", mid=mids[1], body="no"))["code"] == "forbidden"
        for m in mids:
            assert (await a.request("edit", mid=m, body=f"new {m}"))["op"] == "ok"
            got = await b.next_push("edited")
            assert (got["mid"], got["conv"], got["body"]) == (m, conv, f"new {m}")
        # carol (offline) reads the new bodies: sync, history, the group's last.
        sync = await by_mid(http, carol, n2, "/v1/sync")
        hist = await by_mid(http, carol, n1, f"/v1/history/{conv}")
        for m in mids:
            assert sync[m]["body"] == hist[m]["body"] == f"new {m}"
            assert sync[m]["edited"] and hist[m]["edited"]
        assert (await row_of(http, carol, n2, conv))["last"]["body"] == f"new {mids[1]}"


async def carol_sees(http, carol, node, mids) -> bool:
    return set(mids) <= set(await by_mid(http, carol, node, "/v1/sync"))


# -- reactions -----------------------------------------------------------------------
async def test_reactions_are_counted_pushed_idempotent_and_synced(make_node, connect, http,
                                                                  redis_client):
    n1, n2 = await two_nodes(make_node, reaction_emoji_max=3)
    alice, bob, eve = uid("a"), uid("b"), uid("e")
    a1, a2, b = await connect(n1, alice), await connect(n2, alice), await connect(n2, bob)
    mid = (await a1.request("send", to=bob, cmid="c1", body="hello"))["mid"]
    other = (await a1.request("send", to=bob, cmid="c2", body="second"))["mid"]
    await b.next_push("msg")
    await b.next_push("msg")
    assert (await b.request("react", mid=mid, emoji="👍", on=True))["op"] == "ok"
    for d in (a1, a2):
        assert await d.next_push("reaction") == {"op": "reaction", "mid": mid, "conv": bob,
                                                 "from": bob, "emoji": "👍", "on": True}
    assert (await a1.request("react", mid=mid, emoji="👍", on=True))["op"] == "ok"
    assert (await b.next_push("reaction"))["conv"] == alice
    for d in (a1, a2):  # the reacting user's devices too (the one that asked included)
        assert (await d.next_push("reaction"))["from"] == alice
    # The same state twice changes nothing and pushes nothing.
    assert (await b.request("react", mid=mid, emoji="👍", on=True))["op"] == "ok"
    assert (await b.request("react", mid=mid, emoji="🎉", on=True))["op"] == "ok"
    for d in (a1, a2):
        assert (await d.next_push("reaction"))["emoji"] == "🎉"  # the 👍 repeat made none
    # alice's offline store and MongoDB agree: sync and history carry the counts.
    sync = await by_mid(http, alice, n1, "/v1/sync")
    assert sync[mid]["reactions"] == {"👍": 2, "🎉": 1}
    assert "reactions" not in sync[other]
    hist = await by_mid(http, bob, n2, f"/v1/history/{alice}")
    assert hist[mid]["reactions"] == {"👍": 2, "🎉": 1}
    # Who reacted, paged.
    users = await http(alice, n2).get(f"/v1/messages/{mid}/reactions",
                                      params={"emoji": "👍", "limit": 1})
    assert users.status_code == 200, users.text
    page = users.json()
    assert len(page["users"]) == 1 and page["cursor"] == page["users"][0]
    rest = (await http(alice, n2).get(f"/v1/messages/{mid}/reactions", params={
        "emoji": "👍", "limit": 1, "cursor": page["cursor"]})).json()
    assert sorted(page["users"] + rest["users"]) == sorted([alice, bob])
    assert rest["cursor"] is None
    # Removing one; the emoji cap (3 here); a stranger; bad input.
    assert (await b.request("react", mid=mid, emoji="🎉", on=False))["op"] == "ok"
    assert (await a2.next_push("reaction"))["on"] is False
    for e in ("a", "b"):
        assert (await b.request("react", mid=mid, emoji=e, on=True))["op"] == "ok"
    full = await b.request("react", mid=mid, emoji="c", on=True)
    assert full["code"] == "forbidden" and "3 distinct emoji" in full["message"]
    assert (await b.request("react", mid=mid, emoji="a", on=False))["op"] == "ok"
    assert (await b.request("react", mid=mid, emoji="c", on=True))["op"] == "ok"
    e = await connect(n1, eve)
    assert (await e.request("react", mid=mid, emoji="👍", on=True))["code"] == "not_found"
    r = await http(eve, n1).get(f"/v1/messages/{mid}/reactions", params={"emoji": "👍"})
    assert r.status_code == 404
    for bad in ("", "x" * 33, "\n", 5):
        assert (await b.request("react", mid=mid, emoji=bad, on=True))["code"] == "bad_request"
    assert (await b.request("react", mid=mid, emoji="x", on="yes"))["code"] == "bad_request"
    # Redis lost every count of the message: MongoDB's reactions rebuild them.
    keys = Keys(RUN_NS)
    await redis_client.delete(*[k for s in range(4) for k in (keys.reaction_counts(mid, s),
                                                              keys.reaction_users(mid, s))])
    hist = await by_mid(http, bob, n1, f"/v1/history/{alice}")
    assert hist[mid]["reactions"] == {"👍": 2, "b": 1, "c": 1}
    # A recalled message takes no reaction and shows none.
    assert (await a1.request("recall", mid=mid))["op"] == "ok"
    assert (await b.request("react", mid=mid, emoji="👍", on=False))["code"] == "forbidden"
    hist = await by_mid(http, bob, n1, f"/v1/history/{alice}")
    assert "reactions" not in hist[mid]


async def test_reactions_in_a_read_diffusion_group(make_node, connect, http):
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=2)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a, b = await connect(n1, alice), await connect(n2, bob)
    g = await new_group(http, alice, n1, [bob, carol])
    await b.request("ping")
    mid = (await a.request("group_send", group=g, cmid="c1", body="vote"))["mid"]
    assert (await b.request("react", mid=mid, emoji="+1", on=True))["op"] == "ok"
    assert await a.next_push("reaction") == {"op": "reaction", "mid": mid, "conv": f"g:{g}",
                                             "from": bob, "emoji": "+1", "on": True}
    c = await connect(n1, carol)
    assert (await c.request("react", mid=mid, emoji="+1", on=True))["op"] == "ok"
    d = await connect(n2, dave)  # not a member
    assert (await d.request("react", mid=mid, emoji="+1", on=True))["code"] == "not_found"
    await until(lambda: synced_counts(http, carol, n2, mid, {"+1": 2}), timeout=10)
    hist = await by_mid(http, carol, n1, f"/v1/history/g:{g}")
    assert hist[mid]["reactions"] == {"+1": 2}


async def synced_counts(http, user, node, mid, want) -> bool:
    return (await by_mid(http, user, node, "/v1/sync")).get(mid, {}).get("reactions") == want


# -- replies -------------------------------------------------------------------------
async def test_reply_to_stays_within_its_conversation(make_node, connect, http):
    n1, n2 = await two_nodes(make_node, api_keys=KEY)
    alice, bob, carol = uid("a"), uid("b"), uid("c")
    a, b = await connect(n1, alice), await connect(n2, bob)
    first = (await a.request("send", to=bob, cmid="c1", body="question?"))["mid"]
    elsewhere = (await a.request("send", to=carol, cmid="c2", body="other"))["mid"]
    await b.next_push("msg")
    reply = await b.request("send", to=alice, cmid="r1", body="answer", reply_to=first)
    assert reply["op"] == "ack"
    pushed = await a.next_push("msg")
    assert (pushed["mid"], pushed["reply_to"]) == (reply["mid"], first)
    hist = await by_mid(http, alice, n2, f"/v1/history/{bob}")
    assert hist[reply["mid"]]["reply_to"] == first and "reply_to" not in hist[first]
    assert (await by_mid(http, alice, n1, "/v1/sync"))[reply["mid"]]["reply_to"] == first
    # A mid of another conversation, or of none: bad_request, nothing stored.
    for wrong in (elsewhere, first + 999, 0):
        refused = await b.request("send", to=alice, cmid=f"w{wrong}", body="x", reply_to=wrong)
        assert refused["code"] == "bad_request", refused
    hist = await by_mid(http, bob, n1, f"/v1/history/{alice}")
    assert set(hist) == {first, reply["mid"]}
    # Groups, and the server API.
    g = await new_group(http, alice, n1, [bob])
    gm = (await a.request("group_send", group=g, cmid="g1", body="in g"))["mid"]
    ok = await b.request("group_send", group=g, cmid="g2", body="re", reply_to=gm)
    assert ok["op"] == "ack"
    assert (await by_mid(http, alice, n1, f"/v1/history/g:{g}"))[ok["mid"]]["reply_to"] == gm
    bad = await b.request("group_send", group=g, cmid="g3", body="re", reply_to=first)
    assert bad["code"] == "bad_request"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        url = f"http://127.0.0.1:{n2.http_port}/v1/server/send"
        r = await c.post(url, headers={"X-API-Key": KEY}, json={
            "from": bob, "to": alice, "cmid": "s1", "body": "via api", "reply_to": first})
        assert r.status_code == 200, r.text
        r = await c.post(url, headers={"X-API-Key": KEY}, json={
            "from": bob, "to": alice, "cmid": "s2", "body": "via api", "reply_to": elsewhere})
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request", r.text


# -- conversation settings -----------------------------------------------------------
async def test_settings_sync_devices_pin_first_and_mute_offline_events(
        make_node, connect, http, events):  # noqa: F811 - the fixture
    n1, n2 = await two_nodes(make_node, pinned_max=2)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a1, a2 = await connect(n1, alice), await connect(n2, alice)
    for peer in (bob, carol, dave):
        c = await connect(n1, peer)
        await c.request("send", to=alice, cmid="c1", body=f"from {peer}")
        await c.close()
    # The oldest conversation, pinned, comes first; the other devices are told.
    r = await http(alice, n1).patch(f"/v1/conversations/{bob}", json={"pinned": True})
    assert r.status_code == 200, r.text
    assert r.json() == {"ok": True, "conv": bob, "muted": False, "pinned": True,
                        "archived": False}
    assert await a2.next_push("conv_settings") == {"op": "conv_settings", "conv": bob,
                                                   "muted": False, "pinned": True,
                                                   "archived": False}
    await a1.next_push("conv_settings")
    listed = (await http(alice, n2).get("/v1/conversations", params={"limit": 1})).json()
    assert [c["conv"] for c in listed["conversations"]] == [bob, dave]
    assert listed["conversations"][0]["pinned"] is True
    rest = (await http(alice, n2).get("/v1/conversations", params={
        "limit": 5, "cursor": listed["cursor"]})).json()
    assert [c["conv"] for c in rest["conversations"]] == [carol]  # bob is not listed twice
    assert (await http(alice, n1).patch(f"/v1/conversations/{carol}",
                                        json={"pinned": True, "archived": True})).status_code \
        == 200
    over = await http(alice, n1).patch(f"/v1/conversations/{dave}", json={"pinned": True})
    assert over.status_code == 403 and "IM_PINNED_MAX" in over.json()["error"]["message"]
    row = await row_of(http, alice, n1, carol)
    assert (row["pinned"], row["archived"], row["muted"]) == (True, True, False)
    for bad in ({"muted": "yes"}, {"loud": True}):
        r = await http(alice, n1).patch(f"/v1/conversations/{dave}", json=bad)
        assert r.status_code == 400, r.text
    assert (await http(alice, n1).patch(f"/v1/conversations/{alice}",
                                        json={"muted": True})).status_code == 400
    # Muted: no offline.msg while alice is offline; unread still counts.
    await http(alice, n1).patch(f"/v1/conversations/{dave}", json={"muted": True})
    await a1.close()
    await a2.close()
    d = await connect(n2, dave)
    b = await connect(n2, bob)
    await d.request("send", to=alice, cmid="m1", body="muted one")
    await b.request("send", to=alice, cmid="m2", body="loud one")
    got = await events.until(1)
    assert [(e["user"], e["conv"]) for e in got] == [(alice, bob)]
    assert len(await events.until(2, timeout=1.0)) == 1  # none for dave's
    assert (await row_of(http, alice, n1, dave))["unread"] == 2
    muted = sum(n.metrics.events.labels("offline.msg", "muted")._value.get() for n in (n1, n2))
    assert muted == 1
    # Unmuted: events again.
    await http(alice, n1).patch(f"/v1/conversations/{dave}", json={"muted": False})
    await d.request("send", to=alice, cmid="m3", body="heard")
    assert [e["conv"] for e in await events.until(2)] == [bob, dave]


async def test_a_muted_group_makes_no_offline_msg_and_offline_group_names_its_muters(
        make_node, connect, http, events):  # noqa: F811 - the fixture
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=3)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    small = await new_group(http, alice, n1, [bob, carol])
    big = await new_group(http, alice, n1, [bob, carol, dave])  # read diffusion
    for g in (small, big):
        r = await http(bob, n2).patch(f"/v1/conversations/g:{g}", json={"muted": True})
        assert r.status_code == 200, r.text
    stranger = await http(dave, n2).patch(f"/v1/conversations/g:{small}", json={"muted": True})
    assert stranger.status_code == 403
    a = await connect(n1, alice)
    await a.request("group_send", group=small, cmid="s1", body="small")
    await a.request("group_send", group=big, cmid="b1", body="big")
    got = await events.until(2)
    assert [(e["type"], e.get("user")) for e in got] == [("offline.msg", carol),
                                                         ("offline.group", None)]
    assert got[1]["muted"] == [bob]
    assert len(await events.until(3, timeout=1.0)) == 2  # none for bob in the small group
    r = await http(bob, n1).get("/v1/conversations")
    unread = {c["conv"]: (c["unread"], c["muted"]) for c in r.json()["conversations"]}
    assert unread[f"g:{small}"] == (1, True) and unread[f"g:{big}"] == (1, True)


async def test_a_device_that_already_had_the_messages_syncs_their_changes(
        make_node, connect, http):
    """bob synced past alice's messages, went away; meanwhile one was edited, one
    reacted to, one recalled: his sync from his cursor brings each back as it is
    now (a change has a position after the cursor), once."""
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=2)
    alice, bob, carol = uid("a"), uid("b"), uid("c")
    a = await connect(n1, alice)
    mids = [(await a.request("send", to=bob, cmid=f"c{i}", body=f"m{i}"))["mid"]
            for i in range(4)]
    g = await new_group(http, alice, n1, [bob, carol])  # read diffusion
    gmid = (await a.request("group_send", group=g, cmid="g1", body="in g"))["mid"]
    first = (await http(bob, n2).get("/v1/sync")).json()
    assert {mids[0], gmid} <= {m["mid"] for m in first["msgs"]} and not first["more"]
    cursor = await settled_cursor(http, bob, n2, first["next"], gmid)
    assert (await a.request("edit", mid=mids[1], body="m1 fixed"))["op"] == "ok"
    assert (await a.request("react", mid=mids[0], emoji="ok", on=True))["op"] == "ok"
    assert (await a.request("recall", mid=mids[2]))["op"] == "ok"
    assert (await a.request("edit", mid=gmid, body="in g, fixed"))["op"] == "ok"
    assert (await a.request("edit", mid=mids[1], body="m1 fixed twice"))["op"] == "ok"
    plain = (await http(bob, n1).get("/v1/sync", params={"since": cursor})).json()
    assert plain["msgs"] == []  # without changes=1: messages after the cursor only (v1)
    r = await http(bob, n1).get("/v1/sync", params={"since": cursor, "changes": 1})
    assert r.status_code == 200, r.text
    page = r.json()
    got = {m["mid"]: m for m in page["msgs"]}
    assert set(got) == {mids[0], mids[1], mids[2], gmid}  # each once, as it is now
    assert got[mids[1]]["body"] == "m1 fixed twice" and got[mids[1]]["edited"]
    assert got[mids[0]]["reactions"] == {"ok": 1} and got[mids[0]]["body"] == "m0"
    assert got[mids[2]]["recalled"] is True and "body" not in got[mids[2]]
    assert got[gmid]["body"] == "in g, fixed"
    again = await settled_cursor(http, bob, n2, page["next"], 0)
    assert (await http(bob, n2).get("/v1/sync", params={"since": again, "changes": 1})
            ).json()["msgs"] == []
    # A message bob deleted for himself stays deleted, whatever changes it.
    assert (await http(bob, n1).delete(f"/v1/messages/{mids[3]}")).status_code == 200
    assert (await a.request("react", mid=mids[3], emoji="ok", on=True))["op"] == "ok"
    later = (await http(bob, n1).get("/v1/sync", params={"since": again, "changes": 1})
             ).json()["msgs"]
    assert mids[3] not in {m["mid"] for m in later}


async def settled_cursor(http, user, node, since, wanted) -> int:
    """Sync on from ``since`` until a page is empty: the cursor past everything
    so far (a young message holds the cursor back for IM_SYNC_SETTLE_MS)."""
    for _ in range(100):
        page = (await http(user, node).get("/v1/sync", params={"since": since,
                                                               "changes": 1})).json()
        if not page["msgs"] and page["next"] >= wanted:
            return int(page["next"])
        since = page["next"]
        await asyncio.sleep(0.1)
    raise AssertionError("the sync cursor never settled")
