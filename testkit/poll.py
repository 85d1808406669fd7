"""Polling for state written in the background (counts, trims, fan-outs), and
gathering many jobs a few at a time."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Iterable
from typing import Any, TypeVar

__all__ = ["bounded", "until"]

T = TypeVar("T")


async def until(check: Any, timeout: float = 10, every: float = 0.05) -> Any:
    """Poll ``check()`` (sync or async) until it is truthy or ``timeout`` passes;
    returns its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value or time.monotonic() > deadline:
            return value
        await asyncio.sleep(every)


async def bounded(jobs: Iterable[Awaitable[T]], limit: int) -> list[T]:
    """The results of ``jobs`` (in order), at most ``limit`` of them running at once."""
    sem = asyncio.Semaphore(limit)

    async def one(job: Awaitable[T]) -> T:
        try:
            async with sem:
                return await job
        finally:  # cancelled before its turn: no "never awaited" warning
            if inspect.iscoroutine(job):
                job.close()

    return list(await asyncio.gather(*(one(j) for j in jobs)))
