"""The sync cursor and sends in flight on other nodes: a send that may still
land holds every node's cursor below its mid; a node that closes takes its
mark with it."""

from __future__ import annotations

import time

from core.ids import MidGenerator
from gateway.node import Node
from store.keys import Keys
from store.records import ChatMessage, GroupMessage
from testkit.poll import until
from tests.conftest import RUN_NS, uid


async def _next(h, since: int) -> int:  # type: ignore[no-untyped-def]
    page = (await h.get("/v1/sync", params={"since": since})).json()
    return int(page["next"])


async def test_a_send_that_may_still_land_holds_cursors_until_its_node_closes(
        make_node, connect, http) -> None:  # type: ignore[no-untyped-def]
    # a_node's heartbeat stays current for a minute after it stops: its mark
    # must go with it, not with the heartbeat.
    a_node: Node = await make_node(heartbeat_ttl_s=60)
    b_node: Node = await make_node()
    a, b = uid("a"), uid("b")
    ca = await connect(b_node, a)
    first = await ca.request("send", to=b, cmid="m0", body="before")
    # A send on a_node failed after it had its mid: the store may still write
    # it, so no cursor may pass it while that is possible.
    held = a_node.app.chat.mids.next()
    a_node.app.inflight.failed(held, time.monotonic())
    later = await ca.request("send", to=b, cmid="m1", body="after")
    assert first["mid"] < held < later["mid"]
    hb = http(b, b_node)

    async def b_node_knows_the_mark() -> bool:
        return b_node.app.marks.get(a_node.name) == held

    assert await until(b_node_knows_the_mark, 5)
    # Past the settle window the cursor would pass both messages; the mark
    # keeps it below the held mid.
    async def settled() -> bool:
        return (await _next(hb, 0)) >= first["mid"]

    assert await until(settled, 5)
    assert await _next(hb, 0) < held

    await a_node.close()

    async def passes() -> bool:
        return (await _next(hb, 0)) >= later["mid"]

    assert await until(passes, 5)
    await b_node.stores.nodes.leave(a_node.name)  # no minute-long ghost for later tests


async def test_what_a_dead_node_stored_is_redelivered_by_one_live_node(
        make_node, http, redis_client) -> None:  # type: ignore[no-untyped-def]
    """A node killed between storing a 1:1 message and putting it in the users'
    offline stores: one live node (the claim's holder) puts it there, and the
    cursors every node held below the dead node's mark move on."""
    nodes: list[Node] = [await make_node(), await make_node()]
    a, b = uid("a"), uid("b")
    ghost_id = 250  # no node of this run leases it: nodes take the lowest free number
    ghost = f"n{ghost_id}-{uid('ghost')}"
    mid = MidGenerator(ghost_id).next()
    # What the dead node left: the message in MongoDB only, its mark, and a
    # heartbeat that has lapsed.
    await nodes[0].stores.messages.store_batch([ChatMessage(mid, a, b, "c1", "lost?")])
    keys = Keys(RUN_NS)
    await redis_client.zadd(keys.inflight(), {ghost: mid})
    await redis_client.zadd(keys.nodes(), {ghost: time.time() - 1})

    async def put_right() -> bool:
        return await redis_client.zscore(keys.inflight(), ghost) is None

    assert await until(put_right, 15)
    # In the offline store itself (MongoDB alone would serve a sync too, but
    # only once Redis cannot vouch for the range), and so in b's sync.
    assert await redis_client.zcount(keys.offline(b), mid, mid) == 1
    page = (await http(b, nodes[1]).get("/v1/sync", params={"since": 0})).json()
    assert mid in [m["mid"] for m in page["msgs"]]
    holder = await redis_client.get(keys.dead_sends_claim(ghost))
    assert holder is not None and holder.decode() in {n.name for n in nodes}
    await redis_client.zrem(keys.nodes(), ghost)


async def test_a_group_message_a_dead_node_stored_is_recorded_by_a_live_node(
        make_node, http, connect, redis_client) -> None:  # type: ignore[no-untyped-def]
    """The same for a group message: stored in MongoDB (message and the
    members' boxes) by a node killed before it recorded it in Redis. A live node
    records it (group state, the members' offline entries, the sender's send
    acked), so the member's sync and unread have it before cursors move on, and
    the sender's resend is acked with it."""
    nodes: list[Node] = [await make_node(), await make_node()]
    a, b = uid("a"), uid("b")
    r = await http(a, nodes[0]).post("/v1/groups", json={"name": "g", "members": [b]})
    group = r.json()["group"]
    ghost_id = 251
    ghost = f"n{ghost_id}-{uid('ghost')}"
    mid = MidGenerator(ghost_id).next()
    stores = nodes[0].stores
    seq = await stores.groups.allocate(group, 1, mid, 0)
    [stored] = await stores.groups.insert([GroupMessage(group, seq, mid, a, "gc1", "lost?", True)])
    assert isinstance(stored, GroupMessage)
    await stores.messages.add_group_boxes([(stored, [a, b])])
    keys = Keys(RUN_NS)
    await redis_client.zadd(keys.inflight(), {ghost: mid})
    await redis_client.zadd(keys.nodes(), {ghost: time.time() - 1})

    async def put_right() -> bool:
        return await redis_client.zscore(keys.inflight(), ghost) is None

    assert await until(put_right, 15)
    assert await redis_client.zcount(keys.offline(b), mid, mid) == 1
    page = (await http(b, nodes[1]).get("/v1/conversations")).json()
    assert {c["conv"]: c["unread"] for c in page["conversations"]} == {f"g:{group}": 1}
    ca = await connect(nodes[1], a)
    again = await ca.request("group_send", group=group, cmid="gc1", body="lost?")
    assert (again["op"], again["mid"], again["seq"]) == ("ack", mid, seq)
    await redis_client.zrem(keys.nodes(), ghost)
