"""GroupService (gateway/groups/service.py) over fakes of its stores: membership and
the control messages it sends, per-group seqs across a shared batch, write vs
read diffusion, one encoding per message, tombstones after a failed insert,
read marks. No servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import orjson
import pytest

from core import dedup
from core.errors import Unavailable
from core.ids import mid_time_ms
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.frames import group_frame
from gateway.groups.service import GroupSendResult
from router.controls import GroupAdd, GroupDel
from store.records import GroupMessage
from tests.core.fakes import settle
from tests.core.world import World, build

WD_MAX = 3  # groups of up to 3 members are write-diffused


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = build(Settings(group_write_diffusion_max=WD_MAX))
    yield w
    await w.close()


async def code_of(work: Awaitable[object]) -> str:
    with pytest.raises(ProtocolError) as err:
        await work
    return err.value.code


def stored(world: World, group: str, r: GroupSendResult) -> GroupMessage:
    m = world.stores.groups.msgs[group][r.seq]
    assert m is not None and m.mid == r.mid
    return m


async def test_create_add_remove_tell_the_users_devices(world: World) -> None:
    told = world.control.told
    g, _ = await world.admin.create("alice", "team", ["bob", "carol", "bob"])
    assert told == [(["alice", "bob", "carol"], GroupAdd(g))]
    assert await world.stores.group_cache.is_member(g, "carol")

    await world.admin.add("alice", g, ["dave", "bob", "dave"])  # bob is in already
    assert told[-1:] == [(["dave"], GroupAdd(g))]
    await world.admin.remove("alice", g, "carol")
    assert told[-1:] == [(["carol"], GroupDel(g))]
    assert not await world.stores.group_cache.is_member(g, "carol")

    await world.admin.remove("alice", g, "carol")  # not a member any more: nobody told
    assert len(told) == 3
    assert await code_of(world.admin.add("bob", g, ["erin"])) == "forbidden"
    assert await code_of(world.admin.remove("alice", g, "alice")) == "bad_request"
    assert await code_of(world.admin.add("alice", "nope", ["erin"])) == "not_found"
    assert len(told) == 3


async def test_a_non_member_cannot_send(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    assert await code_of(world.groups.send("carol", g, "c1", "hi")) == "forbidden"
    assert world.stores.groups.allocations == [] and world.stores.dedup.values == {}


async def test_seqs_are_consecutive_per_group_across_one_batch(world: World) -> None:
    g1, _ = await world.admin.create("alice", "one", ["bob"])
    g2, _ = await world.admin.create("alice", "two", ["carol"])
    order = [g1, g2, g1, g2, g1, g1]
    results = await asyncio.gather(*(world.groups.send("alice", g, f"c{i}", i)
                                     for i, g in enumerate(order)))
    seqs = {g: [r.seq for r, h in zip(results, order, strict=True) if h == g]
            for g in (g1, g2)}
    assert seqs == {g1: [1, 2, 3, 4], g2: [1, 2]}  # arrival order, no hole
    st = world.stores.groups
    assert len(st.inserts) == 1  # the six sends shared one batch
    assert sorted(st.allocations) == sorted([(g1, 4), (g2, 2)])  # one $inc per group
    assert [m.seq for m in st.inserts[0] if m.group == g1] == [1, 2, 3, 4]
    for i, (r, g) in enumerate(zip(results, order, strict=True)):
        assert stored(world, g, r).body == i
        assert world.stores.dedup.values[("alice", f"c{i}")] == dedup.done(r.mid, r.seq)


async def test_small_groups_are_write_diffused_big_ones_are_not(world: World) -> None:
    small, _ = await world.admin.create("alice", "small", ["bob", "carol"])
    big, _ = await world.admin.create("alice", "big", ["bob", "carol", "dave"])
    rs = await world.groups.send("bob", small, "s1", "to the few")
    rb = await world.groups.send("bob", big, "b1", "to the many")
    st = world.stores

    ms, mb = stored(world, small, rs), stored(world, big, rb)
    assert ms.wd and not mb.wd
    assert st.messages.group_boxes == [(ms, ["alice", "bob", "carol"])]
    diffused = st.offline.deliveries  # the big group's message added none
    assert sorted(d.owner for d in diffused) == ["alice", "bob", "carol"]
    assert all(d.conv == f"g:{small}" and d.mid == rs.mid and not d.unread
               and not d.conv_list for d in diffused)
    # read diffusion: the group's state says where its members read from
    assert st.group_cache.state[big].rdmid == rb.mid
    assert st.group_cache.state[small].rdmid == 0
    assert st.groups.groups[big]["rdmid"] == rb.mid and st.groups.groups[small]["rdmid"] == 0


async def test_the_frame_is_encoded_once_and_the_same_bytes_go_everywhere(world: World) -> None:
    g, _ = await world.admin.create("alice", "small", ["bob"])
    r = await world.groups.send("alice", g, "c1", {"t": "hi"})
    assert r.frame is not None and r.ts == mid_time_ms(r.mid)
    assert orjson.loads(r.frame) == group_frame(stored(world, g, r))
    cache = world.stores.group_cache
    assert [d.frame for d in world.stores.offline.deliveries] == [r.frame, r.frame]
    assert all(d.frame is r.frame for d in world.stores.offline.deliveries)
    assert cache.records == [(g, 1, r.mid, r.frame, 0)] and cache.records[0][3] is r.frame
    assert cache.state[g].last is r.frame


async def test_a_failed_insert_raises_and_its_seqs_get_tombstones(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    st = world.stores.groups
    st.fail("insert")
    failed = await asyncio.gather(world.groups.send("alice", g, "c1", "x"),
                                  world.groups.send("bob", g, "c2", "y"),
                                  return_exceptions=True)
    assert all(isinstance(e, Unavailable) for e in failed)
    assert world.stores.offline.acked == []  # never a false ack
    assert await settle(lambda: len(st.filled) == 2)  # the repair runs in the background
    assert sorted(m.seq for m in st.filled) == [1, 2]
    assert st.msgs[g] == {1: None, 2: None}

    st.heal()
    claimed = next(m.mid for m in st.filled if m.cmid == "c1")
    r = await world.groups.send("alice", g, "c1", "x")  # the client's retry
    # Nothing was stored: a fresh mid (the claimed one may be below sync cursors
    # handed out since) and a fresh seq.
    assert r.mid > claimed and r.seq == 3
    page = await st.page(g, from_seq=0)
    assert [(m.seq, m.cmid) for m in page] == [(3, "c1")]


async def test_resends_are_answered_from_the_dedup_value(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    first = await world.groups.send("alice", g, "c1", "hi")
    again = await world.groups.send("alice", g, "c1", "hi")
    # The same answer, and the push again (the first may have died with its node).
    assert (again.mid, again.seq, again.frame) == (first.mid, first.seq, first.frame)
    assert again.repeat and not first.repeat
    assert len(world.stores.groups.inserts) == 1
    world.stores.groups.fail("message")  # unreadable: answered, not pushed
    assert (await world.groups.send("alice", g, "c1", "hi")).frame is None
    world.stores.groups.heal()

    await world.chat.send("alice", "bob", "c2", "1:1")
    assert await code_of(world.groups.send("alice", g, "c2", "hi")) == "bad_request"


async def test_a_resend_the_store_knows_gets_the_original_and_burns_its_seq(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    first = await world.groups.send("alice", g, "c1", "hi")
    world.stores.dedup.values.clear()  # Redis lost the dedup keys
    again = await world.groups.send("alice", g, "c1", "hi")
    assert (again.mid, again.seq) == (first.mid, first.seq)
    st = world.stores.groups
    assert [m.seq for m in st.filled] == [2] and st.msgs[g][2] is None


async def test_read_returns_seq_minus_read_seq(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    sent = [await world.groups.send("alice", g, f"c{i}", i) for i in range(5)]
    assert await world.groups.read("bob", g, sent[2].mid) == 2  # read 3 of 5
    assert world.stores.group_cache.by_user["bob"][g].read_seq == 3
    assert world.stores.groups.members[g]["bob"].read_seq == 3
    assert await world.groups.read("bob", g, sent[0].mid) == 2  # never moves back
    assert await world.groups.read("alice", g, sent[0].mid) == 0  # own messages are read

    await world.admin.add("alice", g, ["carol"])  # joins at seq 5
    r = await world.groups.send("alice", g, "c9", "after carol joined")
    assert await world.groups.read("carol", g, sent[0].mid) == 1
    assert await world.groups.read("carol", g, r.mid) == 0
    assert await code_of(world.groups.read("bob", g, 12345)) == "not_found"
    assert await code_of(world.groups.read("erin", g, r.mid)) == "forbidden"


async def test_history_starts_after_the_member_joined(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    before = await world.groups.send("alice", g, "c0", "old")
    await world.admin.add("alice", g, ["carol"])
    after = [await world.groups.send("bob", g, f"c{i}", i) for i in range(1, 4)]
    page, cursor = await world.groups.history("carol", g, None, 2)
    assert [f["mid"] for f in page] == [after[2].mid, after[1].mid]
    assert cursor == after[1].mid
    page, cursor = await world.groups.history("carol", g, cursor, 2)
    assert [f["mid"] for f in page] == [after[0].mid] and cursor is None
    page, _ = await world.groups.history("bob", g, None, 10)
    assert page[-1]["mid"] == before.mid and page[-1]["op"] == "group_msg"
