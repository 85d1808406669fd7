"""Presence watches under abuse, on real nodes (docs/protocol.md, presence_sub;
docs/reference/presence.md): ``IM_PRESENCE_SUBS_MAX`` caps the users one
user watches across all its connections and nodes (``forbidden``, counted in
``im_limit_refusals_total{limit="presence_subs"}``), and however many users a
node's devices watch it binds at most one broker key per presence shard,
while a change still reaches the watchers of its user and nobody else."""

from __future__ import annotations

from router.routing import PRESENCE_SHARDS, parse_key, presence_shard
from testkit.poll import until
from tests.conftest import settle, uid

FAST = {"presence_grace_s": 1.0, "heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0,
        "privacy_presence": "everyone"}


def refusals(node) -> float:
    value = node.metrics.registry.get_sample_value("im_limit_refusals_total",
                                                   {"limit": "presence_subs"})
    return value or 0.0


async def test_the_cap_is_per_user_across_its_connections_on_two_nodes(make_node, connect):
    n1, n2 = await make_node(presence_subs_max=5, **FAST), \
        await make_node(presence_subs_max=5, **FAST)
    await settle(n1, n2)
    w = uid("w")
    u = [uid(f"u{i}") for i in range(11)]
    a, b = await connect(n1, w), await connect(n2, w)
    assert (await a.request("presence_sub", users=u[1:4]))["op"] == "presence"
    assert (await b.request("presence_sub", users=[u[1], u[4], u[5]]))["op"] == "presence"
    for dev, node in ((b, n2), (a, n1)):  # 5 users watched (u1 once): a 6th is refused
        over = await dev.request("presence_sub", users=[u[6]])
        assert over["code"] == "forbidden" and "at most 5 users" in over["message"]
        assert refusals(node) == 1
    # An unsubscribe frees its slot before it is answered, on every node.
    assert (await a.request("presence_unsub", users=[u[2]]))["op"] == "ok"
    assert (await b.request("presence_sub", users=[u[6]]))["op"] == "presence"
    # A user still watched by another connection still counts.
    await a.request("presence_unsub", users=[u[1]])
    assert (await a.request("presence_sub", users=[u[7]]))["code"] == "forbidden"
    # A closed connection's watches stop counting (u3 is left, from a).
    await b.close()

    async def freed() -> bool:
        return (await a.request("presence_sub", users=u[7:11]))["op"] == "presence"

    assert await until(freed, timeout=5)
    assert (await a.request("presence_sub", users=[uid("z")]))["code"] == "forbidden"


async def test_many_watches_bind_at_most_one_key_per_shard(make_node, connect):
    n1 = await make_node(presence_subs_max=6000, relation_lookup_burst=6000, **FAST)
    n2, n3 = await make_node(**FAST), await make_node(**FAST)
    await settle(n1, n2, n3)
    w, v = uid("w"), uid("v")
    watched = [uid("t") for _ in range(5000)]
    target = watched[0]
    other = next(x for x in (uid("o") for _ in range(100_000))
                 if presence_shard(x) == presence_shard(target))
    conns = [await connect(n1, w) for _ in range(10)]
    for k, c in enumerate(conns):  # 10 connections, 500 distinct users each
        r = await c.request("presence_sub", users=watched[k * 500:(k + 1) * 500])
        assert r["op"] == "presence", r
    dv = await connect(n1, v)  # watches another user of the target's shard
    await dv.request("presence_sub", users=[other])
    broker = n1.app.router.broker
    presence_keys = [k for k in broker.bound_keys() if parse_key(k)[0] == "presence"]
    assert len(presence_keys) <= PRESENCE_SHARDS
    assert broker.binds <= PRESENCE_SHARDS  # every bind this node ever made
    assert n1.app.watchers.watchers.memberships == 5001
    # The target comes online on another node: its watcher hears it, v does not.
    await connect(n2, target)
    while True:
        f = await conns[0].next_push("presence")
        if target in f["users"]:
            assert f["users"][target]["online"] is True
            break
    await dv.request("ping")
    assert all(target not in f["users"] for f in dv.drain_pushes() if f["op"] == "presence")
    for c in conns[1:]:
        await c.request("ping")
        assert all(target not in f["users"] for f in c.drain_pushes()
                   if f["op"] == "presence")
    assert n1.app.router.stats["presence_in"] >= 1
    assert n3.app.router.stats["presence_in"] == 0  # watches nobody: bound to nothing
