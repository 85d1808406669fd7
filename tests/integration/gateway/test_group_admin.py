"""Group administration on two real nodes and the real servers: listing, info,
member pages, rename, hand-over, leave, dissolve, read status, the
``group_event`` pushes, and the races (leave or dissolve against sends,
changes seen on the other node at once). Every wait polls with a deadline."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, settle, uid

KEY = "k-" + "0123456789abcdef" * 2


@pytest.fixture
async def two(make_node):
    nodes = [await make_node(http_rate=0, api_keys=KEY) for _ in range(2)]
    await settle(*nodes)
    return nodes


async def new_group(http: Any, owner: str, members: list[str], node: Any) -> str:
    r = await http(owner, node).post("/v1/groups", json={"name": "team", "members": members})
    assert r.status_code == 200, r.text
    return r.json()["group"]


async def patch(http: Any, user: str, node: Any, group: str, **body: Any) -> httpx.Response:
    return await http(user, node).request("PATCH", f"/v1/groups/{group}", json=body)


async def convs(http: Any, user: str, node: Any) -> dict[str, Any]:
    """The caller's conversations; their unread always add up to the total."""
    r = await http(user, node).get("/v1/conversations")
    assert r.status_code == 200, r.text
    c = r.json()
    assert c["total_unread"] == sum(x["unread"] for x in c["conversations"])
    return c


def unread_of(c: dict[str, Any], conv: str) -> int | None:
    return next((x["unread"] for x in c["conversations"] if x["conv"] == conv), None)


