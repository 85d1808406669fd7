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
    now = [0.0]  # a clock that only the flush moves: each flush takes 10 "seconds"
    gate = asyncio.Event()

    async def flush(items: list[int]) -> list[int]:
        await gate.wait()
        now[0] += 10.0
        return items

    b: Batcher[int, int] = Batcher(flush, name="t", observe=lambda *a: seen.append(a),
                                   clock=lambda: now[0])
    first = asyncio.create_task(b.submit(0))
    await asyncio.sleep(0)  # the runner has taken item 0 and waits in its flush
    rest = [asyncio.create_task(b.submit(i)) for i in (1, 2)]
    await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(first, *rest)
    assert [n for n, _, _ in seen] == [1, 2]  # the second batch queued behind the first
    assert seen[0] == (1, 0.0, 10.0)
    assert seen[1] == (2, 10.0, 10.0)  # it waited exactly one flush


def test_seek_page_cuts_at_limit_and_names_the_next_cursor():
    from core.paging import seek_page

    assert seek_page([5, 4, 3], 2, lambda x: x) == ([5, 4], 4)
    assert seek_page([5, 4], 2, lambda x: x) == ([5, 4], None)
    assert seek_page([], 2, lambda x: x) == ([], None)
    assert seek_page([{"id": 9}, {"id": 8}], 1, lambda d: d["id"]) == ([{"id": 9}], 9)


async def test_a_poisoned_item_fails_alone_and_the_rest_of_its_batch_goes_through():
    calls: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        calls.append(items)
        if 13 in items:
            raise ValueError("the store cannot hold 13")
        return [i * 10 for i in items]

    b: Batcher[int, int] = Batcher(flush, name="t")
    results = await asyncio.gather(*(b.submit(i) for i in (1, 13, 2)), return_exceptions=True)
    assert results[0] == 10 and results[2] == 20
    assert isinstance(results[1], ValueError)
    assert calls == [[1, 13, 2], [1], [13], [2]]  # the batch, then each item alone
    assert b.isolated == 1


async def test_unavailable_fails_the_whole_batch_without_retrying_each_item():
    calls: list[list[int]] = []

    async def flush(items: list[int]) -> list[int]:
        calls.append(items)
        raise Unavailable("mongo")

    b: Batcher[int, int] = Batcher(flush, name="t")
    results = await asyncio.gather(*(b.submit(i) for i in (1, 2, 3)), return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in results)
    assert calls == [[1, 2, 3]]
