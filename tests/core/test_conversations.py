"""Conversations (gateway/inbox/conversations.py) over fakes: sync merges the user's
own store (1:1 and write-diffused groups) with its read-diffused groups in
mid order; the conversation list sums both sides, newest first; read and
history dispatch on ``g:``. No servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest

from core import dedup
from core.errors import Unavailable
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.groups.service import SYNC_GROUP_READS
from gateway.inbox.conversations import Conversations
from store.records import ChatMessage, GroupMessage
from tests.core.fakes import settle
from tests.core.world import World, build

PAST_MS = 1_750_000_000_000  # the mids' clock: long settled (sync cursors may pass them)


@pytest.fixture
async def world() -> AsyncIterator[World]:
    # groups of up to 2 members are write-diffused, bigger ones read-diffused
    w = build(Settings(group_write_diffusion_max=2), clock_ms=lambda: PAST_MS)
    yield w
    await w.close()


def plain(entry: Any) -> Any:
    return orjson.loads(orjson.dumps(entry))


async def groups_of_bob(world: World) -> tuple[str, str]:
    big, _ = await world.admin.create("alice", "big", ["bob", "carol"])  # read-diffused
    small, _ = await world.admin.create("dave", "small", ["bob"])  # write-diffused
    return big, small


async def test_sync_merges_in_mid_order_and_cuts_at_the_limit(world: World) -> None:
    big, small = await groups_of_bob(world)
    chat, groups = world.chat, world.groups
    sent = [
        (await chat.send("alice", "bob", "d1", "d1")).mid,
        (await groups.send("carol", big, "g1", "g1")).mid,
        (await groups.send("dave", small, "s1", "s1")).mid,
        (await chat.send("erin", "bob", "d2", "d2")).mid,
        (await groups.send("alice", big, "g2", "g2")).mid,
    ]
    assert sent == sorted(sent)

    first = await world.conversations.sync("bob", 0, 3)
    assert [plain(m)["body"] for m in first.msgs] == ["d1", "g1", "s1"]
    assert [plain(m)["op"] for m in first.msgs] == ["msg", "group_msg", "group_msg"]
    assert first.more and first.next == sent[2]

    second = await world.conversations.sync("bob", first.next, 3)
    assert [plain(m)["body"] for m in second.msgs] == ["d2", "g2"]
    assert not second.more and second.next == sent[4]

    last = await world.conversations.sync("bob", second.next, 3)
    assert (last.msgs, last.more, last.next) == ([], False, sent[4])


async def test_sync_sees_read_diffused_groups_only_after_the_join(world: World) -> None:
    big, _ = await groups_of_bob(world)
    before = await world.groups.send("alice", big, "g0", "before erin")
    await world.admin.add("alice", big, ["erin"])
    after = await world.groups.send("alice", big, "g1", "after erin")
    page = await world.conversations.sync("erin", 0, 10)
    assert [plain(m)["mid"] for m in page.msgs] == [after.mid]
    page = await world.conversations.sync("bob", 0, 10)
    assert [plain(m)["mid"] for m in page.msgs] == [before.mid, after.mid]


async def test_conversations_sum_both_sides_newest_first(world: World) -> None:
    big, small = await groups_of_bob(world)
    quiet, _ = await world.admin.create("alice", "quiet", ["bob", "carol"])  # no message
    await world.chat.send("alice", "bob", "a1", "a1")
    await world.chat.send("alice", "bob", "a2", "a2")
    await world.groups.send("carol", big, "g1", "g1")
    await world.chat.send("dave", "bob", "d1", "d1")
    await world.groups.send("dave", small, "s1", "s1")
    await world.groups.send("bob", big, "g2", "own")  # bob's own: read, but the newest

    got = await world.conversations.conversations("bob", 10)
    rows = [(r["conv"], r["unread"], plain(r["last"])["body"] if r["last"] else None)
            for r in got["conversations"]]
    assert rows == [(f"g:{big}", 0, "own"), (f"g:{small}", 1, "s1"), ("dave", 1, "d1"),
                    ("alice", 2, "a2"), (f"g:{quiet}", 0, None)]
    assert got["total_unread"] == 2 + 1 + 1  # alice, dave, small

    top = await world.conversations.conversations("bob", 2)
    assert [r["conv"] for r in top["conversations"]] == [f"g:{big}", f"g:{small}"]
    assert top["total_unread"] == 4  # the total covers every conversation

    carol = await world.conversations.conversations("carol", 10)
    assert [(r["conv"], r["unread"]) for r in carol["conversations"]] == [
        (f"g:{big}", 1), (f"g:{quiet}", 0)]  # g1 is her own
    assert carol["total_unread"] == 1


async def test_read_and_history_dispatch_on_the_group_prefix(world: World) -> None:
    big, _ = await groups_of_bob(world)
    a = [(await world.chat.send("alice", "bob", f"a{i}", f"a{i}")).mid for i in range(2)]
    g = [(await world.groups.send("carol", big, f"g{i}", f"g{i}")).mid for i in range(3)]

    assert await world.conversations.mark_read("bob", "alice", a[0]) == 1
    assert await world.conversations.mark_read("bob", f"g:{big}", g[0]) == 2
    assert (await world.conversations.conversations("bob", 10))["total_unread"] == 3

    page, cursor = await world.conversations.history("bob", f"g:{big}", None, 2)
    assert [(f["op"], f["mid"]) for f in page] == [("group_msg", g[2]), ("group_msg", g[1])]
    assert cursor == g[1]
    page, cursor = await world.conversations.history("bob", "alice", None, 5)
    assert [(f["op"], f["mid"]) for f in page] == [("msg", a[1]), ("msg", a[0])]
    assert cursor is None


async def test_sync_cursors_stay_below_a_send_that_may_still_land(world: World) -> None:
    chat = world.chat
    first = (await chat.send("alice", "bob", "d1", "d1")).mid
    world.stores.messages.fail("store_batch")  # the store stalls: the send fails...
    with pytest.raises(Unavailable):
        await chat.send("erin", "bob", "d2", "d2")
    stalled = world.stores.dedup.values[("erin", "d2")]  # ...under a mid claimed pending
    world.stores.messages.heal()
    third = (await chat.send("alice", "bob", "d3", "d3")).mid

    # d2's mid may still land (a late write, a resend under it): the cursor stops below it.
    low = world.chat.inflight.oldest(time.monotonic())
    assert low is not None and first < low < third and stalled == dedup.pending(low)
    conversations = Conversations(chat, world.groups, 0, lambda: chat.inflight.oldest(
        time.monotonic()))
    page = await conversations.sync("bob", 0, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["d1", "d3"] and page.next == first

    # A late write of the stalled attempt lands under its mid (the store answered
    # too late): the cursor had not passed it, so the next sync returns it.
    late = ChatMessage(low, "erin", "bob", "d2", "d2")
    await world.stores.messages.store_batch([late])
    resent = await chat.send("erin", "bob", "d2", "d2")  # the resend finds it stored
    assert resent.mid == low
    page = await conversations.sync("bob", page.next, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["d2", "d3"]
    assert chat.inflight.oldest(time.monotonic() + 31) is None  # the linger is over
    page = await conversations.sync("bob", page.next, 10)
    assert page.next == third


@pytest.mark.parametrize("kind", ["1:1", "group"])
async def test_a_send_waiting_on_the_products_hook_is_not_passed_by_a_cursor(
        world: World, kind: str) -> None:
    """A send has its mid, then waits for the product's hook (or its claim in
    Redis), longer than the settle time: a sync meanwhile keeps its cursor
    below that mid, which lands once the hook answers. (The mid was marked in
    flight only after the hook: a slow hook let the cursor pass it.)"""
    chat, groups = world.chat, world.groups
    _, small = await groups_of_bob(world)
    first = (await chat.send("alice", "bob", "d0", "d0")).mid
    gate, asked = asyncio.Event(), asyncio.Event()

    async def slow_hook(body: Any) -> Any:
        asked.set()
        await gate.wait()
        return body

    sending: asyncio.Task[Any] = asyncio.create_task(
        chat.send("erin", "bob", "h1", "h1", vet=slow_hook) if kind == "1:1"
        else groups.send("dave", small, "h1", "h1", vet=slow_hook))

    def low_mark() -> int | None:
        now = time.monotonic()
        return min([m for m in (chat.inflight.oldest(now), groups.inflight.oldest(now))
                    if m is not None], default=None)

    await asyncio.wait_for(asked.wait(), 5)  # its mid taken, the hook asked
    later = (await chat.send("alice", "bob", "d2", "d2")).mid
    conversations = Conversations(chat, groups, 0, low_mark)
    page = await conversations.sync("bob", 0, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["d0", "d2"]
    assert page.next == first, "the cursor passed a send waiting on the hook"
    gate.set()
    held = (await sending).mid
    assert first < held < later
    page = await conversations.sync("bob", page.next, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["h1", "d2"]


async def test_a_send_stored_while_a_sync_reads_is_not_passed_by_its_cursor(
        world: World) -> None:
    """A send in flight when a sync starts, stored (and so no longer in flight)
    while the sync's reads are under way, after they went by its mid: the
    page's cursor stays below it, so the next sync returns it. (With the
    horizon taken after the reads, the low mark no longer held it: seen in the
    fault schedule, a sync slowed by the store passing a group message by.)"""
    chat = world.chat
    held = chat.mids.next()  # a send under way, its mid taken first...
    chat.inflight.add(held)
    later = (await chat.send("alice", "bob", "d2", "d2")).mid  # ...one after it, stored
    assert held < later
    conversations = Conversations(chat, world.groups, 0, lambda: chat.inflight.oldest(
        time.monotonic()))
    read = chat.sync_rows

    async def slow_read(user: str, since: int, count: int) -> list[tuple[int, Any]]:
        rows = await read(user, since, count)  # read before the held send lands...
        late = ChatMessage(held, "erin", "bob", "d1", "d1")
        await world.stores.messages.store_batch([late])  # ...which it does now
        chat.inflight.done(held)
        return rows

    chat.sync_rows = slow_read  # type: ignore[method-assign]
    page = await conversations.sync("bob", 0, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["d2"]
    assert page.next < held, "the cursor passed a send that was in flight when the sync began"
    chat.sync_rows = read  # type: ignore[method-assign]
    page = await conversations.sync("bob", page.next, 10)
    assert [plain(m)["body"] for m in page.msgs][:1] == ["d1"]


async def group_send_in_flight(world: World) -> tuple[asyncio.Task[Any], int, asyncio.Event,
                                                      list[int]]:
    """A write-diffused group send to bob held in flight (stored in the group,
    not yet in the members' boxes until ``gate`` is set), then three 1:1 sends
    to bob after it: (the send's task, its mid, the gate, the later mids)."""
    _, small = await groups_of_bob(world)  # dave and bob: write-diffused
    chat, groups = world.chat, world.groups
    gate = asyncio.Event()
    diffuse = groups.diffusion.diffuse

    async def slow_diffuse(msgs: Sequence[tuple[GroupMessage, bytes]]) -> None:
        await gate.wait()
        await diffuse(msgs)

    groups.diffusion.diffuse = slow_diffuse  # type: ignore[method-assign]
    sending = asyncio.create_task(groups.send("dave", small, "g1", "g1"))
    assert await settle(lambda: groups.inflight.oldest(time.monotonic()) is not None)
    held = groups.inflight.oldest(time.monotonic())
    later = [(await chat.send("erin", "bob", f"d{i}", f"d{i}")).mid for i in (1, 2, 3)]
    assert held is not None and held < later[0]
    return sending, held, gate, later


async def test_a_full_page_does_not_take_the_cursor_past_a_send_in_flight(
        world: World) -> None:
    """A device catching up more than a page at once, while a group send below
    the page's last message is in flight (stored in the group, not yet in the
    members' boxes): the full page's cursor stays below that send, so the next
    sync returns it. (A full page took the cursor to its last mid whatever was
    in flight: seen in the fault schedule, a member's sync after a reconnect
    passing four group messages diffused a moment later, whose pushes found
    no connection of it.)"""
    chat, groups = world.chat, world.groups
    first = (await chat.send("alice", "bob", "d0", "d0")).mid
    sending, held, gate, later = await group_send_in_flight(world)
    assert first < held

    def low_mark() -> int | None:  # one InFlight per node in gateway.app; two here
        now = time.monotonic()
        return min([m for m in (chat.inflight.oldest(now), groups.inflight.oldest(now))
                    if m is not None], default=None)

    conversations = Conversations(chat, groups, 0, low_mark, held_wait_s=0.05,
                                  held_mark_age_ms=None)  # (the world's mids are old)
    try:
        # The page ends below the send: d1 comes with the next page, not twice.
        page = await conversations.sync("bob", 0, 2)
        assert [plain(m)["body"] for m in page.msgs] == ["d0"] and page.more
        assert page.next == first, "a full page took the cursor past a send in flight"
        # A page whole above it waits for it (here 0.05 s), then passes it: a
        # client walking pages always moves (the send comes by its push).
        above = await conversations.sync("bob", page.next, 2)
        assert [plain(m)["body"] for m in above.msgs] == ["d1", "d2"]
        assert above.more and above.next == later[1]
    finally:
        gate.set()  # (the world's close waits for the send)
    assert (await sending).mid == held  # diffused, acked
    page = await conversations.sync("bob", first, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["g1", "d1", "d2", "d3"]
    assert not page.more and page.next == later[-1]


async def test_a_page_held_whole_is_read_again_once_the_send_lands(world: World) -> None:
    """A device walking a burst page by page while a send below it is in flight:
    a page held whole below that send is read again after a moment (the node's
    ``held_wait_s``), and once the send has landed it moves on, the send in it."""
    chat, groups = world.chat, world.groups
    sending, held, gate, later = await group_send_in_flight(world)
    conversations = Conversations(chat, groups, 0, lambda: groups.inflight.oldest(
        time.monotonic()), held_wait_s=0.2, held_mark_age_ms=None)  # (old mids)
    asyncio.get_running_loop().call_later(0.05, gate.set)  # it lands during the wait
    page = await conversations.sync("bob", held - 1, 2)
    assert (await sending).mid == held
    assert [plain(m)["body"] for m in page.msgs] == ["g1", "d1"]
    assert page.more and page.next == later[0]


async def test_a_page_held_by_an_old_mark_passes_it_without_waiting(world: World) -> None:
    """A mark older than ``held_mark_age_ms`` (a send that failed lingers 30 s)
    is not waited for: a page whole above it passes it at once."""
    chat = world.chat
    stuck = chat.mids.next()  # a send that failed, its mark lingering
    chat.inflight.add(stuck)
    chat.inflight.failed(stuck, time.monotonic())
    later = [(await chat.send("alice", "bob", f"d{i}", f"d{i}")).mid for i in range(3)]
    conversations = Conversations(chat, world.groups, 0, lambda: chat.inflight.oldest(
        time.monotonic()), held_wait_s=60, held_mark_age_ms=1)  # the world's mids: old
    page = await asyncio.wait_for(conversations.sync("bob", stuck, 2), 10)  # not 60 s
    assert [plain(m)["body"] for m in page.msgs] == ["d0", "d1"]
    assert page.more and page.next == later[1]


async def test_a_full_page_stops_below_a_send_under_way_not_a_failed_one(
        world: World) -> None:
    """A failed send's mark lingers (it may still land) and holds pages that are
    not full; a full page stops only below a send under way (the live mark), so
    a lingering failure does not stop a device walking pages from moving, nor
    let it pass a send under way."""
    chat, groups = world.chat, world.groups
    failed = chat.mids.next()
    chat.inflight.add(failed)
    chat.inflight.failed(failed, time.monotonic())  # lingers 30 s
    first = (await chat.send("alice", "bob", "d0", "d0")).mid
    sending, held, gate, later = await group_send_in_flight(world)
    now = time.monotonic
    conversations = Conversations(
        chat, groups, 0, lambda: min(m for m in (chat.inflight.oldest(now()),
                                                 groups.inflight.oldest(now())) if m),
        held_wait_s=0.05, held_mark_age_ms=None,
        live_mark=lambda: groups.inflight.oldest_live())
    try:
        page = await conversations.sync("bob", 0, 2)  # full: past the failed one
        assert [plain(m)["body"] for m in page.msgs] == ["d0"] and page.next == first
        short = await conversations.sync("bob", 0, 10)  # not full: below the failed one
        assert short.next < failed < first
    finally:
        gate.set()
    assert (await sending).mid == held
    page = await conversations.sync("bob", first, 10)
    assert [plain(m)["body"] for m in page.msgs] == ["g1", "d1", "d2", "d3"]


async def test_conversation_pages_cover_the_list_once_in_order(world: World) -> None:
    big, small = await groups_of_bob(world)
    quiet, _ = await world.admin.create("alice", "quiet", ["bob", "carol"])  # no message
    for i, peer in enumerate(["alice", "dave", "erin"]):
        await world.chat.send(peer, "bob", f"c{i}", i)
        await world.groups.send("bob", big if i % 2 else small, f"g{i}", i)
    whole = await world.conversations.conversations("bob", 50)
    seen: list[str] = []
    cursor = None
    while True:
        page = await world.conversations.conversations("bob", 2, cursor)
        assert len(page["conversations"]) <= 2
        assert page["total_unread"] == whole["total_unread"]
        seen += [r["conv"] for r in page["conversations"]]
        cursor = page["cursor"]
        if cursor is None:
            break
    assert seen == [r["conv"] for r in whole["conversations"]]
    assert len(seen) == 6 and seen[-1] == f"g:{quiet}" and whole["cursor"] is None
    # Another user's cursor, or a forged one, is refused.
    first = await world.conversations.conversations("bob", 2)
    for bad in (first["cursor"] + "x", "not-a-cursor"):
        with pytest.raises(ProtocolError):
            await world.conversations.conversations("bob", 2, bad)
    with pytest.raises(ProtocolError):
        await world.conversations.conversations("carol", 2, first["cursor"])


async def _sync_all(world: World, user: str, limit: int) -> tuple[list[int], list[int]]:
    """Every page of ``user``'s sync from 0: the mids in order, and the group
    pages each call read from the store."""
    mids: list[int] = []
    reads: list[int] = []
    since = 0
    store = world.stores.groups
    for _ in range(200):
        before = store.calls["page"]
        page = await world.conversations.sync(user, since, limit)
        reads.append(store.calls["page"] - before)
        mids += [plain(m)["mid"] for m in page.msgs]
        assert page.next >= since
        since = page.next
        if not page.more:
            return mids, reads
    raise AssertionError("the sync did not end")


async def test_a_sync_reads_a_bounded_number_of_groups_per_call(world: World) -> None:
    groups = [(await world.admin.create(f"owner{i % 4}", f"g{i}", ["bob", "carol"]))[0]
              for i in range(40)]  # four owners: ten creations a minute each
    sent = []
    for k in range(2):
        for g in groups:
            sent.append((await world.groups.send("carol", g, f"{g}-{k}", k)).mid)
    sent += [(await world.chat.send("dave", "bob", f"d{k}", k)).mid for k in range(5)]
    mids, reads = await _sync_all(world, "bob", 10)
    assert mids == sorted(sent) and len(set(mids)) == len(mids)
    assert max(reads) <= SYNC_GROUP_READS < len(groups)
    # With the indexes gone, every group is read once and its index rebuilt:
    # the next sync is bounded again.
    world.stores.group_cache.index.clear()
    again, reads = await _sync_all(world, "bob", 10)
    assert again == mids and reads[0] == len(groups)
    await asyncio.gather(*world.groups._repairs)
    last, reads = await _sync_all(world, "bob", 10)
    assert last == mids and max(reads) <= SYNC_GROUP_READS


async def test_a_sync_leaves_out_what_came_before_joining(world: World) -> None:
    g, _ = await world.admin.create("alice", "g", ["carol", "dave"])
    early = [(await world.groups.send("carol", g, f"e{k}", k)).mid for k in range(3)]
    await world.admin.add("alice", g, ["bob"])
    late = [(await world.groups.send("carol", g, f"l{k}", k)).mid for k in range(3)]
    mids, _ = await _sync_all(world, "bob", 2)
    assert mids == late and not set(early) & set(mids)


async def test_lists_spend_by_the_number_of_groups(world: World) -> None:
    spent: list[tuple[str, float]] = []
    world.conversations.spend = lambda user, n: spent.append((user, n))
    await groups_of_bob(world)
    await world.conversations.conversations("bob", 10)
    await world.conversations.sync("bob", 0, 10)
    # each read two groups: 2 / GROUPS_PER_CALL
    assert spent == [("bob", 0.002), ("bob", 0.002)]


async def test_a_list_of_many_groups_reads_their_numbers_once_in_a_while(world: World) -> None:
    from gateway.groups import service
    service.VIEW_MIN_GROUPS, old = 2, service.VIEW_MIN_GROUPS
    try:
        big, small = await groups_of_bob(world)
        cache = world.stores.group_cache
        first = await world.conversations.conversations("bob", 10)
        reads = cache.calls["states"]
        again = await world.conversations.conversations("bob", 10)
        assert again == first and cache.calls["states"] == reads + 1  # the page's lasts only
        # bob's own read updates the view: the next list sees it at once.
        await world.groups.send("carol", big, "g1", "g1")
        await world.conversations.mark_read("bob", f"g:{big}", (await world.groups.send(
            "carol", big, "g2", "g2")).mid)
        after = await world.conversations.conversations("bob", 10)
        assert after["total_unread"] == 0 and cache.calls["states"] > reads + 2
    finally:
        service.VIEW_MIN_GROUPS = old
