"""Synchronous hooks: before a send (1:1 and group, WebSocket and server API),
a ``room_send`` or a ``join`` is done, the node POSTs it to the product's
backend (``IM_HOOK_URL``), signed as the webhook relay signs (core.signing),
and the answer decides: ``{"action":"allow"}``, ``{"action":"allow","body":B}``
(stored and delivered with body B), or ``{"action":"reject","message":M}``
(the client gets ``forbidden`` with M; nothing stored or delivered).

A hook that fails (no answer within ``IM_HOOK_TIMEOUT_MS``, a connection
error, a non-2xx answer, an answer that says neither) is ``unavailable`` for
the call under ``IM_HOOK_FAILURE=closed`` (the default: nothing stored), or
allowed under ``open``. Calls run concurrently, at most
``IM_HOOK_MAX_INFLIGHT`` at once (a call waiting for a place waits within
its timeout), on pooled connections, never blocking the event loop: a slow
hook slows only the calls that wait for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from core.errors import Unavailable
from core.signing import sign
from gateway.errors import ProtocolError
from gateway.metrics import NodeMetrics
from gateway.protocol import encode_body

__all__ = ["HOOK_KINDS", "HookSettings", "Hooks", "send_vet"]

HOOK_KINDS = ("send", "room_send", "join")
MESSAGE_MAX = 200  # characters of a rejection's message the client is shown


@dataclass(frozen=True, slots=True)
class HookSettings:
    url: str = ""  # "": no hooks
    secret: bytes = b""
    kinds: frozenset[str] = frozenset()
    timeout_s: float = 0.5
    failure_open: bool = False  # a failed hook allows the call (else: unavailable)
    max_inflight: int = 64
    max_body: int = 4096


class _Failed(Exception):
    """The hook did not decide (why: the outcome label)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Hooks:
    """The node's hook calls (one pooled HTTP client)."""

    def __init__(self, cfg: HookSettings, metrics: NodeMetrics,
                 client: httpx.AsyncClient | None = None) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self._places = asyncio.Semaphore(cfg.max_inflight)
        limits = httpx.Limits(max_connections=cfg.max_inflight,
                              max_keepalive_connections=cfg.max_inflight, keepalive_expiry=30)
        self._http = client or httpx.AsyncClient(limits=limits, trust_env=False,
                                                 timeout=httpx.Timeout(cfg.timeout_s))

    def on(self, kind: str) -> bool:
        return bool(self.cfg.url) and kind in self.cfg.kinds

    async def send(self, user: str, target: dict[str, str], cmid: str, body: bytes) -> bytes:
        """The body to store: ``body``, or the hook's rewrite; ProtocolError
        ``forbidden`` if it rejects; Unavailable if it failed (closed mode)."""
        if not self.on("send"):
            return body
        return await self._decide("send", {"hook": "send", "user": user, **target, "cmid": cmid,
                                           "body": orjson.Fragment(body)}, body)

    async def edit(self, user: str, target: dict[str, str], cmid: str, mid: int,
                   body: bytes) -> bytes:
        """An edit's new body goes through the ``send`` hook (a hook that vets what
        is sent vets what a message is edited into): its payload is a send's
        with ``edit``, the mid of the message edited."""
        if not self.on("send"):
            return body
        return await self._decide("send", {"hook": "send", "user": user, **target, "cmid": cmid,
                                           "edit": mid, "body": orjson.Fragment(body)}, body)

    async def room_send(self, user: str, room: str, body: bytes) -> bytes:
        if not self.on("room_send"):
            return body
        return await self._decide("room_send", {"hook": "room_send", "user": user,
                                                "room": room, "body": orjson.Fragment(body)},
                                  body)

    async def join(self, user: str, room: str) -> None:
        if self.on("join"):
            await self._decide("join", {"hook": "join", "user": user, "room": room}, b"")

    async def _decide(self, kind: str, payload: dict[str, Any], body: bytes) -> bytes:
        started = time.perf_counter()
        try:
            answer = await self._call(kind, orjson.dumps(payload))
            outcome, result = self._outcome(answer, body)
        except _Failed as failed:
            outcome = failed.why
            if not self.cfg.failure_open:
                self._count(kind, outcome, started)
                raise Unavailable("hook", failed.why) from None
            result = body
        self._count(kind, outcome, started)
        if isinstance(result, ProtocolError):
            raise result
        return result

    def _count(self, kind: str, outcome: str, started: float) -> None:
        self.metrics.hook_calls.labels(kind, outcome).inc()
        self.metrics.hook_seconds.labels(kind).observe(time.perf_counter() - started)

    async def _call(self, kind: str, data: bytes) -> Any:
        ts = int(time.time())
        headers = {"Content-Type": "application/json", "X-Imgate-Hook": kind,
                   "X-Imgate-Timestamp": str(ts),
                   "X-Imgate-Signature": sign(self.cfg.secret, ts, data)}
        try:
            async with asyncio.timeout(self.cfg.timeout_s):  # a place, then the answer
                async with self._places:
                    r = await self._http.post(self.cfg.url, content=data, headers=headers)
        except TimeoutError:
            raise _Failed("timeout") from None
        except httpx.HTTPError:
            raise _Failed("error") from None
        if not 200 <= r.status_code < 300:
            raise _Failed("error")
        try:
            return orjson.loads(r.content)
        except orjson.JSONDecodeError:
            raise _Failed("error") from None

    def _outcome(self, answer: Any, body: bytes) -> tuple[str, bytes | ProtocolError]:
        action = answer.get("action") if isinstance(answer, dict) else None
        if action == "reject":
            message = answer.get("message")
            text = message[:MESSAGE_MAX] if isinstance(message, str) and message else \
                "rejected by the product's rules"
            return "reject", ProtocolError("forbidden", text)
        if action != "allow":
            raise _Failed("error")
        if "body" not in answer:
            return "allow", body
        try:
            return "rewrite", encode_body(answer["body"], self.cfg.max_body)
        except ProtocolError:  # a rewrite over IM_MAX_BODY: the hook failed
            raise _Failed("error") from None

    async def close(self) -> None:
        await self._http.aclose()


def send_vet(hooks: Hooks | None, sender: str, target: dict[str, str], cmid: str,
             body: list[bytes]) -> Callable[[bytes], Awaitable[bytes]] | None:
    """What a send's store path asks before it stores (``ChatService.send``'s
    and ``GroupService.send``'s ``vet``): the hook's body, kept in ``body[0]``
    for the events that follow; None when ``send`` is not hooked."""
    if hooks is None or not hooks.on("send"):
        return None
    on = hooks

    async def vet(given: bytes) -> bytes:
        body[0] = await on.send(sender, target, cmid, given)
        return body[0]

    return vet
