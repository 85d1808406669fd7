"""Polling for state written in the background (counts, trims, fan-outs)."""

from __future__ import annotations

import asyncio
import inspect
import time
from typing import Any

__all__ = ["until"]


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
