"""ChatService (gateway/chat/service.py) over fakes of its stores: the send path's
dedup, store-once, deliveries and ack value; resends; failures; sync's
fallback to the message store. No servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from core import dedup
from core.errors import Unavailable
from core.ids import MidGenerator, mid_time_ms
from gateway.chat.service import REPUSH_WINDOW_S
from gateway.errors import ProtocolError
from store.records import ChatMessage, Delivery
from tests.core.world import World, build


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = build()
    yield w
    await w.close()


def plain(entry: Any) -> Any:
    """A sync entry as the client reads it (stored bytes or a dict alike)."""
    if isinstance(entry, bytes):
        return orjson.loads(entry)
    return orjson.loads(orjson.dumps(entry))


def earlier_mid() -> int:
    """A mid another node issued before this test's sends."""
    return MidGenerator(9, clock_ms=lambda: 1_750_000_000_000).next()


async def test_send_stores_once_delivers_to_both_and_acks(world: World) -> None:
    st = world.stores
    st.routes.connect("bob", "n2", 7)
    r = await world.chat.send("alice", "bob", "c1", {"t": "hi"})

    assert st.messages.bodies == {r.mid: ChatMessage(r.mid, "alice", "bob", "c1", {"t": "hi"})}
    assert len(st.messages.batches) == 1
    assert st.offline.deliveries == [
        Delivery("alice", "bob", r.mid, r.frame or b"", unread=False),
        Delivery("bob", "alice", r.mid, r.frame or b"", unread=True),
    ]
    assert st.offline.acked == [("alice", "c1", dedup.done(r.mid))]
    assert st.dedup.values[("alice", "c1")] == dedup.done(r.mid)
    assert r.ts == mid_time_ms(r.mid)
    assert r.frame is not None and orjson.loads(r.frame) == {
        "op": "msg", "mid": r.mid, "from": "alice", "to": "bob", "body": {"t": "hi"},
        "ts": r.ts}
    assert r.sender_routes == {} and r.receiver_routes == {"n2/7": "n2"}


async def test_resend_of_an_acked_cmid_returns_the_mid_and_stores_nothing(world: World) -> None:
    st = world.stores
    first = await world.chat.send("alice", "bob", "c1", "hi")
    st.routes.connect("bob", "n2", 7)  # connected since: the push again reaches it
    again = await world.chat.send("alice", "bob", "c1", "hi")
    assert (again.mid, again.ts, again.frame) == (first.mid, first.ts, first.frame)
    assert again.repeat and not first.repeat  # pushed again, no event, nothing counted
    assert again.receiver_routes == {"n2/7": "n2"} and again.sender_routes == {}
    assert len(st.messages.batches) == 1
    # Delivered again (a lost part is put back), nothing counted twice.
    assert len(st.offline.deliveries) == 4
    assert st.offline.inboxes["bob"].unread == {"alice": {first.mid}}
    assert st.dedup.values[("alice", "c1")] == dedup.done(first.mid)


async def test_an_old_or_recalled_resend_is_answered_without_a_push() -> None:
    now = int(time.time() * 1000)
    old = build(clock_ms=lambda: now - int(REPUSH_WINDOW_S * 1000) - 5_000)
    try:
        first = await old.chat.send("alice", "bob", "c1", "hi")
        again = await old.chat.send("alice", "bob", "c1", "hi")
        assert (again.mid, again.frame, again.repeat) == (first.mid, None, False)
    finally:
        await old.close()
    w = build()
    try:
        recalled = await w.chat.send("alice", "bob", "c1", "hi")
        await w.stores.messages.recall(recalled.mid, "alice")
        assert (await w.chat.send("alice", "bob", "c1", "hi")).frame is None
    finally:
        await w.close()


async def test_a_resend_of_an_acked_cmid_puts_a_lost_delivery_back_before_its_ack(
        world: World) -> None:
    """The first attempt's ack value landed but the receiver's delivery did not
    (one master of a Redis Cluster down): that attempt was answered
    ``unavailable``; the resend delivers again, then acks under the same mid."""
    st = world.stores
    sent = await world.chat.send("alice", "bob", "c1", "hi")
    st.offline.inboxes["bob"].entries.pop(sent.mid)  # as if bob's part had failed
    st.offline.fail("deliver")
    with pytest.raises(Unavailable):  # still down: no ack without the delivery
        await world.chat.send("alice", "bob", "c1", "hi")
    st.offline.down.clear()
    again = await world.chat.send("alice", "bob", "c1", "hi")
    assert again.mid == sent.mid and again.repeat
    assert sent.mid in st.offline.inboxes["bob"].entries
    assert len(st.messages.batches) == 1  # stored once
    st.messages.fail("get")  # the message store is down: unavailable, asked again later
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")


