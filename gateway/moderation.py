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
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from core.batcher import Batcher, Observe
from gateway.auth import Token
from gateway.errors import ProtocolError
from gateway.hub import Client, Hub
from router.controls import (
    Close,
    Control,
    Revoke,
    RoomKick,
    RoomMute,
    RoomUnmute,
    Unban,
)
from store.errors import Unavailable
from store.ports import SanctionStore
from store.records import Sanctions

__all__ = ["CLOSED_BY_SERVER", "Moderation"]

CLOSED_BY_SERVER = 4003  # kick, ban, revoke (close codes 4000-4099 are the gateway's)
MAX_BAN_S = 10 * 365 * 86_400
log = logging.getLogger("gateway.moderation")


RECENT_S = 60.0  # a ban or revocation is remembered on every node this long
RECENT_MAX = 100_000


class Teller(Protocol):
    """``router.Router``, as moderation sees it."""

    async def tell(self, users: list[str], ctl: Control) -> None: ...

    async def tell_all(self, users: list[str], ctl: Control) -> None: ...


class Moderation:
    def __init__(self, store: SanctionStore, teller: Teller, hub: Hub,
                 token_max_ttl_s: float, unchecked: Callable[[], None] = lambda: None,
                 *, max_batch: int = 256, max_pending: int = 20_000,
                 observe: Observe | None = None) -> None:
        self.store = store
        # The reads of handshakes and HTTP calls at once share one round trip.
        self._reads: Batcher[str, Sanctions] = Batcher(
            lambda users: self.store.get_many(users), name="redis", max_batch=max_batch,
            max_pending=max_pending, observe=observe)
        self.unchecked = unchecked
        self.teller = teller
        self.hub = hub
        self.token_max_ttl_s = token_max_ttl_s
        self._warned = -60.0
        # user -> (monotonic time told, banned?, revoked before): the bans and
        # revocations of the last RECENT_S, for connections whose handshake
        # passed ``admit`` just before the ban and registered just after the
        # control message was applied here (``held_back``).
        self._recent: dict[str, tuple[float, bool, float]] = {}

    async def admit(self, token: Token) -> None:
        """Refuse a banned user (``forbidden``) or a revoked token (``unauthorized``).

        While Redis cannot be read the check is skipped (counted, logged once
        a minute): sync and history keep being served from MongoDB during a
        Redis outage, as they were before bans existed. With ``max_pending``
        checks already waiting (a connect storm past what Redis keeps up
        with) it raises ``Unavailable``: the caller refuses, and the client
        retries.
        """
        if self._reads.pending >= self._reads.max_pending:
            # Overloaded, not down: refused (retry), never admitted unchecked.
            raise Unavailable("sanctions", "too many checks waiting")
        try:
            s = await self._reads.submit(token.user)
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

    async def close(self) -> None:
        """Wait for the reads in flight."""
        await self._reads.close()

    async def disconnect(self, user: str) -> None:
        await self.teller.tell([user], Close("disconnected by the server"))

    async def ban(self, user: str, seconds: int) -> None:
        """Every node is told (not only those holding a device): one whose
        handshake of ``user`` passed ``admit`` just before the ban closes it as
        soon as it registers (``held_back``)."""
        await self.store.ban(user, time.time() + seconds)
        await self.teller.tell_all([user], Close("banned", ban=True))

    async def unban(self, user: str) -> None:
        await self.store.unban(user)
        await self.teller.tell_all([user], Unban())

    async def revoke(self, user: str, before: float) -> None:
        await self.store.revoke(user, before, self.token_max_ttl_s)
        await self.teller.tell_all([user], Revoke(before))

    def held_back(self, client: Client) -> bool:
        """Whether a connection that just registered falls under a ban or a
        revocation told to this node in the last ``RECENT_S`` (no I/O)."""
        seen = self._recent.get(client.user)
        if seen is None:
            return False
        told, banned, before = seen
        if time.monotonic() - told > RECENT_S:
            del self._recent[client.user]
            return False
        return banned or client.iat < before

    def _remember(self, user: str, ctl: Close | Revoke | Unban) -> None:
        now = time.monotonic()
        if isinstance(ctl, Unban):
            told, _, before = self._recent.get(user, (now, False, 0.0))
            self._recent[user] = (told, False, before)
            return
        _, banned, before = self._recent.get(user, (now, False, 0.0))
        if isinstance(ctl, Close) and ctl.ban:
            banned = True
        elif isinstance(ctl, Revoke):
            before = max(before, ctl.before)
        else:
            return
        if len(self._recent) >= RECENT_MAX:
            self._recent = {u: v for u, v in self._recent.items() if now - v[0] <= RECENT_S}
            if len(self._recent) >= RECENT_MAX:
                return  # bounded; the handshake's own Redis check still holds
        self._recent[user] = (now, banned, before)

    async def mute(self, room: str, user: str, seconds: int) -> None:
        until = time.time() + seconds
        await self.store.mute(room, user, until)
        await self.teller.tell([user], RoomMute(room, until))

    async def unmute(self, room: str, user: str) -> None:
        await self.store.unmute(room, user)
        await self.teller.tell([user], RoomUnmute(room))

    async def kick(self, room: str, user: str) -> None:
        await self.teller.tell([user], RoomKick(room))

    def apply_control(self, users: list[str], ctl: Close | Revoke | Unban
                      ) -> Awaitable[Any] | None:
        """Close these users' local connections (a revocation: those whose token
        was issued before its time): remembered at once, the closes returned."""
        for user in users:
            self._remember(user, ctl)
        closing: list[Client] = []
        for user in users:
            for client in list(self.hub.users.get(user, {}).values()):
                if isinstance(ctl, Close) or (isinstance(ctl, Revoke)
                                              and client.iat < ctl.before):
                    closing.append(client)
        if not closing:
            return None
        reason = ctl.reason[:100] if isinstance(ctl, Close) else "token revoked"
        return asyncio.gather(*(c.ws.close(CLOSED_BY_SERVER, reason) for c in closing),
                              return_exceptions=True)
