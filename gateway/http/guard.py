"""The HTTP edge: what every request passes before a route sees it.

``HttpGuard`` (ASGI middleware), in this order, before a byte of the body is
read: the bearer token of every ``/v1/`` call (401; the user id is then in
the scope under ``USER_KEY``), the caller's rate (429: a token bucket per
user on this node, ``core.ratelimit.KeyedBuckets``), ``Content-Length`` against the body
limit (413). Then the body is read, refused with 413 as soon as it passes
the limit (chunked bodies), and handed to the route. A refusal is answered
at once, whatever of the body is still coming. It counts ``im_http_requests_total{route,status}``
with the route's template as the label (bounded).

``TimedH11Protocol`` (uvicorn's h11 protocol with deadlines): the request
line and headers must arrive within ``IM_HTTP_HEADER_TIMEOUT_S`` of the
connection or of the request's first byte, the body within
``IM_HTTP_BODY_TIMEOUT_S`` of the headers; past a deadline the connection
is closed (uvicorn itself has only a keep-alive timeout, so a client could
hold a socket for ever by sending a partial request line). A body still
coming after the answer (an early refusal) is read and dropped, never kept,
for at most ``LINGER_S`` and ``LINGER_BYTES``, then the connection closes:
closing at once would reset it, and a client still sending would lose the
answer (RFC 9112 9.6, lingering close).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import socket
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
import orjson
from starlette.datastructures import Headers
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from core.errors import Unavailable
from core.ratelimit import KeyedBuckets
from gateway.auth import Token, TokenVerifier, bearer_token
from gateway.config import Settings
from gateway.errors import HTTP_STATUS, ProtocolError

__all__ = ["USER_KEY", "HttpGuard", "HttpLimits", "TimedH11Protocol",            "error_bytes"]

USER_KEY = "imgate.user"  # the authenticated caller, in the ASGI scope
PROTECTED_PREFIX = "/v1/"  # every path under it needs a token; the rest is public
SERVER_PREFIX = "/v1/server/"  # ... but these need an API key instead (IM_API_KEYS)
PUBLIC_PATHS = frozenset({"/v1/info"})  # ... and these need nothing (what a client is told first)
LINGER_S = 2.0  # after an early answer: how long the rest of a body is read and dropped
LINGER_BYTES = 1 << 20  # ... and how much of it


@dataclass(frozen=True)
class HttpLimits:
    """The HTTP edge's limits (``IM_HTTP_*``)."""

    body_max: int = 65_536
    rate: float = 50.0  # 0: no rate limit
    burst: int = 100
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    @classmethod
    def from_settings(cls, s: Settings) -> HttpLimits:
        return cls(s.http_body_max, s.http_rate, s.http_burst, s.http_header_timeout_s,
                   s.http_body_timeout_s)


def error_bytes(code: str, message: str) -> bytes:
    """The ``{"error": {"code", "message"}}`` body."""
    return orjson.dumps({"error": {"code": code, "message": message}})


class HttpGuard:
    """ASGI middleware: auth, rate, body limit, request counting (module doc)."""

    def __init__(self, app: ASGIApp, *, verifier: TokenVerifier, limits: HttpLimits,
                 routes: Sequence[BaseRoute], count: Callable[[str, int], None],
                 clock: Callable[[], float] = time.monotonic, api_keys: Sequence[str] = (),
                 admit: Callable[[Token], Awaitable[None]] | None = None,
                 buckets: KeyedBuckets | None = None) -> None:
        self.app = app
        self.verifier = verifier
        self.limits = limits
        self.routes = routes
        self.count = count
        self.clock = clock
        # each user's calls; a handler whose call cost more than one debits it
        self.buckets = buckets if buckets is not None else KeyedBuckets(limits.rate, limits.burst)
        self.api_keys = tuple(k.encode() for k in api_keys)
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client gets if the app raises (ServerErrorMiddleware)

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            if not await self._guarded(scope, receive, tracked):
                status = 499  # the client left before its body was read (nginx's code)
        finally:
            self.count(self.route_of(scope), status)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> bool:
        headers = Headers(scope=scope)
        if scope["path"].startswith(SERVER_PREFIX):
            if not self._key_ok(headers.get("x-api-key")):
                await _refuse(send, "unauthorized", "an API key (X-API-Key, one of "
                              "IM_API_KEYS) is required here; user tokens are not accepted")
                return True
        elif scope["path"].startswith(PROTECTED_PREFIX) and scope["path"] not in PUBLIC_PATHS:
            try:
                token = self.verifier.check(bearer_token(headers.get("authorization")))
                if self.admit is not None:
                    await self.admit(token)  # a ban or revocation: one Redis read
            except ProtocolError as err:
                await _refuse(send, err.code, err.message, [(b"www-authenticate", b"Bearer")])
                return True
            except Unavailable:
                await _refuse(send, "unavailable", "a dependency is down; retry")
                return True
            user = token.user
            if not self.buckets.take(user, self.clock()):
                wait = str(self.buckets.retry_after(user)).encode()
                await _refuse(send, "rate_limited", "too many requests; slow down",
                              [(b"retry-after", wait)])
                return True
            scope[USER_KEY] = user
        length = _content_length(headers)
        if length is not None and length > self.limits.body_max:
            await _refuse(send, "too_large", self._too_large())
            return True
        try:
            body = await _read_body(receive, self.limits.body_max)
        except _TooLarge:
            await _refuse(send, "too_large", self._too_large())
            return True
        if body is None:
            return False
        await self.app(scope, _replay(body, receive), send)
        return True

    def _key_ok(self, given: str | None) -> bool:
        """Constant-time against every configured key (none configured: none passes)."""
        if not given:
            return False
        raw = given.encode()
        return any([hmac.compare_digest(raw, k) for k in self.api_keys])

    def _too_large(self) -> str:
        return f"the request body is over the limit of {self.limits.body_max} bytes"

    def route_of(self, scope: Scope) -> str:
        """The route template (``/v1/history/{conv}``), a bounded metrics label."""
        route = scope.get("route")
        if route is None:
            route = next((r for r in self.routes if r.matches(scope)[0] is not Match.NONE),
                         None)
        path = getattr(route, "path", None)
        return path if isinstance(path, str) else "unmatched"