async def test_resend_of_a_pending_cmid_is_redone_under_a_fresh_mid(world: World) -> None:
    st = world.stores
    claimed = earlier_mid()
    st.dedup.values[("alice", "c1")] = dedup.pending(claimed)  # a send died before storing
    r = await world.chat.send("alice", "bob", "c1", "hi")
    # Not the claimed mid: sync cursors handed out since may have passed it.
    assert r.mid > claimed
    assert list(st.messages.bodies) == [r.mid]
    assert [d.mid for d in st.offline.deliveries] == [r.mid, r.mid]
    assert st.dedup.values[("alice", "c1")] == dedup.done(r.mid)


async def test_a_duplicate_in_the_message_store_makes_the_ack_carry_its_mid(world: World) -> None:
    st = world.stores
    original = earlier_mid()  # stored before Redis lost its dedup keys
    await st.messages.store_batch([ChatMessage(original, "alice", "bob", "c1", "hi")])
    r = await world.chat.send("alice", "bob", "c1", "hi")
    assert r.mid == original and r.ts == mid_time_ms(original)
    assert list(st.messages.bodies) == [original]
    assert [d.mid for d in st.offline.deliveries] == [original, original]
    assert st.dedup.values[("alice", "c1")] == dedup.done(original)
    assert r.frame is not None and orjson.loads(r.frame)["mid"] == original


@pytest.mark.parametrize("to", ["alice", "g:team"])
async def test_self_and_group_receivers_are_bad_requests(world: World, to: str) -> None:
    with pytest.raises(ProtocolError) as err:
        await world.chat.send("alice", to, "c1", "hi")
    assert err.value.code == "bad_request"
    assert world.stores.dedup.values == {} and world.stores.messages.batches == []


async def test_a_cmid_acked_as_a_group_message_is_a_bad_request(world: World) -> None:
    st = world.stores
    st.dedup.values[("alice", "c1")] = dedup.done(earlier_mid(), 4)
    with pytest.raises(ProtocolError) as err:
        await world.chat.send("alice", "bob", "c1", "hi")
    assert err.value.code == "bad_request"
    assert st.messages.batches == [] and st.offline.deliveries == []


async def test_a_message_store_failure_is_unavailable_and_delivers_nothing(world: World) -> None:
    st = world.stores
    st.messages.fail("store_batch")
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")
    assert st.messages.bodies == {} and st.offline.deliveries == []
    prior = dedup.parse(st.dedup.values[("alice", "c1")])
    assert not prior.acked  # never a false ack

    st.messages.heal()
    r = await world.chat.send("alice", "bob", "c1", "hi")  # the client's retry
    assert r.mid > prior.mid and list(st.messages.bodies) == [r.mid]  # stored once
    assert st.dedup.values[("alice", "c1")] == dedup.done(r.mid)


async def test_an_offline_store_failure_is_unavailable_and_never_acks(world: World) -> None:
    st = world.stores
    st.offline.fail("deliver")
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")
    prior = dedup.parse(st.dedup.values[("alice", "c1")])
    assert not prior.acked and list(st.messages.bodies) == [prior.mid]  # stored, not acked

    st.offline.heal()
    r = await world.chat.send("alice", "bob", "c1", "hi")
    assert r.mid == prior.mid and list(st.messages.bodies) == [prior.mid]
    assert st.offline.inboxes["bob"].unread == {"alice": {prior.mid}}


async def test_a_double_send_stores_once_and_counts_once(world: World) -> None:
    st = world.stores
    one, two = await asyncio.gather(world.chat.send("alice", "bob", "c1", "hi"),
                                    world.chat.send("alice", "bob", "c1", "hi"))
    assert one.mid == two.mid and list(st.messages.bodies) == [one.mid]
    assert st.offline.inboxes["bob"].unread == {"alice": {one.mid}}
    assert list(st.offline.inboxes["bob"].entries) == [one.mid]
    assert st.dedup.values[("alice", "c1")] == dedup.done(one.mid)


