"""Group commit: callers submit one item each, a flush handles many at once.

While a flush is in flight, new items queue; the next flush takes them all
(up to ``max_batch``). Under light load a flush carries one item and adds no
delay; under heavy load batches grow by themselves. ``linger_s`` trades a
little latency for bigger batches where a store's cost per call dominates. The queue is bounded:
past ``max_pending`` a submit fails at once with ``Unavailable`` instead of
growing memory and latency without limit.

A flush that fails with ``Unavailable`` fails its whole batch (the
dependency is down for everyone). Any other failure is one item's fault (a
value the store cannot hold, a bug it triggers): the batch is split and each
item flushed alone, so only that item fails and nobody else's message does.
Flushes must therefore be idempotent, as every stage here is.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from core.errors import Unavailable

__all__ = ["Batcher", "Observe"]

T = TypeVar("T")
R = TypeVar("R")

Flush = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]
# (batch size, seconds the oldest item waited before its flush began, flush seconds)
Observe = Callable[[int, float, float], None]


class Batcher(Generic[T, R]):
    """Runs ``flush`` over batches of submitted items; one result per item."""

    def __init__(
        self,
        flush: Flush[T, R],
        *,
        name: str,
        max_batch: int = 256,
        max_pending: int = 20_000,
        concurrency: int = 1,
        linger_s: float = 0.0,
        observe: Observe | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._flush = flush
        self.name = name
        self.max_batch = max_batch
        self.max_pending = max_pending
        self.concurrency = concurrency
        self.linger_s = linger_s
        self.observe = observe
        self._clock = clock  # for the observer's figures only
        self._queue: deque[tuple[T, asyncio.Future[R], float]] = deque()
        self._runners: set[asyncio.Task[None]] = set()  # strong refs only
        self._running = 0  # runners that will look at the queue again
        self.batches = 0
        self.items = 0
        self.isolated = 0  # batches split after a failure that was not ``Unavailable``

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def submit(self, item: T) -> R:
        if len(self._queue) >= self.max_pending:
            raise Unavailable(self.name, "overloaded")
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.append((item, fut, self._clock()))
        if self._running < self.concurrency:
            self._running += 1
            task = asyncio.create_task(self._run())
            self._runners.add(task)
            task.add_done_callback(self._runners.discard)
        return await fut

    async def _run(self) -> None:
        # The count drops in the same step that sees the queue empty: a task's
        # done-callback runs a tick later, and a submit in between would
        # otherwise wait for a runner that is already gone.
        try:
            await self._drain()
        finally:
            self._running -= 1

    async def _drain(self) -> None:
        while self._queue:
            if self.linger_s and len(self._queue) < self.max_batch:
                await asyncio.sleep(self.linger_s)  # let a partial batch fill up
            n = min(self.max_batch, len(self._queue))
            batch = [self._queue.popleft() for _ in range(n)]
            self.batches += 1
            self.items += n
            started = self._clock()
            try:
                results = await self._flush([item for item, _, _ in batch])
            except Unavailable as exc:  # the dependency is down: every item fails alike
                _settle(batch, [exc] * n)
                continue
            except asyncio.CancelledError as exc:
                _settle(batch, [exc] * n)
                raise
            except Exception as exc:  # noqa: BLE001 - one item's fault: confine it
                if n == 1:
                    _settle(batch, [exc])
                    continue
                self.isolated += 1
                results = [await self._alone(item) for item, _, _ in batch]
            if self.observe is not None:
                self.observe(n, started - batch[0][2], self._clock() - started)
            _settle(batch, results)

    async def _alone(self, item: T) -> R | BaseException:
        """Flush one item of a batch that failed for a reason other than a
        dependency being down (flushes are idempotent, so a redo is safe)."""
        try:
            return (await self._flush([item]))[0]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - handed to this item's waiter
            return exc

    async def close(self) -> None:
        """Wait for queued items to be flushed."""
        while self._runners:
            await asyncio.gather(*self._runners, return_exceptions=True)


def _settle(batch: Sequence[tuple[object, asyncio.Future[R], float]],
            results: Sequence[R | BaseException]) -> None:
    for (_, fut, _), result in zip(batch, results, strict=True):
        if fut.done():
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)
