"""Group commit: batching, per-item results, bounds, and no lost wake-ups."""

from __future__ import annotations

import asyncio

import pytest

from core.batcher import Batcher
from store.errors import Unavailable


async def test_items_submitted_during_a_flush_share_the_next_one():
    sizes: list[int] = []
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await gate.wait()
        return [i * 2 for i in items]

    b: Batcher[int, int] = Batcher(flush, name="t")
    first = asyncio.create_task(b.submit(0))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(b.submit(i)) for i in range(1, 6)]
    await asyncio.sleep(0)
    gate.set()
    assert await first == 0
    assert [await r for r in rest] == [2, 4, 6, 8, 10]
    assert sizes == [1, 5]


async def test_per_item_exceptions_and_whole_batch_failure():
    async def flush(items: list[int]) -> list[int | BaseException]:
        if 99 in items:
            raise Unavailable("x")
        return [ValueError("odd") if i % 2 else i for i in items]

    b: Batcher[int, int] = Batcher(flush, name="t")
    assert await b.submit(2) == 2
    with pytest.raises(ValueError):
        await b.submit(3)
    with pytest.raises(Unavailable):
        await b.submit(99)


async def test_queue_is_bounded():
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        await gate.wait()
        return items

    b: Batcher[int, int] = Batcher(flush, name="redis", max_pending=2)
    tasks = [asyncio.create_task(b.submit(0))]
    await asyncio.sleep(0.01)  # the runner has taken item 0 and waits in flush
    tasks += [asyncio.create_task(b.submit(i)) for i in (1, 2)]
    await asyncio.sleep(0.01)  # items 1 and 2 are queued: the bound is reached
    with pytest.raises(Unavailable):
        await b.submit(9)
    gate.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2]


async def test_submit_right_after_a_runner_finishes_is_flushed():
    async def flush(items: list[int]) -> list[int]:
        return items

    b: Batcher[int, int] = Batcher(flush, name="t")
    for i in range(200):  # each submit lands just as the previous runner exits
        assert await asyncio.wait_for(b.submit(i), 1) == i


async def test_observer_sees_batch_size_wait_and_flush_time():
    seen: list[tuple[int, float, float]] = []

    async def flush(items: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return items

    b: Batcher[int, int] = Batcher(flush, name="t", observe=lambda *a: seen.append(a))
    first = asyncio.create_task(b.submit(0))
    await asyncio.sleep(0.001)  # the runner has taken item 0 and is flushing it
    await asyncio.gather(first, b.submit(1), b.submit(2))
    assert [n for n, _, _ in seen] == [1, 2]  # the second batch queued behind the first
    assert seen[1][1] >= 0.009  # it waited about one flush
    assert all(took >= 0.009 for _, _, took in seen)
