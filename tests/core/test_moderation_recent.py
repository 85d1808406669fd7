"""gateway.moderation: a ban or revocation told to a node is remembered there,
so a connection whose handshake passed the Redis check just before the ban
and registered just after the control message is closed too (no I/O here)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from core.errors import Unavailable
from gateway import moderation as m
from gateway.errors import ProtocolError
from router.controls import Close, Revoke, Unban
from store.records import Sanctions


def conn(user: str, iat: float = 0.0):
    return SimpleNamespace(user=user, iat=iat)


@pytest.fixture
def mod():
    return m.Moderation(store=None, teller=None, hub=SimpleNamespace(users={}),  # type: ignore[arg-type]
                        token_max_ttl_s=86_400)


async def test_a_ban_holds_back_a_late_registration_until_unbanned(mod):
    assert not mod.held_back(conn("u"))
    assert mod.apply_control(["u"], Close("banned", ban=True)) is None
    assert mod.held_back(conn("u")) and not mod.held_back(conn("v"))
    assert mod.apply_control(["u"], Unban()) is None
    assert not mod.held_back(conn("u"))


async def test_a_disconnect_is_not_remembered(mod):
    assert mod.apply_control(["u"], Close("disconnected by the server")) is None
    assert not mod.held_back(conn("u"))  # it may reconnect at once


async def test_a_revocation_holds_back_older_tokens_only_and_is_forgotten(mod, monkeypatch):
    assert mod.apply_control(["u"], Revoke(100.0)) is None
    assert mod.held_back(conn("u", iat=50)) and not mod.held_back(conn("u", iat=150))
    later = time.monotonic() + m.RECENT_S + 1
    monkeypatch.setattr(time, "monotonic", lambda: later)  # the module reads time.monotonic
    assert not mod.held_back(conn("u", iat=50))  # the handshake's own check holds then


class _Sanctions:
    """A SanctionStore of the test's own: reads wait for ``gate``; ``down``
    makes them fail as a Redis outage does."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.down = False
        self.calls: list[list[str]] = []
        self.reading = asyncio.Event()

    async def get_many(self, users):
        self.calls.append(list(users))
        self.reading.set()
        await self.gate.wait()
        if self.down:
            raise Unavailable("redis", "down")
        return [Sanctions(banned_until=1e12 if u == "banned" else 0.0) for u in users]


def _token(user: str):
    return SimpleNamespace(user=user, iat=0.0)


async def test_checks_of_the_moment_share_one_read_and_a_ban_refuses():
    store = _Sanctions()
    mod = m.Moderation(store, None, SimpleNamespace(users={}), 86_400,  # type: ignore[arg-type]
                       max_pending=10)
    first = asyncio.ensure_future(mod.admit(_token("a")))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    rest = [asyncio.ensure_future(mod.admit(_token(u)))  # type: ignore[arg-type]
            for u in ("b", "banned", "c")]
    await asyncio.sleep(0)
    store.gate.set()
    await first
    done = await asyncio.gather(*rest, return_exceptions=True)
    assert store.calls == [["a"], ["b", "banned", "c"]]  # the waiting ones: one read
    assert done[0] is None and done[2] is None
    assert isinstance(done[1], ProtocolError) and done[1].code == "forbidden"


async def test_overloaded_checks_refuse_and_a_redis_outage_skips_the_check():
    store = _Sanctions()
    skipped: list[int] = []
    mod = m.Moderation(store, None, SimpleNamespace(users={}), 86_400,  # type: ignore[arg-type]
                       lambda: skipped.append(1), max_pending=2)
    waiting = [asyncio.ensure_future(mod.admit(_token("u0")))]  # type: ignore[arg-type]
    await store.reading.wait()  # its read in flight
    waiting += [asyncio.ensure_future(mod.admit(_token(u)))  # type: ignore[arg-type]
                for u in ("u1", "u2")]
    await asyncio.sleep(0)  # two queued behind it: the queue is full
    with pytest.raises(Unavailable):
        await mod.admit(_token("late"))  # type: ignore[arg-type]
    store.down = True
    store.gate.set()
    assert await asyncio.gather(*waiting) == [None, None, None]  # Redis down: admitted
    assert len(skipped) == 3
