"""Sends that failed after their message may have been stored are finished by
the node itself (``gateway.chat.unfinished``), over fakes of the stores: the
message reaches both users' offline stores and the send is acked, with no
resend; one never stored is let go after the linger; sync cursors stay below
each meanwhile. No servers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import orjson
import pytest

from core import dedup
from core.errors import Unavailable
from gateway.chat.unfinished import UnfinishedSends
from gateway.config import Settings
from store.records import ChatMessage
from tests.core.fakes import settle
from tests.core.world import World, build


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def world() -> AsyncIterator[World]:
    w = build(Settings(group_write_diffusion_max=3))
    yield w
    await w.close()


def finisher(world: World, clock: Clock, *, max_pending: int = 10_000,
             first_delay_s: float = 0.5,
             pushed: list[tuple[str, int]] | None = None) -> tuple[UnfinishedSends, list[str]]:
    """As ``gateway.app.compose`` wires it; ``pushed``: (user or group, mid) of
    each push made."""
    outcomes: list[str] = []
    pushes = pushed if pushed is not None else []

    def push_chat(msg: ChatMessage, frame: bytes, sender_routes: dict[str, str],
                  receiver_routes: dict[str, str]) -> None:
        pushes.extend([(msg.to, msg.mid), (msg.sender, msg.mid)])

    def push_group(group: str, frame: bytes) -> None:
        pushes.append((group, int(orjson.loads(frame)["mid"])))

    async def redeliver(node: int, low: int, high: int) -> int:
        return (await world.chat.redeliver(node, low, high, push_chat)
                + await world.groups.redeliver(node, low, high, push_group))

    done = UnfinishedSends(redeliver, world.chat.inflight, linger_s=30.0, clock=clock,
                           count=lambda outcome, n: outcomes.extend([outcome] * n),
                           max_pending=max_pending, first_delay_s=first_delay_s)
    world.chat.unfinished = world.groups.unfinished = done.add
    return done, outcomes


async def test_a_send_stored_but_not_delivered_is_delivered_and_acked_without_a_resend(
        world: World) -> None:
    st, clock = world.stores, Clock()
    pushed: list[tuple[str, int]] = []
    done, outcomes = finisher(world, clock, pushed=pushed)
    st.offline.fail("deliver")  # MongoDB has it; the offline stores failed
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")
    (mid,) = st.messages.bodies
    assert done.pending == 1 and world.chat.inflight.oldest(clock.now + 60) == mid  # held
    with pytest.raises(Unavailable):  # still down: kept for the next round
        await done.finish_round()
    assert done.pending == 1

    st.offline.heal()  # and the client never resends
    await done.finish_round()
    assert outcomes == ["finished"] and done.pending == 0
    assert pushed == [("bob", mid), ("alice", mid)]  # no push was made before
    assert st.offline.inboxes["bob"].unread == {"alice": {mid}}
    assert list(st.offline.inboxes["alice"].entries) == [mid]
    assert st.dedup.values[("alice", "c1")] == dedup.done(mid)
    assert world.chat.inflight.oldest(clock.now + 60) is None  # cursors may pass it
    # a resend that comes after all is answered with the same mid, nothing stored again
    again = await world.chat.send("alice", "bob", "c1", "hi")
    assert again.mid == mid and list(st.messages.bodies) == [mid]
    assert st.offline.inboxes["bob"].unread == {"alice": {mid}}


async def test_a_send_never_stored_is_let_go_after_the_linger(world: World) -> None:
    st, clock = world.stores, Clock()
    done, outcomes = finisher(world, clock)
    st.messages.fail("store_batch")
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")
    st.messages.heal()
    await done.finish_round()  # not found, but a late write may still land: kept
    assert done.pending == 1 and outcomes == []
    clock.now += 31
    await done.finish_round()
    assert outcomes == ["not_stored"] and done.pending == 0
    assert world.chat.inflight.oldest(clock.now) is None
    assert st.offline.deliveries == [] and st.messages.bodies == {}


async def test_a_group_send_stored_but_not_recorded_is_finished(world: World) -> None:
    clock = Clock()
    pushed: list[tuple[str, int]] = []
    done, outcomes = finisher(world, clock, pushed=pushed)
    g, _ = await world.admin.create("alice", "team", ["bob"])
    world.stores.group_cache.fail("record")
    with pytest.raises(Unavailable):
        await world.groups.send("alice", g, "c1", "hi")
    world.stores.group_cache.heal()
    await done.finish_round()
    assert outcomes == ["finished"]
    (seq, m), = ((s, m) for s, m in world.stores.groups.msgs[g].items() if m is not None)
    assert world.stores.group_cache.state[g].seq == seq and pushed == [(g, m.mid)]
    again = await world.groups.send("alice", g, "c1", "hi")  # a late resend: the same
    assert (again.mid, again.seq) == (m.mid, seq)


async def test_failed_sends_past_the_bound_fall_back_to_the_linger(world: World) -> None:
    clock = Clock()
    done, outcomes = finisher(world, clock, max_pending=2)
    world.stores.offline.fail("deliver")
    for i in range(3):
        with pytest.raises(Unavailable):
            await world.chat.send("alice", "bob", f"c{i}", i)
    assert done.pending == 2 and outcomes == ["dropped"]
    world.stores.offline.heal()
    await done.finish_round()
    assert outcomes == ["dropped", "finished", "finished"]


async def test_the_finisher_runs_by_itself_after_a_failure(world: World) -> None:
    done, outcomes = finisher(world, Clock(), first_delay_s=0)
    world.stores.offline.fail("deliver")
    with pytest.raises(Unavailable):
        await world.chat.send("alice", "bob", "c1", "hi")
    world.stores.offline.heal()
    assert await settle(lambda: bool(outcomes))
    assert outcomes == ["finished"] and world.stores.offline.inboxes["bob"].unread
    await done.close()
