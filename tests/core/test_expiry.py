"""``ExpiryWheel``: connections closed once their token's exp passed, never
before, with one timer for all (no servers)."""

from __future__ import annotations

import math
import time
from typing import cast

from gateway.ws.expiry import ExpiryWheel
from testkit.poll import until


class Conn:
    """What the wheel uses of a ``Client``: identity and ``expires``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.expires = 0


async def test_each_is_closed_after_its_exp_and_not_before():
    closed: list[tuple[str, float]] = []
    wheel = ExpiryWheel(lambda c: closed.append((cast(Conn, c).name, time.time())))
    now = time.time()
    # b and c share a second, a second after a's at least (a's bucket, ceil(exp),
    # ends before now + 1.3): a is closed strictly before them.
    exps = {"past": now - 5, "a": now + 0.3, "b": now + 2.2, "c": now + 2.25}
    for name, exp in exps.items():
        wheel.set(Conn(name), exp)  # type: ignore[arg-type]
    assert await until(lambda: len(closed) == 4, timeout=5)
    names = [n for n, _ in closed]
    assert names[:2] == ["past", "a"] and set(names[2:]) == {"b", "c"}
    for name, at in closed:  # after exp, and within its second (+ scheduling slack)
        assert exps[name] <= at < max(exps[name], now) + 1.2, (name, at - exps[name])
    assert len(wheel) == 0


async def test_discard_and_a_later_exp_replace_the_first():
    closed: list[str] = []
    wheel = ExpiryWheel(lambda c: closed.append(cast(Conn, c).name))
    now = time.time()
    gone, moved, kept = Conn("gone"), Conn("moved"), Conn("kept")
    for c in (gone, moved, kept):
        wheel.set(c, now + 0.2)  # type: ignore[arg-type]
    wheel.discard(gone)  # type: ignore[arg-type]  # disconnected
    wheel.set(moved, now + 60)  # type: ignore[arg-type]  # refreshed
    assert await until(lambda: closed, timeout=3)
    assert closed == ["kept"]
    assert len(wheel) == 1 and moved.expires == math.ceil(now + 60) and gone.expires == 0