def code(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["code"]


async def events(device: Any, n: int) -> list[dict[str, Any]]:
    """The next ``n`` group_event pushes of ``device`` (10 s each at most)."""
    return [await device.next_push("group_event") for _ in range(n)]


def ev(g: str, name: str, users: list[str], by: str) -> dict[str, Any]:
    return {"op": "group_event", "group": g, "event": name, "users": users, "by": by}


# -- every call and its bad input ----------------------------------------------------------
async def test_every_call_refuses_bad_input(two, http, connect):
    n1, n2 = two
    owner, m, x = uid("o"), uid("m"), uid("x")
    g = await new_group(http, owner, [m], n1)
    mid = (await (await connect(n2, m)).request("group_send", group=g, cmid="c1",
                                                 body="hi"))["mid"]
    bad_ids = ["a b", "x" * 65, "a*", "%00"]
    calls = [("GET", "/v1/groups/{g}", None), ("GET", "/v1/groups/{g}/members", None),
             ("PATCH", "/v1/groups/{g}", {"name": "n"}), ("POST", "/v1/groups/{g}/leave", None),
             ("DELETE", "/v1/groups/{g}", None), ("GET", "/v1/groups/{g}/reads/" + str(mid),
                                                  None)]
    for method, path, body in calls:
        for bad in bad_ids:
            r = await http(owner, n2).request(method, path.format(g=bad), json=body)
            assert code(r) == (400, "bad_request"), (method, path, bad, r.text)
        r = await http(owner, n1).request(method, path.format(g="nosuchgroup"), json=body)
        assert code(r) == (404, "not_found"), (method, path)
        r = await http(x, n2).request(method, path.format(g=g), json=body)  # not a member
        assert code(r) == (403, "forbidden"), (method, path, r.text)
    # owner only
    assert code(await patch(http, m, n2, g, name="mine")) == (403, "forbidden")
    assert code(await http(m, n1).delete(f"/v1/groups/{g}")) == (403, "forbidden")
    assert code(await http(m, n2).post(f"/v1/groups/{g}/members",
                                       json={"members": [x]})) == (403, "forbidden")
    assert code(await http(m, n2).delete(f"/v1/groups/{g}/members/{owner}")) == \
        (403, "forbidden")
    # the owner may not leave; a hand-over goes to a member only
    assert code(await http(owner, n2).post(f"/v1/groups/{g}/leave")) == (400, "bad_request")
    assert code(await patch(http, owner, n1, g, owner=x)) == (400, "bad_request")
    bad_bodies: list[dict[str, Any]] = [
        {}, {"name": ""}, {"name": "n" * 129}, {"name": 5}, {"owner": "g:x"}, {"owner": "a b"},
        {"name": "n", "extra": 1}, {"name": None}]
    for bad_body in bad_bodies:
        r = await patch(http, owner, n2, g, **bad_body)
        assert code(r) == (400, "bad_request"), (bad_body, r.text)
    r = await http(owner, n1).request("PATCH", f"/v1/groups/{g}", content=b"[1]",
                                      headers={"Content-Type": "application/json"})
    assert code(r) == (400, "bad_request")
    # pages and read status
    for params in ({"limit": 0}, {"limit": 1001}, {"limit": "x"}, {"cursor": ""},
                   {"cursor": "not-a-cursor"}, {"cursor": "x" * 200}):
        r = await http(m, n2).get(f"/v1/groups/{g}/members", params=params)
        assert code(r) == (400, "bad_request"), (params, r.text)
    for bad_mid in ("-1", "x", str(2**63)):
        r = await http(m, n1).get(f"/v1/groups/{g}/reads/{bad_mid}")
        assert code(r) == (400, "bad_request"), bad_mid
    assert code(await http(m, n1).get(f"/v1/groups/{g}/reads/{mid + 1}")) == (404, "not_found")
    assert (await patch(http, owner, n1, g, name="ok")).status_code == 200


# -- reading --------------------------------------------------------------------------
async def test_listing_info_and_member_pages(two, http):
    n1, n2 = two
    owner = uid("o")
    members = sorted(uid("m") for _ in range(24))
    g = await new_group(http, owner, members, n1)
    other = await new_group(http, members[0], [owner], n2)
    mine = (await http(owner, n2).get("/v1/groups")).json()["groups"]
    listed: list[dict[str, Any]] = [
        {"group": g, "name": "team", "owner": owner, "members": 25},
        {"group": other, "name": "team", "owner": members[0], "members": 2}]
    assert mine == sorted(listed, key=lambda x: x["group"])
    assert (await http(members[3], n1).get(f"/v1/groups/{g}")).json() == \
        {"group": g, "name": "team", "owner": owner, "members": 25}
    seen: list[str] = []
    cursor = None
    for i in range(10):  # the pages from either node
        params: dict[str, Any] = {"limit": 10, **({"cursor": cursor} if cursor else {})}
        page = (await http(members[5], two[i % 2]).get(
            f"/v1/groups/{g}/members", params=params)).json()
        seen += page["users"]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert seen == sorted([owner, *members])
    whole = (await http(owner, n1).get(f"/v1/groups/{g}/members")).json()
    assert whole == {"users": seen, "cursor": None}  # default limit 100
    first = (await http(owner, n1).get(f"/v1/groups/{g}/members", params={"limit": 3})).json()
    r = await http(owner, n1).get(f"/v1/groups/{other}/members",
                                  params={"cursor": first["cursor"]})
    assert code(r) == (400, "bad_request")  # a cursor of another list


async def test_read_status_is_exact(make_node, connect, http):
    n1 = await make_node(http_rate=0, group_write_diffusion_max=5)
    n2 = await make_node(http_rate=0, group_write_diffusion_max=5)
    await settle(n1, n2)
    a, b, c, e, late = (uid(p) for p in "abcel")
    g = await new_group(http, a, [b, c, e], n1)
    ca, cb = await connect(n1, a), await connect(n2, b)
    sent = [(await ca.request("group_send", group=g, cmid=f"a{i}", body=i))["mid"]
            for i in range(3)]
    assert (await cb.request("read", conv=f"g:{g}", mid=sent[1]))["op"] == "ok"
    r = await http(c, n1).post(f"/v1/conversations/g:{g}/read", json={"mid": sent[0]})
    assert r.status_code == 200
    assert (await http(a, n2).post(f"/v1/groups/{g}/members",
                                   json={"members": [late]})).status_code == 200
    by_b = (await cb.request("group_send", group=g, cmid="b1", body="b's"))["mid"]
    # late joined at seq 3: it counts for by_b (seq 4) only; senders never count
    want = {sent[0]: {"read": 2, "unread": 1, "users": sorted([b, c])},
            sent[1]: {"read": 1, "unread": 2, "users": [b]},
            sent[2]: {"read": 1, "unread": 2, "users": [b]},  # b's own send moved its read
            by_b: {"read": 0, "unread": 4, "users": []}}  # a, c, e, late
    for mid, status in want.items():
        for node, who in ((n1, a), (n2, c)):
            r = await http(who, node).get(f"/v1/groups/{g}/reads/{mid}")
            assert r.json() == status, (mid, who)
    assert code(await http(late, n1).get(f"/v1/groups/{g}/reads/{sent[0]}")) == \
        (404, "not_found")  # sent before it joined
    # Six members: above IM_GROUP_WRITE_DIFFUSION_MAX (5) the readers are not listed.
    assert (await http(a, n1).post(f"/v1/groups/{g}/members",
                                   json={"members": [uid("z")]})).status_code == 200
    assert (await http(b, n2).get(f"/v1/groups/{g}/reads/{sent[0]}")).json() == \
        {"read": 2, "unread": 1}


# -- group_event pushes -------------------------------------------------------------------
async def test_group_events_reach_every_member_once_on_both_nodes(two, connect, http):
    n1, n2 = two
    a, b, c, d = (uid(p) for p in "abcd")
    g = await new_group(http, a, [b, c], n1)
    da, db, dc, dd = (await connect(n1, a), await connect(n2, b), await connect(n1, c),
                      await connect(n2, d))
    for dev in (da, db, dc, dd):
        # A node reads a device's first frame once its groups are loaded: a device
        # still connecting while it is added may get ``added`` twice (documented).
        await dev.request("ping")
    members = [da, db, dc]

    r = await http(a, n2).post(f"/v1/groups/{g}/members", json={"members": [d]})
    assert r.status_code == 200
    for dev in [*members, dd]:
        assert await events(dev, 1) == [ev(g, "added", [d], a)]
    members.append(dd)
    assert (await http(a, n1).delete(f"/v1/groups/{g}/members/{d}")).status_code == 200
    for dev in members:
        assert await events(dev, 1) == [ev(g, "removed", [d], a)]
    members.remove(dd)
    assert (await patch(http, a, n2, g, name="crew", owner=b)).status_code == 200
    for dev in members:
        assert await events(dev, 2) == [ev(g, "renamed", [], a), ev(g, "owner", [b], a)]
    assert (await http(a, n1).post(f"/v1/groups/{g}/leave")).status_code == 200
    for dev in members:
        assert await events(dev, 1) == [ev(g, "left", [a], a)]
    members.remove(da)
    # Nothing more for those who are out: the next event proves the queues drained.
    assert (await http(b, n1).delete(f"/v1/groups/{g}")).status_code == 200
    for dev in members:
        assert await events(dev, 1) == [ev(g, "dissolved", [], b)]
    for dev in (da, dd):
        await dev.request("ping")
        assert [f for f in dev.drain_pushes() if f.get("op") == "group_event"] == []
    for dev in members:
        assert [f for f in dev.drain_pushes() if f.get("op") == "group_event"] == []
        assert dev.counts["group_event"] == 6


# -- the races ------------------------------------------------------------------------------
async def test_rename_and_hand_over_are_seen_on_the_other_node_at_once(two, http):
    n1, n2 = two
    a, b = uid("a"), uid("b")
    g = await new_group(http, a, [b], n1)
    owners = [(a, n1), (b, n2)]
    for i in range(6):
        (cur, there), (nxt, here) = owners[i % 2], owners[(i + 1) % 2]
        assert (await patch(http, cur, there, g, name=f"n{i}", owner=nxt)).status_code == 200
        info = (await http(cur, here).get(f"/v1/groups/{g}")).json()
        assert (info["name"], info["owner"]) == (f"n{i}", nxt)
        assert code(await patch(http, cur, here, g, name="late")) == (403, "forbidden")
        assert code(await http(nxt, here).post(f"/v1/groups/{g}/leave")) == \
            (400, "bad_request")
        assert (await http(cur, here).get("/v1/groups")).json()["groups"][0]["owner"] == nxt


async def _group_reads(node: Any) -> float:
    """How many times the node read groups' documents by id from the store."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.metrics_port}") as m:
        text = (await m.get("/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(
        'im_store_command_seconds_count{collection="groups",command="find"'))


async def test_a_group_list_asked_again_reads_the_store_once_and_shows_changes_at_once(
        two, http):
    """The node keeps the documents of a list it answered (a user listing its
    groups in a loop costs the store nothing more), while no change was made
    through any node: a rename or a new member on the other node shows at once."""
    n1, n2 = two
    a, b, c = uid("a"), uid("b"), uid("c")
    g = await new_group(http, a, [b], n1)
    before = await _group_reads(n2)
    for _ in range(4):
        mine = (await http(b, n2).get("/v1/groups")).json()["groups"]
        assert [(x["group"], x["members"]) for x in mine] == [(g, 2)]
    assert await _group_reads(n2) - before == 1
    assert (await patch(http, a, n1, g, name="renamed")).status_code == 200
    assert (await http(a, n1).post(f"/v1/groups/{g}/members",
                                   json={"members": [c]})).status_code == 200
    mine = (await http(b, n2).get("/v1/groups")).json()["groups"]
    assert [(x["name"], x["members"]) for x in mine] == [("renamed", 3)]
    assert (await http(b, n2).get("/v1/groups")).json()["groups"] == mine
    assert await _group_reads(n2) - before == 2


async def test_a_hand_over_racing_the_new_owners_leave_never_leaves_no_owner(
        two, http, mongo_db):
    n1, n2 = two
    for _ in range(5):
        a, b = uid("a"), uid("b")
        g = await new_group(http, a, [b], n1)
        handed, left = await asyncio.gather(patch(http, a, n1, g, owner=b),
                                            http(b, n2).post(f"/v1/groups/{g}/leave"))
        doc = await mongo_db.groups.find_one({"_id": g})
        members = {d["u"] async for d in mongo_db.group_members.find({"g": g})}
        assert doc["owner"] in members and doc["size"] == len(members)
        if handed.status_code == 200:  # then b's leave came second: the owner may not
            assert (doc["owner"], code(left)) == (b, (400, "bad_request"))
        else:  # b left first: a hand-over to a non-member
            assert (doc["owner"], code(handed), left.status_code) == \
                (a, (400, "bad_request"), 200)


class Sends:
    """Sends running until stopped: (monotonic time started, cmid, reply)."""

    def __init__(self) -> None:
        self.done: list[tuple[float, str, dict[str, Any]]] = []
        self.stop = asyncio.Event()
        self.system = uid("sys")  # the server API's sender: its cmids are this test's

    async def ws(self, device: Any, group: str, tag: str) -> None:
        i = 0
        while not self.stop.is_set():
            cmid, i = f"{tag}-{i}", i + 1
            started = time.monotonic()
            reply = await device.request("group_send", group=group, cmid=cmid, body=i)
            self.done.append((started, cmid, reply))

    async def server(self, client: httpx.AsyncClient, node: Any, group: str, tag: str) -> None:
        i = 0
        while not self.stop.is_set():
            cmid, i = f"{tag}-{i}", i + 1
            started = time.monotonic()
            r = await client.post(f"http://127.0.0.1:{node.http_port}/v1/server/group_send",
                                  headers={"X-API-Key": KEY},
                                  json={"from": self.system, "group": group, "cmid": cmid,
                                        "body": i})
            body = r.json()
            self.done.append((started, cmid, {"op": "ack", **body} if r.status_code == 200
                              else {"op": "error", "code": body["error"]["code"]}))

    def after(self, t: float) -> list[dict[str, Any]]:
        return [r for started, _, r in self.done if started > t]

    def acked(self) -> dict[str, dict[str, Any]]:
        return {cmid: r for _, cmid, r in self.done if r["op"] == "ack"}

    def count(self, op: str) -> int:
        return sum(1 for _, _, r in self.done if r["op"] == op)


async def stored(mongo_db: Any, group: str) -> dict[str, dict[str, Any]]:
    return {d["cmid"]: d async for d in mongo_db.group_msgs.find({"g": group})}


async def test_leave_racing_sends(two, connect, http, mongo_db):
    n1, n2 = two
    owner, b, c = uid("o"), uid("b"), uid("c")
    g = await new_group(http, owner, [b, c], n1)
    devices = [await connect(n2, b), await connect(n1, b)]
    sends = Sends()
    tasks = [asyncio.create_task(sends.ws(d, g, f"s{i}")) for i, d in enumerate(devices * 2)]
    assert await until(lambda: sends.count("ack") >= 10, timeout=15)
    r = await http(b, n1).post(f"/v1/groups/{g}/leave")
    answered = time.monotonic()
    assert r.status_code == 200
    assert await until(lambda: len(sends.after(answered)) >= 20, timeout=15)
    sends.stop.set()
    await asyncio.gather(*tasks)
    assert {x.get("code") for x in sends.after(answered)} == {"forbidden"}
    assert {r.get("code") for _, _, r in sends.done if r["op"] != "ack"} == {"forbidden"}
    # Nothing half-applied: exactly the acked sends are stored, seqs without a hole.
    acked = sends.acked()
    docs = await stored(mongo_db, g)
    assert set(docs) == set(acked)
    assert sorted(d["seq"] for d in docs.values()) == list(range(1, len(acked) + 1))
    assert sorted(x["seq"] for x in acked.values()) == list(range(1, len(acked) + 1))
    hist = (await http(c, n2).get(f"/v1/history/g:{g}", params={"limit": 200})).json()
    assert sorted(m["mid"] for m in hist["msgs"]) == sorted(x["mid"] for x in acked.values())
    # Unread stays exact on both sides of the leave.
    for node in (n1, n2):
        assert unread_of(await convs(http, c, node), f"g:{g}") == len(acked)
        assert unread_of(await convs(http, b, node), f"g:{g}") is None
    assert code(await http(b, n2).get(f"/v1/history/g:{g}")) == (403, "forbidden")
    assert [x["group"] for x in (await http(b, n2).get("/v1/groups")).json()["groups"]] == []


async def test_dissolve_racing_sends(two, connect, http, mongo_db, redis_client):
    n1, n2 = two
    owner, b, c = uid("o"), uid("b"), uid("c")
    g = await new_group(http, owner, [b, c], n1)
    other = await new_group(http, c, [b], n2)  # unread elsewhere, for the sums
    cb, cc = await connect(n2, b), await connect(n1, c)
    await cc.request("group_send", group=other, cmid="x1", body="elsewhere")
    sends = Sends()
    async with httpx.AsyncClient(trust_env=False, timeout=15) as client:
        tasks = [asyncio.create_task(sends.ws(cb, g, "b0")),
                 asyncio.create_task(sends.ws(cb, g, "b1")),
                 asyncio.create_task(sends.ws(cc, g, "c0")),
                 asyncio.create_task(sends.server(client, n1, g, "y0")),
                 asyncio.create_task(sends.server(client, n2, g, "y1"))]
        assert await until(lambda: sends.count("ack") >= 15, timeout=15)
        r = await http(owner, n2).delete(f"/v1/groups/{g}")
        answered = time.monotonic()
        assert r.status_code == 200
        assert await until(lambda: len(sends.after(answered)) >= 25, timeout=15)
        sends.stop.set()
        await asyncio.gather(*tasks)
    late = sends.after(answered)
    assert {x.get("code") for x in late} == {"not_found"}  # WebSocket and server API alike
    assert {r.get("code") for _, _, r in sends.done if r["op"] != "ack"} == {"not_found"}
    acked = sends.acked()
    assert all(started < answered for started, cmid, _ in sends.done if cmid in acked)
    docs = await stored(mongo_db, g)
    assert set(docs) == set(acked)  # no seq taken after the dissolve, nothing half-stored
    assert sorted(d["seq"] for d in docs.values()) == list(range(1, len(acked) + 1))
    group = await mongo_db.groups.find_one({"_id": g})
    assert group["dissolved"] and group["seq"] == len(acked)
    # History stays readable to former members; the group is gone from every list.
    hist = (await http(c, n2).get(f"/v1/history/g:{g}", params={"limit": 200})).json()
    assert sorted(m["mid"] for m in hist["msgs"]) == sorted(x["mid"] for x in acked.values())
    assert code(await http(uid("x"), n1).get(f"/v1/history/g:{g}")) == (403, "forbidden")
    for user in (owner, b, c):
        for node in (n1, n2):
            mine = (await http(user, node).get("/v1/groups")).json()["groups"]
            assert g not in [x["group"] for x in mine]
            assert unread_of(await convs(http, user, node), f"g:{g}") is None
    assert unread_of(await convs(http, b, n1), f"g:{other}") == 1
    assert code(await http(owner, n1).get(f"/v1/groups/{g}")) == (404, "not_found")
    assert (await http(owner, n1).delete(f"/v1/groups/{g}")).status_code == 200  # a retry
    # No node keeps a device in the group's map; no cache keeps a member.
    assert await until(lambda: all(g not in n.app.group_hub.members for n in two))
    keys = Keys(RUN_NS)
    for user in (owner, b, c):
        assert not await redis_client.hexists(keys.user_groups(user), g)
    assert await redis_client.smembers(keys.group_members(g)) == {b"~"}
    assert await mongo_db.group_members.count_documents({"g": g, "gone": True}) == 3
    # A cache that still says "member" (a send past its check when the dissolve
    # landed) changes nothing: the seq allocation itself refuses the group.
    await redis_client.sadd(keys.group_members(g), b)
    assert (await cb.request("group_send", group=g, cmid="stale", body=1))["code"] == \
        "not_found"
    assert (await mongo_db.groups.find_one({"_id": g}))["seq"] == len(acked)
    assert await mongo_db.group_msgs.count_documents({"g": g}) == len(acked)


async def test_unread_stays_exact_through_leave_and_dissolve(two, connect, http):
    n1, n2 = two
    a, b, c = uid("a"), uid("b"), uid("c")
    g1 = await new_group(http, a, [b], n1)
    g2 = await new_group(http, c, [b], n2)
    ca, cc = await connect(n1, a), await connect(n2, c)
    for i in range(3):
        await ca.request("group_send", group=g1, cmid=f"a{i}", body=i)
    for i in range(2):
        await cc.request("group_send", group=g2, cmid=f"c{i}", body=i)
    await ca.request("send", to=b, cmid="direct", body="hi")
    for node in (n1, n2):
        got = await convs(http, b, node)
        assert got["total_unread"] == 6
        assert (unread_of(got, f"g:{g1}"), unread_of(got, f"g:{g2}"), unread_of(got, a)) == \
            (3, 2, 1)
    assert (await http(b, n2).post(f"/v1/groups/{g1}/leave")).status_code == 200
    for node in (n1, n2):
        got = await convs(http, b, node)
        assert got["total_unread"] == 3 and unread_of(got, f"g:{g1}") is None
    assert (await http(c, n1).delete(f"/v1/groups/{g2}")).status_code == 200
    for node in (n1, n2):
        got = await convs(http, b, node)
        assert got["total_unread"] == 1 and [x["conv"] for x in got["conversations"]] == [a]
        assert (await convs(http, c, node))["total_unread"] == 0
