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

    async def claim(name: str) -> bool:
        return True

    sends = DeadSends(redeliver, claim, clock_ms=lambda: 1_800_000_000_000)
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


async def test_only_the_claim_holder_redelivers_the_others_hold_until_it_is_forgotten():
    calls: list[int] = []
    claims = {"n7-abc": "other"}  # another live node holds the claim
    asked: list[str] = []

    async def redeliver(node: int, low: int, high: int) -> int:
        calls.append(node)
        return 1

    async def claim(name: str) -> bool:
        asked.append(name)
        return claims.setdefault(name, "me") == "me"

    sends = DeadSends(redeliver, claim)
    assert sends.observe({"n7-abc": 100}) == ({"n7-abc": 100}, [])
    assert await until(lambda: len(asked) == 1, timeout=5)
    # Not this node's claim: it keeps holding, and asks again in case the holder dies.
    assert await until(lambda: sends.observe({"n7-abc": 100}) == ({"n7-abc": 100}, [])
                       and len(asked) >= 2, timeout=5)
    assert calls == []
    # The holder died too: its claim lapsed, and this node takes it next time.
    del claims["n7-abc"]
    assert await until(lambda: sends.observe({"n7-abc": 100})[1] == ["n7-abc"], timeout=5)
    assert calls == [7]
    # The holder forgot the mark: nothing is held any more.
    assert sends.observe({}) == ({}, [])
    await sends.close()


async def test_a_claim_that_cannot_be_asked_holds_and_asks_again():
    down = [True]

    async def claim(name: str) -> bool:
        if down[0]:
            raise Unavailable("redis", "down")
        return True

    async def redeliver(node: int, low: int, high: int) -> int:
        return 0

    sends = DeadSends(redeliver, claim)
    assert sends.observe({"n3-x": 5}) == ({"n3-x": 5}, [])
    await asyncio.sleep(0.01)
    assert sends.observe({"n3-x": 5}) == ({"n3-x": 5}, [])
    down[0] = False
    assert await until(lambda: sends.observe({"n3-x": 5})[1] == ["n3-x"], timeout=5)
    await sends.close()


async def test_the_mark_is_dropped_when_done_and_a_claim_left_unfinished_is_given_up():
    """Done: the mark is dropped at once (a node closing right after would never
    share again, and the mark would hold every cursor until the claim lapsed).
    Stopped before done: the claim is given up, so another node takes it now."""
    claims: dict[str, str] = {}
    dropped: list[list[str]] = []
    stuck = asyncio.Event()

    async def claim(name: str) -> bool:
        return claims.setdefault(name, "me") == "me"

    async def release(name: str) -> None:
        if claims.get(name) == "me":
            del claims[name]

    async def forget(names: list[str]) -> None:
        dropped.append(names)

    async def redeliver(node: int, low: int, high: int) -> int:
        if node == 9:
            await stuck.wait()  # never set: this one is still going at close
        return 1

    sends = DeadSends(redeliver, claim, release=release, forget=forget)
    sends.observe({"n7-a": 100, "n9-b": 200})
    assert await until(lambda: dropped == [["n7-a"]] and "n9-b" in claims, timeout=5)
    await sends.close()
    assert claims == {"n7-a": "me"}  # the unfinished claim given up; the done one lapses
    assert dropped == [["n7-a"]]
