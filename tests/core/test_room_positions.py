"""gateway.rooms.positions: one store call per batch of rooms, at most one per
room per window; positioned bytes as the script writes them; no ack without
a position (no server: a fake of the project's own RoomHistoryStore)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from core.errors import Unavailable
from core.room_history import RoomLog
from gateway.metrics import NodeMetrics
from gateway.rooms.positions import RoomPositions, positioned
from testkit.poll import until


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
    store, delivered, published = FakeLog(), [], []
    confirms: dict[str, asyncio.Future[None]] = {}

    def publish(room, frag, prio, pos, epoch):
        published.append((room, frag, pos, epoch))
        return confirms.setdefault(room, asyncio.get_running_loop().create_future())

    pos = RoomPositions(store, lambda *a: delivered.append(a), publish, NodeMetrics(),
                        window_s=window_s, pending_max=100)
    return pos, store, delivered, published, confirms


def test_positioned_appends_the_position_as_the_script_does():
    assert positioned(b'{"from":"a","body":1,"ts":5}', 12) == \
        b'{"from":"a","body":1,"ts":5,"pos":12}'


async def test_one_call_for_the_rooms_of_a_tick_and_acks_after_the_confirm():
    pos, store, delivered, published, confirms = rig()
    futs = [pos.submit("r1", b'{"i":1}', 0), pos.submit("r2", b'{"i":2}', 0),
            pos.submit("r1", b'{"i":3}', 1)]
    assert await until(lambda: len(published) == 3, timeout=5, every=0.001)
    assert store.calls == [[("r1", 2), ("r2", 1)]]
    assert [(r, p) for r, _, p, _ in published] == [("r1", 1), ("r1", 2), ("r2", 1)]
    assert [d[1] for d in delivered] == [b'{"i":1,"pos":1}', b'{"i":3,"pos":2}',
                                         b'{"i":2,"pos":1}']
    assert not any(f.done() for f in futs)  # not before the broker's confirm
    confirms["r1"].set_result(None)
    await asyncio.sleep(0)
    assert futs[0].done() and futs[2].done() and not futs[1].done()


async def test_a_room_is_called_at_most_once_per_window():
    pos, store, _, published, _ = rig(window_s=0.3)
    pos.submit("r", b'{"i":1}', 0)
    assert await until(lambda: published, timeout=5, every=0.001)
    for i in range(5):
        pos.submit("r", b'{"i":%d}' % i, 0)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(store.calls) == 1  # the rest wait for the window
    assert await until(lambda: len(published) == 6, timeout=5, every=0.01)
    assert store.calls == [[("r", 1)], [("r", 5)]]


async def test_no_position_no_ack():
    pos, store, delivered, published, _ = rig()
    store.down = True
    fut = pos.submit("r", b'{"i":1}', 0)
    with pytest.raises(Unavailable):
        await fut
    assert delivered == [] and published == []
