"""Caps that keep one user from putting others in unbounded numbers of groups,
on a real node: creations per minute, groups owned, groups joined (an add
past it leaves that user out, in ``refused``), and ``GET /v1/groups`` paged."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.conftest import uid


async def test_creations_per_minute_are_capped_across_nodes(make_node, http):
    node = await make_node(group_creates_per_min=3)
    node2 = await make_node(group_creates_per_min=3)
    # The quota counts per wall-clock minute: start well inside one.
    if time.time() % 60 > 50:
        await asyncio.sleep(60 - time.time() % 60)
    a, b = uid("a"), uid("b")
    ha = http(a, node)
    made = [await ha.post("/v1/groups", json={"name": f"g{i}"}) for i in range(4)]
    assert [r.status_code for r in made] == [200, 200, 200, 429]
    assert made[3].json()["error"]["code"] == "rate_limited"
    assert "IM_GROUP_CREATES_PER_MIN" in made[3].json()["error"]["message"]
    assert made[0].json()["refused"] == []
    # Another user's budget is its own.
    hb = http(b, node)
    assert (await hb.post("/v1/groups", json={"name": "b"})).status_code == 200
    # The same user on another node: the minute's count is shared.
    assert (await http(a, node2).post("/v1/groups", json={"name": "g4"})).status_code == 429


async def test_owned_cap(make_node, http):
    node = await make_node(max_groups_owned=2)
    ha = http(uid("a"), node)
    assert [(await ha.post("/v1/groups", json={"name": f"g{i}"})).status_code
            for i in range(3)] == [200, 200, 403]
    err = (await ha.post("/v1/groups", json={"name": "x"})).json()["error"]
    assert err["code"] == "forbidden" and "IM_MAX_GROUPS_OWNED" in err["message"]
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(f"http://127.0.0.1:{node.metrics_port}/metrics")).text
    assert 'im_limit_refusals_total{limit="max_groups_owned"} 2.0' in metrics


async def test_a_user_at_its_joined_cap_is_refused_and_the_rest_added(make_node, http):
    node = await make_node(max_groups_joined=2)
    victim, other = uid("v"), uid("o")
    owners = [uid("a"), uid("b"), uid("c")]
    for o in owners[:2]:
        r = await http(o, node).post("/v1/groups", json={"name": "n", "members": [victim]})
        assert r.json()["refused"] == []
    hc = http(owners[2], node)
    r = await hc.post("/v1/groups", json={"name": "n", "members": [victim, other]})
    assert r.status_code == 200 and r.json()["refused"] == [victim]
    g = r.json()["group"]
    r = await hc.post(f"/v1/groups/{g}/members", json={"members": [victim]})
    assert r.json() == {"ok": True, "refused": [victim]}
    assert (await http(victim, node).get(f"/v1/groups/{g}")).status_code == 403
    assert (await http(other, node).get(f"/v1/groups/{g}")).json()["members"] == 2
    mine = (await http(victim, node).get("/v1/groups")).json()
    assert len(mine["groups"]) == 2 and mine["cursor"] is None


async def test_my_groups_are_paged(make_node, http):
    node = await make_node()
    user = uid("u")
    hu = http(user, node)
    made = sorted([(await hu.post("/v1/groups", json={"name": f"g{i}"})).json()["group"]
                   for i in range(5)])
    seen, cursor, pages = [], None, 0
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await hu.get("/v1/groups", params=params)).json()
        seen += [x["group"] for x in page["groups"]]
        pages += 1
        cursor = page["cursor"]
        if cursor is None:
            break
    assert seen == made and pages == 3
    r = await http(uid("x"), node).get("/v1/groups", params={"cursor": cursor or "AAAA"})
    assert r.status_code == 400  # another list's cursor, or none at all
    assert (await hu.get("/v1/groups", params={"limit": 201})).status_code == 400


async def test_conversations_are_paged_over_chats_and_groups_together(make_node, connect, http):
    node = await make_node()
    me, owner = uid("me"), uid("o")
    ho, hm = http(owner, node), http(me, node)
    groups = [(await ho.post("/v1/groups", json={"name": f"g{i}", "members": [me]})).json()
              ["group"] for i in range(5)]
    co = await connect(node, owner)
    for i, g in enumerate(groups[:3]):  # two groups stay without a message
        assert (await co.request("group_send", group=g, cmid=f"g{i}", body=i))["op"] == "ack"
    for i in range(4):
        cp = await connect(node, uid("p"))
        assert (await cp.request("send", to=me, cmid="c", body=i))["op"] == "ack"
    whole = (await hm.get("/v1/conversations", params={"limit": 50})).json()
    assert len(whole["conversations"]) == 9 and whole["cursor"] is None
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = (await hm.get("/v1/conversations", params=params)).json()
        assert len(page["conversations"]) <= 2
        assert page["total_unread"] == whole["total_unread"] == 7
        seen += [r["conv"] for r in page["conversations"]]
        if (cursor := page["cursor"]) is None:
            break
    assert seen == [r["conv"] for r in whole["conversations"]]
    bad = await hm.get("/v1/conversations", params={"cursor": "x" * 20})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_request"
    mine = (await hm.get("/v1/conversations", params={"limit": 1})).json()["cursor"]
    other = await ho.get("/v1/conversations", params={"limit": 1, "cursor": mine})
    assert other.status_code == 400  # a cursor of another user's list


async def test_a_user_in_many_groups_pays_more_for_its_lists(make_node, http):
    """A page of its group list reads every group of the caller, and so does
    its first sync (which seeds its index of groups with news; later ones
    read the groups with news only): such a call of a user in GROUPS_PER_CALL
    (1,000; 50 here) groups costs it two calls of its HTTP budget, a user in
    none one."""
    node = await make_node(http_rate=0.01, http_burst=6, group_creates_per_min=1000)
    node.app.conversations.groups_per_call = 50
    # busy has 6 tokens: the first sync costs 2, the next ones 1 (no news since);
    # every group list costs 2.
    for path, busy_allowed in (("/v1/sync", 5), ("/v1/groups?limit=1", 3)):
        busy, idle = uid("busy"), uid("idle")
        owners = [http(uid("o"), node) for _ in range(10)]  # five groups each: within budget
        for i in range(50):
            r = await owners[i // 5].post("/v1/groups", json={"name": f"g{i}", "members": [busy]})
            assert r.status_code == 200
        for user, allowed in ((busy, busy_allowed), (idle, 6)):
            codes = [(await http(user, node).get(path)).status_code for _ in range(7)]
            assert codes == [200] * allowed + [429] * (7 - allowed), (path, user, codes)
