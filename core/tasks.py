"""Stopping a background task for good.

``task.cancel()`` can be lost on Python 3.11: ``asyncio.wait_for`` returns its
inner result when that finished in the same loop turn as the cancel, and the
cancel is gone (redis-py wraps every command send in ``wait_for``). A loop
that then keeps going never ends, and a drain waits out its whole bound
(measured: 4 of 7 nodes killed at a 15 s grace after 100,000 disconnects,
docs/benchmarks.md, "100,000 connections on one machine"). ``stop`` asks again
until the task is done; the caller's own cancellation (a drain step's bound) is
never swallowed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["stop"]

log = logging.getLogger("core.tasks")


async def stop(task: asyncio.Task[Any] | None, every_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it is done, cancelling again every ``every_s``."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=every_s)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s ended with an error", task.get_name(), exc_info=task.exception())