async def test_concurrent_sends_share_batches_and_each_gets_its_own_mid(world: World) -> None:
    st = world.stores
    results = await asyncio.gather(*(world.chat.send("alice", f"u{i}", f"c{i}", i)
                                     for i in range(20)))
    mids = [r.mid for r in results]
    assert len(set(mids)) == 20 and mids == sorted(mids)
    assert sorted(st.messages.bodies) == mids
    assert len(st.messages.batches) < 20  # many sends, fewer round trips
    assert {v for v in st.dedup.values.values()} == {dedup.done(m) for m in mids}


async def three_to_bob(world: World) -> list[int]:
    return [(await world.chat.send("alice", "bob", f"c{i}", f"m{i}")).mid for i in range(3)]


async def test_sync_rows_come_from_the_offline_store_when_it_vouches(world: World) -> None:
    mids = await three_to_bob(world)
    await world.chat.sync_ack("bob", mids[0])  # bob has the first: the floor rises to it
    rows = await world.chat.sync_rows("bob", mids[0], 10)
    assert [m for m, _ in rows] == mids[1:]
    assert all(isinstance(e, bytes) for _, e in rows)  # the stored bytes, as they are
    assert [plain(e)["body"] for _, e in rows] == ["m1", "m2"]


async def test_sync_rows_fall_back_to_the_boxes_when_the_page_is_incomplete(world: World) -> None:
    mids = await three_to_bob(world)
    await world.chat.sync_ack("bob", mids[1])  # entries up to mids[1] are gone from Redis
    rows = await world.chat.sync_rows("bob", 0, 10)
    assert [m for m, _ in rows] == mids
    assert all(isinstance(e, dict) for _, e in rows)  # read from the message store
    assert [e["body"] for _, e in rows] == ["m0", "m1", "m2"]
    assert [m for m, _ in await world.chat.sync_rows("bob", 0, 2)] == mids[:2]


async def test_sync_rows_fall_back_to_the_boxes_when_redis_lost_the_user(world: World) -> None:
    mids = await three_to_bob(world)
    world.stores.offline.inboxes.clear()  # a Redis flush
    rows = await world.chat.sync_rows("bob", mids[0], 10)
    assert [(m, e["body"]) for m, e in rows] == [(mids[1], "m1"), (mids[2], "m2")]


async def test_sync_rows_come_from_the_boxes_while_the_offline_store_is_down(world: World) -> None:
    mids = await three_to_bob(world)
    world.stores.offline.fail("page")
    rows = await world.chat.sync_rows("bob", mids[0] - 1, 10)  # a range Redis could vouch for
    assert [m for m, _ in rows] == mids
    assert all(isinstance(e, dict) and e["op"] == "msg" for _, e in rows)


async def test_read_marks_and_history_pages(world: World) -> None:
    mids = await three_to_bob(world)
    assert await world.chat.mark_read("bob", "alice", mids[0]) == 2
    total, rows = await world.chat.conversation_rows("bob", 10)
    assert total == 2 and [(pos, r["conv"], r["unread"]) for pos, r in rows] == [
        ((mids[2], "alice"), "alice", 2)]
    page, cursor = await world.chat.history("bob", "alice", None, 2)
    assert [f["mid"] for f in page] == [mids[2], mids[1]] and cursor == mids[1]
    page, cursor = await world.chat.history("bob", "alice", cursor, 2)
    assert [f["mid"] for f in page] == [mids[0]] and cursor is None


async def test_a_dead_nodes_stored_sends_are_redelivered_once(world: World) -> None:
    """A node stored two messages in MongoDB and died before its deliveries:
    another node puts them in both users' offline stores and marks the sends
    acked; doing it twice counts nothing twice; other nodes' mids are left."""
    dead = MidGenerator(7)
    mine = [ChatMessage(dead.next(), "alice", "bob", f"lost{i}", f'"m{i}"'.encode())
            for i in range(2)]
    other = ChatMessage(MidGenerator(8).next(), "carol", "bob", "c0", b'"x"')
    await world.stores.messages.store_batch([*mine, other])
    low, high = mine[0].mid, max(m.mid for m in [*mine, other])
    for _ in range(2):
        assert await world.chat.redeliver(7, low, high) == 2
    offline = world.stores.offline
    assert sorted(offline.inboxes["bob"].entries) == [m.mid for m in mine]
    assert sorted(offline.inboxes["alice"].entries) == [m.mid for m in mine]
    total, _ = await world.chat.conversation_rows("bob", 10)
    assert total == 2
    # The sender's resend is answered with the stored mid, nothing stored again.
    again = await world.chat.send("alice", "bob", "lost0", "m0")
    assert again.mid == mine[0].mid
