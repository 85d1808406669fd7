"""Queues of a test's own on ``{ns}.events`` (docs/protocol.md, Events out), as
a product's offline-push service or webhook relay would bind them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import orjson

__all__ = ["EventQueue", "bind_events"]


class EventQueue:
    """The events a bound queue received so far (``seen``), read by polling."""

    def __init__(self, queue: aio_pika.abc.AbstractQueue) -> None:
        self.queue = queue
        self.seen: list[dict[str, Any]] = []

    async def until(self, count: int, timeout: float = 15) -> list[dict[str, Any]]:
        """Events until ``count`` of them arrived, or ``timeout``."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < count and time.monotonic() < deadline:
            msg = await self.queue.get(no_ack=True, fail=False)
            if msg is None:
                await asyncio.sleep(0.05)
                continue
            assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
            self.seen.append(orjson.loads(msg.body))
        return self.seen


async def bind_events(channel: aio_pika.abc.AbstractChannel, ns: str, pattern: str, *,
                      name: str | None = None) -> aio_pika.abc.AbstractQueue:
    """A queue on ``{ns}.events`` with ``pattern``: exclusive, or with ``name``
    durable (it outlives a broker restart; the caller deletes it)."""
    exchange = await channel.declare_exchange(f"{ns}.events", aio_pika.ExchangeType.TOPIC,
                                              durable=True)
    queue = (await channel.declare_queue(name, durable=True) if name
             else await channel.declare_queue(exclusive=True))
    await queue.bind(exchange, routing_key=pattern)
    return queue
