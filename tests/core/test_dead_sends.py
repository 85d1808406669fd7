"""``gateway.chat.dead_sends``: a dead node's mark holds cursors back until what it
stored is redelivered, once per node, retried while a store is down."""

from __future__ import annotations

import asyncio

from core.errors import Unavailable
from gateway.chat.dead_sends import DeadSends, node_number
from testkit.poll import until


def test_node_numbers_come_from_names():
    assert node_number("n7-a1b2c3") == 7 and node_number("n212-x") == 212
    assert node_number("gateway-1") is None


async def test_a_dead_mark_is_held_until_redelivered_then_forgotten():
    calls: list[tuple[int, int, int]] = []
    release = asyncio.Event()
    failures = [Unavailable("mongo", "down")]

    async def redeliver(node: int, low: int, high: int) -> int:
        calls.append((node, low, high))
        if failures:
            raise failures.pop()
        await release.wait()
        return 3

    sends = DeadSends(redeliver, clock_ms=lambda: 1_800_000_000_000)
    held, forget = sends.observe({"n7-abc": 100})
    assert held == {"n7-abc": 100} and forget == []
    assert await until(lambda: len(calls) == 2, timeout=5)  # retried after the failure
    held, forget = sends.observe({"n7-abc": 100})  # not started twice
    assert held == {"n7-abc": 100} and forget == [] and len(calls) == 2
    release.set()
    assert await until(lambda: sends.observe({"n7-abc": 100})[1] == ["n7-abc"], timeout=5)
    assert calls[-1][:2] == (7, 100) and calls[-1][2] > 100
    # Once the mark is gone (forgotten by any node), so is what was kept of it.
    assert sends.observe({}) == ({}, [])
    await sends.close()
