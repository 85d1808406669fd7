"""Bans, token revocations and disconnects, for the server API (docs/protocol.md,
Server API).

State lives in Redis (``SanctionStore``) and is read at each WebSocket
handshake and each HTTP call of a user (``admit``), never per frame; so a ban
or revocation answered ``ok`` refuses the next handshake on any node. Open
connections are closed by a control message to every node holding a device
of the user (``Router.tell``: here at once, elsewhere confirmed by the broker
before the call answers), with close code 4003.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from gateway.auth import Token
from gateway.errors import ProtocolError
from gateway.hub import Client, Hub
from store.errors import Unavailable
from store.ports import SanctionStore

__all__ = ["CLOSED_BY_SERVER", "Moderation"]

CLOSED_BY_SERVER = 4003  # kick, ban, revoke (close codes 4000-4099 are the gateway's)
MAX_BAN_S = 10 * 365 * 86_400
log = logging.getLogger("gateway.moderation")


class Teller(Protocol):
    """``router.Router``, as moderation sees it."""

    async def tell(self, users: list[str], ctl: dict[str, Any]) -> None: ...


class Moderation:
    def __init__(self, store: SanctionStore, teller: Teller, hub: Hub,
                 token_max_ttl_s: float, unchecked: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self.unchecked = unchecked
        self.teller = teller
        self.hub = hub
        self.token_max_ttl_s = token_max_ttl_s
        self._warned = -60.0

    async def admit(self, token: Token) -> None:
        """Refuse a banned user (``forbidden``) or a revoked token (``unauthorized``).

        While Redis cannot be read the check is skipped (counted, logged once
        a minute): sync and history keep being served from MongoDB during a
        Redis outage, as they were before bans existed.
        """
        try:
            s = await self.store.get(token.user)
        except Unavailable as exc:
            self.unchecked()
            now = time.monotonic()
            if now - self._warned > 60:
                self._warned = now
                log.warning("bans and revocations not checked: %s", exc)
            return
        if s.banned_until:
            raise ProtocolError("forbidden", "this user is banned")
        if s.revoked_before and (token.iat or 0.0) < s.revoked_before:
            raise ProtocolError("unauthorized", "token revoked")

    async def disconnect(self, user: str) -> None:
        await self.teller.tell([user], {"op": "close", "reason": "disconnected by the server"})

    async def ban(self, user: str, seconds: int) -> None:
        await self.store.ban(user, time.time() + seconds)
        await self.teller.tell([user], {"op": "close", "reason": "banned"})

    async def unban(self, user: str) -> None:
        await self.store.unban(user)

    async def revoke(self, user: str, before: float) -> None:
        await self.store.revoke(user, before, self.token_max_ttl_s)
        await self.teller.tell([user], {"op": "revoke", "before": before})

    async def mute(self, room: str, user: str, seconds: int) -> None:
        until = time.time() + seconds
        await self.store.mute(room, user, until)
        await self.teller.tell([user], {"op": "rmute", "room": room, "until": until})

    async def unmute(self, room: str, user: str) -> None:
        await self.store.unmute(room, user)
        await self.teller.tell([user], {"op": "runmute", "room": room})

    async def kick(self, room: str, user: str) -> None:
        await self.teller.tell([user], {"op": "rkick", "room": room})

    async def apply_control(self, users: list[str], ctl: dict[str, Any]) -> None:
        """Close these users' local connections (a revocation: those whose token
        was issued before its time)."""
        op, before = ctl.get("op"), ctl.get("before")
        closing: list[Client] = []
        for user in users:
            for client in list(self.hub.users.get(user, {}).values()):
                if op == "close" or (op == "revoke" and isinstance(before, int | float)
                                     and client.iat < before):
                    closing.append(client)
        reason = str(ctl.get("reason") or "token revoked")[:100]
        await asyncio.gather(*(c.ws.close(CLOSED_BY_SERVER, reason) for c in closing),
                             return_exceptions=True)
