"""router.positions and the router's room path: one store call per batch of
rooms, at most one per room per window; positioned bytes as the script writes
them; this node's members and the other nodes get the same positioned bytes;
one future per message, settled by the broker's confirm; no ack without a
position (no server: a fake of the project's own RoomHistoryStore, the
memory broker)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence

import pytest

from core.errors import Unavailable
from core.room_history import RoomLog
from router import envelope
from router.broker_memory import MemoryBroker
from router.errors import BrokerUnavailable
from router.positions import Item, RoomPositions, positioned
from router.router import Router
from testkit.poll import until
from tests.core.fakes import FakeRoutes


class FakeLog:
    def __init__(self) -> None:
        self.calls: list[list[tuple[str, int]]] = []
        self.last: dict[str, int] = {}
        self.down = False

    async def append(self, batches: Sequence[tuple[str, Sequence[bytes]]], new_epoch: str
                     ) -> list[tuple[str, int]]:
        await asyncio.sleep(0)
        if self.down:
            raise Unavailable("redis", "down")
        self.calls.append([(room, len(frags)) for room, frags in batches])
        out = []
        for room, frags in batches:
            first = self.last.get(room, 0) + 1
            self.last[room] = first + len(frags) - 1
            out.append(("e1", first))
        return out

    async def read(self, rooms: Sequence[tuple[str, bool]]) -> list[RoomLog]:
        raise AssertionError("not read here")


def rig(window_s: float = 0.0):
    store = FakeLog()
    out: list[tuple[str, bytes, int, str, asyncio.Future[None]]] = []

    def take(room: str, epoch: str, first: int, items: list[Item]) -> None:
        out.extend((room, frag, first + k, epoch, fut) for k, (frag, _, fut) in enumerate(items))

    pos = RoomPositions(take, store, window_s=window_s, pending_max=100)
    return pos, store, out


def submit(pos: RoomPositions, room: str, frag: bytes, prio: int = 0) -> asyncio.Future[None]:
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    pos.submit(room, frag, prio, fut)
    return fut


def test_positioned_appends_the_position_as_the_script_does():
    assert positioned(b'{"from":"a","body":1,"ts":5}', 12) == \
        b'{"from":"a","body":1,"ts":5,"pos":12}'


async def test_one_call_for_the_rooms_of_a_tick_in_position_order():
    pos, store, out = rig()
    futs = [submit(pos, "r1", b'{"i":1}'), submit(pos, "r2", b'{"i":2}'),
            submit(pos, "r1", b'{"i":3}', 1)]
    assert await until(lambda: len(out) == 3, timeout=5, every=0.001)
    assert store.calls == [[("r1", 2), ("r2", 1)]]
    assert [(r, f, p, e) for r, f, p, e, _ in out] == [
        ("r1", b'{"i":1}', 1, "e1"), ("r1", b'{"i":3}', 2, "e1"), ("r2", b'{"i":2}', 1, "e1")]
    assert [o[4] for o in out] == [futs[0], futs[2], futs[1]]  # the same futures, handed on
    assert not any(f.done() for f in futs)  # settled by whoever publishes them


async def test_a_room_is_called_at_most_once_per_window():
    pos, store, out = rig(window_s=0.3)
    submit(pos, "r", b'{"i":1}')
    assert await until(lambda: out, timeout=5, every=0.001)
    for i in range(5):
        submit(pos, "r", b'{"i":%d}' % i)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(store.calls) == 1  # the rest wait for the window
    assert await until(lambda: len(out) == 6, timeout=5, every=0.01)
    assert store.calls == [[("r", 1)], [("r", 5)]]


async def test_no_position_no_ack():
    pos, store, out = rig()
    store.down = True
    fut = submit(pos, "r", b'{"i":1}')
    with pytest.raises(Unavailable):
        await fut
    assert out == []


# -- through the router: positioned, delivered here, published, acked on the confirm --------

class Members:
    """This node's room members (``RoomDelivery``): records what they get."""

    def __init__(self) -> None:
        self.got: list[tuple[str, bytes, int, int, str | None]] = []

    def deliver_room(self, room: str, fragment: bytes, prio: int, pos: int = 0,
                     epoch: str | None = None) -> None:
        self.got.append((room, fragment, prio, pos, epoch))

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        return 0


class KeyBroker(MemoryBroker):
    """The memory broker, keeping what is published to a routing key (what every
    other node bound to it would get); ``down``: it takes nothing."""

    def __init__(self, remote: list[bytes]) -> None:
        super().__init__()
        self.remote = remote
        self.down = False

    async def publish_key(self, key: str, envelope: bytes) -> None:
        if self.down:
            raise BrokerUnavailable("down")
        self.remote.append(envelope)


async def start_router(store: FakeLog | None) -> tuple[Router, Members, list[bytes]]:
    members, remote = Members(), list[bytes]()
    positions = None if store is None else functools.partial(
        RoomPositions, store=store, window_s=0.0, pending_max=100)
    router = Router("n1", members, KeyBroker(remote), FakeRoutes(), rooms=members,
                    positions=positions)
    await router.start()
    return router, members, remote


async def test_a_room_message_is_positioned_then_goes_here_and_to_the_other_nodes():
    router, members, remote = await start_router(FakeLog())
    try:
        futs = [router.publish_room("r", b'{"i":1}', 0), router.publish_room("r", b'{"i":2}', 1)]
        await asyncio.wait_for(asyncio.gather(*futs), 5)
        assert members.got == [("r", b'{"i":1,"pos":1}', 0, 1, "e1"),
                               ("r", b'{"i":2,"pos":2}', 1, 2, "e1")]
        [env] = remote
        assert list(envelope.decode(env)) == [
            ({"r": "r", "n": 1, "e": "e1"}, b'{"i":1,"pos":1}'),
            ({"r": "r", "p": 1, "n": 2, "e": "e1"}, b'{"i":2,"pos":2}')]
    finally:
        await router.close()


async def test_without_history_a_room_message_goes_out_unpositioned():
    router, members, remote = await start_router(None)
    try:
        await asyncio.wait_for(router.publish_room("r", b'{"i":1}', 0), 5)
        assert members.got == [("r", b'{"i":1}', 0, 0, None)]
        assert [list(envelope.decode(e)) for e in remote] == [[({"r": "r"}, b'{"i":1}')]]
    finally:
        await router.close()


async def test_no_position_means_no_delivery_and_no_ack_through_the_router():
    store = FakeLog()
    store.down = True
    router, members, remote = await start_router(store)
    try:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(router.publish_room("r", b'{"i":1}', 0), 5)
        assert members.got == [] and remote == []
    finally:
        await router.close()


async def test_a_broker_that_did_not_take_it_fails_each_message_of_the_envelope():
    router, members, _ = await start_router(None)
    try:
        assert isinstance(router.broker, KeyBroker)
        router.broker.down = True
        futs = [router.publish_room("r", b'{"i":1}', 0), router.publish_room("r", b'{"i":2}', 0)]
        for fut in futs:
            with pytest.raises(BrokerUnavailable):
                await asyncio.wait_for(fut, 5)
    finally:
        await router.close()
