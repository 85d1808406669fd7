"""GroupAdmin (gateway/groups/admin.py) over fakes: the order of store, cache,
controls and group_event pushes per change, owner and member rules, the
administration lease, dissolve against sends (the seq allocation refuses),
member pages with opaque cursors, and read status from read seqs
(core/group_reads.py). No servers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import orjson
import pytest

from core.errors import Unavailable
from core.group_reads import read_status
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.groups import admin as group_admin
from router.controls import GroupAdd, GroupDel
from tests.core.world import World, build

WD_MAX = 3


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = build(Settings(group_write_diffusion_max=WD_MAX))
    yield w
    await w.close()


async def code_of(work: Awaitable[object]) -> str:
    with pytest.raises(ProtocolError) as err:
        await work
    return err.value.code


def event(frame: bytes) -> dict[str, Any]:
    return dict(orjson.loads(frame))


def steps(world: World) -> list[tuple[str, Any]]:
    """The notifier's calls in order, frames decoded: ("group", event),
    ("push", (users, event)), ("tell", (users, ctl))."""
    out: list[tuple[str, Any]] = []
    for kind, what in world.control.log:
        if kind == "group":
            out.append((kind, event(what[1])))
        elif kind == "push":
            out.append((kind, (what[0], event(what[1]))))
        else:
            out.append((kind, what))
    world.control.log.clear()
    return out


def ev(g: str, name: str, users: list[str], by: str) -> dict[str, Any]:
    return {"op": "group_event", "group": g, "event": name, "users": users, "by": by}


# -- read status (pure) ----------------------------------------------------------------
def test_read_status_counts_the_members_who_could_see_it_but_its_sender() -> None:
    members = [("alice", 0, 5), ("bob", 0, 2), ("carol", 0, 3), ("dave", 4, 4),
               ("erin", 2, 2), ("fred", 3, 3)]
    st = read_status(3, "alice", members)
    # alice sent it; dave and fred joined at or after seq 3; carol read up to 3
    assert (st.readers, st.unread, st.read) == (["carol"], 2, 1)
    assert read_status(1, "x", []).readers == [] and read_status(1, "x", []).unread == 0
    st = read_status(2, "zed", [("b", 0, 9), ("a", 1, 2)])
    assert st.readers == ["a", "b"] and st.unread == 0


# -- membership changes and their pushes -------------------------------------------------
async def test_add_pushes_the_event_before_the_new_members_are_bound(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    assert steps(world) == [("push", (["alice", "bob"], ev(g, "added", ["bob"], "alice"))),
                            ("tell", (["alice", "bob"], GroupAdd(g)))]
    await world.admin.add("alice", g, ["carol", "bob", "carol"])
    added = ev(g, "added", ["carol"], "alice")
    assert steps(world) == [("group", added), ("push", (["carol"], added)),
                            ("tell", (["carol"], GroupAdd(g)))]
    await world.admin.add("alice", g, ["bob"])  # nothing new: nobody told
    assert steps(world) == []
    pushed = world.control.pushed[-1][1]
    assert world.control.published[-1][1] is pushed  # one encoding for both paths


async def test_remove_and_leave_unbind_first_then_push(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob", "carol"])
    steps(world)
    await world.admin.remove("alice", g, "bob")
    removed = ev(g, "removed", ["bob"], "alice")
    assert steps(world) == [("tell", (["bob"], GroupDel(g))), ("group", removed),
                            ("push", (["bob"], removed))]
    await world.admin.leave("carol", g)
    left = ev(g, "left", ["carol"], "carol")
    assert steps(world) == [("tell", (["carol"], GroupDel(g))), ("group", left),
                            ("push", (["carol"], left))]
    cache = world.stores.group_cache
    assert cache.member_sets[g] == {"alice"} and g not in cache.by_user["carol"]
    assert world.stores.groups.groups[g]["size"] == 1
    assert await code_of(world.admin.leave("carol", g)) == "forbidden"  # not a member now
    assert await code_of(world.admin.leave("alice", g)) == "bad_request"  # the owner
    assert await code_of(world.admin.leave("carol", "nope")) == "not_found"
    assert await code_of(world.groups.send("carol", g, "c1", "x")) == "forbidden"
    assert steps(world) == []


async def test_rename_and_hand_over(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    steps(world)
    assert await code_of(world.admin.update("bob", g, name="x")) == "forbidden"
    assert await code_of(world.admin.update("alice", g, owner="zed")) == "bad_request"
    assert await code_of(world.admin.update("alice", "nope", name="x")) == "not_found"
    await world.admin.update("alice", g, name="crew", owner="bob")
    assert steps(world) == [("group", ev(g, "renamed", [], "alice")),
                            ("group", ev(g, "owner", ["bob"], "alice"))]
    assert await world.admin.info("alice", g) == {"group": g, "name": "crew", "owner": "bob",
                                                  "members": 2}
    await world.admin.update("bob", g, name="crew", owner="bob")  # nothing changes
    assert steps(world) == []
    assert await code_of(world.admin.update("alice", g, name="y")) == "forbidden"
    await world.admin.leave("alice", g)  # no longer the owner: may leave
    assert await code_of(world.admin.info("alice", g)) == "forbidden"
    assert (await world.admin.list_groups("bob"))["groups"] == [
        {"group": g, "name": "crew", "owner": "bob", "members": 1}]


# -- dissolve ----------------------------------------------------------------------------
async def test_dissolve_announces_then_retires_every_member(world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob", "carol"])
    sent = await world.groups.send("bob", g, "b1", "hello")
    steps(world)
    assert await code_of(world.admin.dissolve("bob", g)) == "forbidden"
    await world.admin.dissolve("alice", g)
    assert steps(world) == [("group", ev(g, "dissolved", [], "alice")),
                            ("tell", (["alice", "bob", "carol"], GroupDel(g)))]
    assert await code_of(world.groups.send("bob", g, "b2", "x")) == "not_found"
    assert await code_of(world.groups.send("sys", g, "s1", "x", as_server=True)) == "not_found"
    for call in (world.admin.info("bob", g), world.admin.add("alice", g, ["dave"]),
                 world.admin.update("alice", g, name="x"), world.admin.leave("bob", g),
                 world.admin.members_page("bob", g, None, 10),
                 world.admin.reads("bob", g, sent.mid), world.admin.dissolve("bob", g)):
        assert await code_of(call) == "not_found"
    await world.admin.dissolve("alice", g)  # the owner's retry: answered again
    assert await world.admin.list_groups("bob") == {"groups": [], "cursor": None}
    convs = await world.conversations.conversations("bob", 10)
    assert convs == {"total_unread": 0, "conversations": [], "cursor": None}
    page, _ = await world.groups.history("bob", g, None, 10)  # history stays readable
    assert [f["mid"] for f in page] == [sent.mid]
    assert await code_of(world.groups.history("dave", g, None, 10)) == "forbidden"


async def test_a_send_that_passed_the_member_check_is_refused_by_the_allocation(
        world: World) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    await world.stores.groups.dissolve(g)  # the cache still says bob is a member
    assert await world.stores.group_cache.is_member(g, "bob")
    results = await asyncio.gather(*(world.groups.send("bob", g, f"c{i}", i) for i in range(5)),
                                   return_exceptions=True)
    assert all(isinstance(r, ProtocolError) and r.code == "not_found" for r in results)
    st = world.stores.groups
    assert st.allocations == [] and st.inserts == [] and st.groups[g]["seq"] == 0


# -- the lease ----------------------------------------------------------------------------
async def test_changes_of_one_group_wait_for_its_lease(world: World,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob"])
    st = world.stores.groups
    assert await st.lock(g, "other", 0, 10**15)  # another node holds it
    monkeypatch.setattr(group_admin, "LEASE_WAIT_S", 0.05)
    with pytest.raises(Unavailable):
        await world.admin.add("alice", g, ["carol"])
    assert "carol" not in st.members[g]
    monkeypatch.setattr(group_admin, "LEASE_WAIT_S", 5.0)
    waiting = asyncio.create_task(world.admin.add("alice", g, ["carol"]))
    await asyncio.sleep(0.02)
    assert not waiting.done()
    await st.unlock(g, "other")
    await waiting
    assert "carol" in st.members[g] and st.groups[g]["lk"] == 0  # released after
    with pytest.raises(ProtocolError):
        await world.admin.remove("alice", g, "alice")
    assert st.groups[g]["lk"] == 0  # released after a refusal too


# -- members and reads -------------------------------------------------------------------
async def test_member_pages_with_opaque_cursors(world: World) -> None:
    users = [f"u{i:02d}" for i in range(7)]
    g, _ = await world.admin.create("alice", "team", users)
    other, _ = await world.admin.create("alice", "other", users)
    seen: list[str] = []
    cursor = None
    while True:
        page = await world.admin.members_page("u03", g, cursor, 3)
        seen += page["users"]
        cursor = page["cursor"]
        if cursor is None:
            break
        assert cursor != page["users"][-1]  # opaque: not the id itself
    assert seen == sorted(["alice", *users])
    first = await world.admin.members_page("u03", g, None, 3)
    assert await code_of(world.admin.members_page("u03", other, first["cursor"], 3)) \
        == "bad_request"  # another list's cursor
    for bad in ("u02", "!!", first["cursor"][:-1]):
        assert await code_of(world.admin.members_page("u03", g, bad, 3)) == "bad_request"
    assert await code_of(world.admin.members_page("zed", g, None, 3)) == "forbidden"


@pytest.mark.parametrize("extra", [[], ["dave"]], ids=["small", "big"])
async def test_reads_are_counted_from_the_read_seqs(extra: list[str]) -> None:
    world = build(Settings(group_write_diffusion_max=4))
    try:
        await _reads(world, extra)
    finally:
        await world.close()


async def _reads(world: World, extra: list[str]) -> None:
    g, _ = await world.admin.create("alice", "team", ["bob", "carol", *extra])
    sent = [await world.groups.send("alice", g, f"a{i}", i) for i in range(3)]
    await world.groups.read("bob", g, sent[1].mid)
    await world.admin.add("alice", g, ["erin"])  # joined after: not counted
    status = await world.admin.reads("bob", g, sent[1].mid)
    want: dict[str, Any] = {"read": 1, "unread": 1 + len(extra)}
    if not extra:  # 4 members, at most IM_GROUP_WRITE_DIFFUSION_MAX: who read it too
        want["users"] = ["bob"]
    assert status == want
    mine = await world.groups.send("carol", g, "c1", "carol's")  # read by its sender
    assert (await world.admin.reads("alice", g, mine.mid))["read"] == 0
    assert await code_of(world.admin.reads("bob", g, 12345)) == "not_found"
    assert await code_of(world.admin.reads("erin", g, sent[0].mid)) == "not_found"  # before
    assert await code_of(world.admin.reads("zed", g, sent[0].mid)) == "forbidden"


# -- caps -------------------------------------------------------------------------------
def capped(**limits: Any) -> World:
    return build(Settings(group_write_diffusion_max=WD_MAX, **limits))


async def test_group_creations_per_minute_are_capped_per_user() -> None:
    world = capped(group_creates_per_min=2)
    await world.admin.create("alice", "a", [])
    await world.admin.create("alice", "b", [])
    assert await code_of(world.admin.create("alice", "c", [])) == "rate_limited"
    await world.admin.create("bob", "c", [])  # another user's own budget
    world.stores.quotas.now += 60  # the next minute
    await world.admin.create("alice", "c", [])
    assert world.stores.refusals == ["group_creates_per_min"]
    await world.close()


async def test_groups_owned_are_capped_and_a_handover_past_it_is_refused() -> None:
    world = capped(max_groups_owned=2)
    g, _ = await world.admin.create("alice", "a", ["bob"])
    await world.admin.create("alice", "b", [])
    try:
        await world.admin.create("alice", "c", [])
    except ProtocolError as err:
        assert err.code == "forbidden" and "IM_MAX_GROUPS_OWNED" in err.message
    else:
        raise AssertionError("a third group was created")
    await world.admin.create("bob", "x", [])
    await world.admin.create("bob", "y", [])
    assert await code_of(world.admin.update("alice", g, owner="bob")) == "forbidden"
    await world.admin.dissolve("alice", g)  # a dissolved group no longer counts
    await world.admin.create("alice", "c", [])
    assert world.stores.refusals == ["max_groups_owned"] * 2
    await world.close()


async def test_members_at_their_joined_cap_are_refused_and_the_rest_added() -> None:
    world = capped(max_groups_joined=2)
    await world.admin.create("alice", "a", ["carol"])
    await world.admin.create("bob", "b", ["carol"])  # carol is in 2 groups now
    g, refused = await world.admin.create("dave", "d", ["carol", "erin"])
    assert refused == ["carol"]
    assert (await world.admin.info("erin", g))["members"] == 2  # dave and erin
    assert await code_of(world.admin.info("carol", g)) == "forbidden"
    h, _ = await world.admin.create("erin", "e", [])
    assert await world.admin.add("erin", h, ["carol", "dave"]) == ["carol"]
    assert sorted(await world.stores.groups.member_ids(h)) == ["dave", "erin"]
    assert await world.admin.add("erin", h, ["carol"]) == ["carol"]  # nothing added at all
    # The owner itself at its cap: forbidden, nothing created.
    assert await code_of(world.admin.create("carol", "c", [])) == "forbidden"
    assert world.stores.refusals.count("max_groups_joined") == 4
    await world.close()


async def test_a_long_group_list_is_kept_a_moment_and_dropped_by_a_change_here(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A user in LIST_MIN_GROUPS groups or more (3 here): its sorted ids are
    read once for page after page; a group added or left here shows at once."""
    monkeypatch.setattr(group_admin, "LIST_MIN_GROUPS", 3)
    admin, cache = world.admin, world.stores.group_cache
    groups = sorted([(await admin.create(f"o{i}", f"g{i}", ["bob"]))[0] for i in range(4)])
    first = await admin.list_groups("bob", limit=2)
    reads = cache.calls["user_groups"]
    second = await admin.list_groups("bob", first["cursor"], limit=2)
    assert [g["group"] for g in first["groups"] + second["groups"]] == groups
    assert second["cursor"] is None and cache.calls["user_groups"] == reads
    await admin.leave("bob", groups[0])
    after = await admin.list_groups("bob", limit=10)
    assert [g["group"] for g in after["groups"]] == groups[1:]
    assert cache.calls["user_groups"] > reads
