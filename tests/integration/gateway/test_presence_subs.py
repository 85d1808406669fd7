"""Presence subscriptions on three nodes (docs/protocol.md, presence_sub): the
state at subscription, a ``presence`` frame per change of a watched user with
the grace against flapping, nothing for users nobody watches, nothing at all
for a node that watches nobody, unsubscribing, the limits, GET /v1/presence."""

from __future__ import annotations

from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, settle, uid

# The subscription mechanics, with presence shown to everyone (an operator's
# choice; the default shows it to contacts only: test_contacts.py).
FAST = {"presence_grace_s": 1.0, "heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0,
        "privacy_presence": "everyone"}


async def three_nodes(make_node, **kw):
    nodes = [await make_node(**FAST, **kw) for _ in range(3)]
    await settle(*nodes)
    return nodes


async def change(device, user) -> dict:
    """The next presence frame about ``user`` (others' are skipped)."""
    while True:
        f = await device.next_push("presence")
        if user in f["users"]:
            return f["users"][user]


async def test_watchers_get_each_change_of_the_users_they_watch(make_node, connect,
                                                                redis_client):
    n1, n2, n3 = await three_nodes(make_node)
    watcher, online, later, stranger = uid("w"), uid("on"), uid("l"), uid("s")
    await connect(n2, online)
    # A device's route is written just after its handshake: the state a watcher
    # reads is the routes'.
    assert await until(lambda: redis_client.exists(Keys(RUN_NS).routes(online)))
    w = await connect(n1, watcher)
    r = await w.request("presence_sub", users=[online, later])
    assert r["op"] == "presence" and r["users"][online]["online"] is True
    assert r["users"][later] == {"online": False, "last_seen": None}
    d = await connect(n2, later)  # another node: through the broker binding
    got = await change(w, later)
    assert got["online"] is True and isinstance(got["last_seen"], int)
    await connect(n3, stranger)  # nobody watches: nothing comes
    await d.close()
    d2 = await connect(n3, later)  # back within the grace: no news
    await d2.request("ping")
    await d2.close()
    off = await change(w, later)  # then gone for good
    assert off["online"] is False
    seen = [f for f in w.drain_pushes() if f["op"] == "presence"]
    assert all(stranger not in f["users"] for f in seen)
    assert all(later not in f["users"] for f in seen)  # one online, one offline: no flap
    # n3 watches nobody: presence envelopes never reached it.
    assert n3.app.router.stats["presence_in"] == 0
    assert n1.app.router.stats["presence_in"] >= 2


async def test_unsubscribe_and_limits(make_node, connect, http):
    node = await make_node(presence_subs_max=3, **FAST)
    watcher, a, b = uid("w"), uid("a"), uid("b")
    w = await connect(node, watcher)
    assert (await w.request("presence_sub", users=[a, b]))["op"] == "presence"
    assert (await w.request("presence_unsub", users=[a]))["op"] == "ok"
    await connect(node, a)
    await connect(node, b)
    assert (await change(w, b))["online"] is True  # b still watched; a's came before, if any
    assert all(a not in f["users"] for f in w.drain_pushes() if f["op"] == "presence")
    over = await w.request("presence_sub", users=[uid("x"), uid("y"), uid("z")])
    assert over["code"] == "forbidden"  # 1 + 3 > 3 per user
    assert "at most 3 users" in over["message"] and "IM_PRESENCE_SUBS_MAX" in over["message"]
    for bad in ([], ["bad id"], [uid("u")] * 501, "x"):
        assert (await w.request("presence_sub", users=bad))["code"] == "bad_request"
    r = await http(watcher, node).get("/v1/presence", params={"users": f"{a},{uid('n')}"})
    body = r.json()["users"]
    assert body[a]["online"] is True and list(body)[1:] and not list(body.values())[1]["online"]
    for users in ("", "bad id", ",".join(f"u{i}" for i in range(501)), "u" * 5001):
        assert (await http(watcher, node).get("/v1/presence", params={"users": users})
                ).status_code == 400
