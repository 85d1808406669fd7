"""gateway.moderation: a ban or revocation told to a node is remembered there,
so a connection whose handshake passed the Redis check just before the ban
and registered just after the control message is closed too (no I/O here)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from gateway import moderation as m
from router.controls import Close, Revoke, Unban


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