class _TooLarge(Exception):
    """The body passed the limit while it was read."""


def _content_length(headers: Headers) -> int | None:
    raw = headers.get("content-length")
    try:
        return int(raw) if raw is not None else None
    except ValueError:  # h11 refuses these before we see them; be safe anyway
        return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole body, None if the client went away; ``_TooLarge`` as soon as
    it passes ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body read already, then the real one
    (which reports the client's disconnect)."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


async def _refuse(send: Send, code: str, message: str,
                  extra: list[tuple[bytes, bytes]] | None = None) -> None:
    """An error answer, sent before (the rest of) the body was read; the rest
    is dropped by ``TimedH11Protocol`` (lingering close)."""
    body = error_bytes(code, message)
    out = [(b"content-type", b"application/json"),
           (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": HTTP_STATUS[code], "headers": out})
    await send({"type": "http.response.body", "body": body})


# -- deadlines on the wire ---------------------------------------------------------
@dataclass(frozen=True)
class Deadlines:
    header_s: float
    body_s: float
    on_timeout: Callable[[str], None] | None = None  # "header" or "body"


def _no_delay(transport: asyncio.BaseTransport) -> None:
    """TCP_NODELAY on an accepted socket. uvloop sets it on every TCP socket;
    asyncio's own loop (a node run in-process, as the tests do, or where
    uvloop is missing) only on sockets whose ``proto`` says TCP, and a
    listener made by ``socket.create_server`` (the node's, for
    ``SO_REUSEPORT``) says 0. uvicorn writes an answer's head and body apart:
    Nagle then held the body until the client's delayed ACK, and every answer
    on a kept-alive connection took 40 ms more."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a body deadline.

    The state of the request decides the deadline: waiting for a request
    line (from the connection's start, or from the first byte of the next
    request on a kept-alive connection; an idle kept-alive connection is
    uvicorn's keep-alive timeout's), receiving a body, receiving a body
    after the answer (lingering), or none. Use
    ``TimedH11Protocol.with_deadlines(...)`` as uvicorn's ``http=``.
    """

    deadlines: ClassVar[Deadlines] = Deadlines(10.0, 30.0)

    @classmethod
    def with_deadlines(cls, header_s: float, body_s: float,
                       on_timeout: Callable[[str], None] | None = None
                       ) -> type[TimedH11Protocol]:
        return type(cls.__name__, (cls,), {"deadlines": Deadlines(header_s, body_s,
                                                                  on_timeout)})

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._phase = ""
        self._dropped = 0  # body bytes read while lingering

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        _no_delay(transport)
        super().connection_made(transport)
        self._arm("header")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._phase and self.conn.their_state is h11.IDLE:
            self._arm("header")  # the next request on a kept-alive connection begins
        elif self._phase == "linger":
            self._dropped += len(data)
            if self._dropped > LINGER_BYTES:
                self._close()
                return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._phase not in ("body", "linger"):
                self._arm("body")
        elif state is not h11.IDLE:
            self._disarm()  # the request is in (or the connection is done)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self._dropped = 0
            self._arm("linger")  # answered early: drop the rest of the body, briefly

    def _arm(self, phase: str) -> None:
        self._disarm()
        delay = {"header": self.deadlines.header_s, "body": self.deadlines.body_s,
                 "linger": min(LINGER_S, self.deadlines.body_s)}[phase]
        self._phase = phase
        self._timer = self.loop.call_later(delay, self._expired, phase)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._phase = None, ""

    def _expired(self, phase: str) -> None:
        self._timer, self._phase = None, ""
        if not self.transport.is_closing():
            if phase != "linger" and self.deadlines.on_timeout is not None:
                self.deadlines.on_timeout(phase)
            self._close()

    def _close(self) -> None:
        self._disarm()
        self.transport.close()
