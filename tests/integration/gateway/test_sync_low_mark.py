"""The sync cursor and sends in flight on other nodes: a send that may still
land holds every node's cursor below its mid; a node that closes takes its
mark with it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from core.errors import Unavailable
from core.ids import MidGenerator, mid_for_time_ms
from gateway.node import Node
from store.keys import Keys
from store.messages_mongo import MessagesMongo, body_doc
from store.mongo_client import insert_idempotent
from store.records import ChatMessage, GroupMessage
from testkit.poll import until
from tests.conftest import RUN_NS, uid


async def _next(h, since: int) -> int:  # type: ignore[no-untyped-def]
    page = (await h.get("/v1/sync", params={"since": since})).json()
    return int(page["next"])


async def written(write: Callable[[], Awaitable[object]]) -> None:
    """A test's own store write, again while the test store answers
    ``unavailable`` (CI's load); each is idempotent."""
    async def done() -> bool:
        try:
            await write()
        except Unavailable:
            return False
        return True

    assert await until(done, 30)


async def ghost_dies(redis_client, ghost: str, mark: int) -> None:  # type: ignore[no-untyped-def]
    """What a node killed leaves besides its writes: its mark and a heartbeat
    that has lapsed. Returns once a live node redelivered from the mark and
    dropped it."""
    keys = Keys(RUN_NS)
    await redis_client.zadd(keys.inflight(), {ghost: mark})
    await redis_client.zadd(keys.nodes(), {ghost: time.time() - 1})

    async def put_right() -> bool:
        return await redis_client.zscore(keys.inflight(), ghost) is None

    assert await until(put_right, 15)


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
    while held <= first["mid"]:  # the same millisecond, a lower node id: a later one
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
    await written(lambda: nodes[0].stores.messages.store_batch(
        [ChatMessage(mid, a, b, "c1", "lost?")]))
    await ghost_dies(redis_client, ghost, mid)
    keys = Keys(RUN_NS)
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
    await ghost_dies(redis_client, ghost, mid)
    keys = Keys(RUN_NS)
    assert await redis_client.zcount(keys.offline(b), mid, mid) == 1
    page = (await http(b, nodes[1]).get("/v1/conversations")).json()
    assert {c["conv"]: c["unread"] for c in page["conversations"]} == {f"g:{group}": 1}
    ca = await connect(nodes[1], a)
    again = await ca.request("group_send", group=group, cmid="gc1", body="lost?")
    assert (again["op"], again["mid"], again["seq"]) == ("ack", mid, seq)
    await redis_client.zrem(keys.nodes(), ghost)


async def test_an_idle_node_marks_the_moment_it_shares(
        make_node, redis_client) -> None:  # type: ignore[no-untyped-def]
    """With nothing in flight a node's mark is the mid of the moment it
    shares, not absent: a send it begins before its next share takes a later
    mid, so were it killed with that send stored in MongoDB alone, the live
    nodes would read it back from the mark (and hold cursors below it)."""
    node: Node = await make_node()
    assert node.app.inflight.oldest(time.monotonic()) is None
    keys = Keys(RUN_NS)
    start = mid_for_time_ms(int(time.time() * 1000))

    async def marked_since_start() -> bool:
        score = await redis_client.zscore(keys.inflight(), node.name)
        return score is not None and int(score) >= start

    assert await until(marked_since_start, 5)
    score = await redis_client.zscore(keys.inflight(), node.name)
    assert int(score) <= mid_for_time_ms(int(time.time() * 1000))
    await node.close()  # a node that closes takes its mark with it
    assert await redis_client.zscore(keys.inflight(), node.name) is None


async def test_a_body_a_dead_node_stored_without_its_boxes_gets_them(
        make_node, http, redis_client) -> None:  # type: ignore[no-untyped-def]
    """A node killed between the two writes of a 1:1 send (its body, then the
    two users' box entries): the live node that reads it back writes the
    boxes too, so history (and a sync MongoDB answers, after a Redis loss)
    has it without a resend."""
    nodes: list[Node] = [await make_node(), await make_node()]
    a, b = uid("a"), uid("b")
    ghost_id = 252
    ghost = f"n{ghost_id}-{uid('ghost')}"
    mid = MidGenerator(ghost_id).next()
    messages = nodes[0].stores.messages
    assert isinstance(messages, MessagesMongo)

    await written(lambda: insert_idempotent(messages.messages,
                                            [body_doc(ChatMessage(mid, a, b, "c1", "half"))]))
    await ghost_dies(redis_client, ghost, mid)
    keys = Keys(RUN_NS)
    for user, peer in ((a, b), (b, a)):
        page = (await http(user, nodes[1]).get(f"/v1/history/{peer}")).json()
        assert [m["mid"] for m in page["msgs"]] == [mid], (user, page)
    # One side deleted its copy: reading it back again does not bring it back.
    assert await messages.forget(b, mid) == a
    assert await messages.add_missing_boxes([ChatMessage(mid, a, b, "c1", "half")]) == 0
    assert await messages.in_box(b, [mid]) == set()
    await redis_client.zrem(keys.nodes(), ghost)
