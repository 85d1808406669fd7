"""core.tasks.stop: a task whose cancel was lost (as asyncio.wait_for drops one
on Python 3.11) is cancelled again until it is done; the caller's own
cancellation still propagates."""

from __future__ import annotations

import asyncio

import pytest

from core.tasks import stop


async def test_a_lost_cancel_is_asked_again():
    lost = 0

    async def stubborn() -> None:
        nonlocal lost
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if lost == 0:  # the first cancel vanishes, as in a wait_for race
                    lost += 1
                    asyncio.current_task().uncancel()  # type: ignore[union-attr]
                    continue
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(stop(task, every_s=0.01), 5)
    assert task.cancelled() and lost == 1


async def test_the_callers_own_cancellation_propagates():
    done = False

    async def stubborn() -> None:
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if done:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError):  # the caller's bound is not swallowed
        await asyncio.wait_for(stop(task, every_s=0.01), 0.1)
    done = True
    await stop(task)
    assert task.cancelled()


async def test_none_and_done_tasks_are_fine():
    await stop(None)
    task = asyncio.create_task(asyncio.sleep(0))
    await task
    await stop(task)
