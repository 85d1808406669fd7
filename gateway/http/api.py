"""The HTTP API (FastAPI): offline sync, conversations, history, groups, rooms, the
feed (its routes in ``gateway.http.feed``, the groups' in ``gateway.http.groups``),
health; ``/metrics`` on its own listener (``build_metrics_http``). Route modules
share ``gateway.http.common``.

Every ``/v1/`` call passes ``gateway.http.guard.HttpGuard`` first (token,
rate, body limit, before the body is read); the route takes the caller from
the scope. Every error answers ``{"error": {"code", "message"}}`` with the
status of its code (``gateway.http.models.ErrorBody``, documented per route
in ``/openapi.json``); a validation failure is a 400, a dependency that is
down a 503, and nothing raw (a traceback, a driver message) reaches the
client. No Swagger UI is served (it would load its assets from a CDN).

The demo web app (``web/demo``) is served at ``/demo/`` and the JavaScript
SDK it imports (``clients/js/src``) at ``/demo/sdk/``, static files outside
``/v1/`` (no token), when those directories exist; mounts are not in
``/openapi.json``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Annotated, Any

from fastapi import FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from core.errors import Unavailable
from core.ids import MAX_MID
from core.ratelimit import KeyedBuckets
from core.seek_cursor import MAX_CURSOR
from gateway.auth import Token, TokenVerifier
from gateway.chat.service import ChatService
from gateway.contacts.service import Relations
from gateway.errors import HTTP_STATUS, ProtocolError
from gateway.feed.service import FeedService
from gateway.groups.admin import GroupAdmin
from gateway.http.common import JSON, READ, WRITE, Limit, User, UserList, user_list
from gateway.http.common import ok as _ok
from gateway.http.contacts import install_contacts
from gateway.http.devices import install_devices
from gateway.http.feed import install_feed
from gateway.http.groups import install_groups
from gateway.http.guard import HttpGuard, HttpLimits, error_bytes
from gateway.http.messages import install_message_features
from gateway.http.models import (
    ConversationList,
    Health,
    HistoryPage,
    Id,
    Info,
    Ok,
    PresenceStates,
    ReadMark,
    RoomOnline,
    SyncAck,
    SyncPage,
    errors,
)
from gateway.http.server import ServerDeps, install_server_api
from gateway.inbox.conversations import Conversations
from gateway.inbox.ops import MessageOps
from gateway.metrics import NodeMetrics
from gateway.presence.devices import Devices
from gateway.protocol import MAX_PRESENCE_USERS
from gateway.rooms.service import LiveRooms

__all__ = ["HttpDeps", "LazyHttp", "build_http", "build_metrics_http"]

log = logging.getLogger("gateway.http")
METRICS_TYPE = "text/plain; version=0.0.4"
REPO = FsPath(__file__).resolve().parents[2]  # gateway/http/api.py -> the repository
DEMO_DIR = REPO / "web" / "demo"  # served at /demo/
SDK_DIR = REPO / "clients" / "js" / "src"  # served at /demo/sdk/ (the demo imports it)


def _error(code: str, message: str, status: int | None = None,
           headers: Mapping[str, str] | None = None) -> Response:
    return Response(error_bytes(code, message), status_code=status or HTTP_STATUS[code],
                    media_type="application/json", headers=headers)


@dataclass(frozen=True)
class HttpDeps:
    """What the HTTP API calls: the services, the node's health, its edge limits."""

    node: str
    verifier: TokenVerifier
    chat: ChatService
    conversations: Conversations
    groups: GroupAdmin
    feed: FeedService
    live: LiveRooms
    metrics: NodeMetrics
    healthy: Callable[[], Awaitable[bool]]
    limits: HttpLimits = HttpLimits()
    metrics_public: bool = False  # also serve /metrics here (IM_METRICS_PUBLIC)
    cors_origins: tuple[str, ...] = ()  # IM_CORS_ORIGINS: browsers of these may call
    api_keys: tuple[str, ...] = ()  # IM_API_KEYS: the server API's keys
    admit: Callable[[Token], Awaitable[None]] | None = None  # bans and revocations
    server: ServerDeps | None = None  # the server API (/v1/server/*)
    ops: MessageOps | None = None  # read receipts, recall, delete for me
    relations: Relations | None = None  # privacy settings and blocks
    devices: Devices | None = None  # the caller's devices (GET /v1/devices)
    ws_port: Callable[[], int] = lambda: 8080  # this node's WebSocket port, once listening
    public_ws_url: str = ""  # IM_PUBLIC_WS_URL: what /v1/info tells; "" derives it


class LazyHttp:
    """The HTTP API as an ASGI app that builds its FastAPI app on the first
    request. FastAPI analyses every route's signature when it is added (a
    pydantic adapter per parameter): about 80 ms of CPU for this API, spent
    once per process, and not at all by a node no one calls over HTTP (most
    of the test suite's in-process nodes). A node's first HTTP request
    (usually its health check) waits for it."""

    def __init__(self, build: Callable[[], FastAPI]) -> None:
        self._build: Callable[[], FastAPI] | None = build
        self._app: FastAPI | None = None

    @property
    def app(self) -> FastAPI:
        if self._app is None:
            assert self._build is not None
            self._app, self._build = self._build(), None
        return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def build_http(deps: HttpDeps) -> LazyHttp:
    """The node's HTTP API; ``/openapi.json`` describes it. The wiring it shares
    with the WebSocket side (the per-user read budget) is done now; the
    routes on the first request (``LazyHttp``)."""
    buckets = KeyedBuckets(deps.limits.rate, deps.limits.burst)
    deps.conversations.spend = lambda user, n: buckets.debit(user, time.monotonic(), n)
    deps.groups.read_groups = deps.conversations.charge
    return LazyHttp(lambda: _build_app(deps, buckets))


def _build_app(deps: HttpDeps, buckets: KeyedBuckets) -> FastAPI:
    app = FastAPI(title="imgate", version="1", default_response_class=JSON, docs_url=None,
                  redoc_url=None, redirect_slashes=False, separate_input_output_schemas=False)
    _install_error_handlers(app)
    _install_openapi(app)
    app.add_middleware(HttpGuard, verifier=deps.verifier, limits=deps.limits,
                       routes=app.router.routes, api_keys=deps.api_keys, admit=deps.admit,
                       buckets=buckets,
                       count=lambda route, status: deps.metrics.http_requests.labels(
                           route, str(status)).inc())
    if deps.cors_origins:  # outermost: a preflight is answered before the guard's token check
        app.add_middleware(CORSMiddleware, allow_origins=list(deps.cors_origins),
                           allow_methods=["GET", "POST", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "X-API-Key"],
                           max_age=600)

    @app.get("/", include_in_schema=False)
    async def root(request: Request) -> JSON:
        """Where things are, for a person who opens the node's address."""
        return JSON({"service": "imgate", "node": deps.node,
                     "websocket": deps.public_ws_url or _ws_url(request, deps.ws_port()),
                     "demo": "/demo/" if DEMO_DIR.is_dir() else None,
                     "openapi": "/openapi.json", "health": "/healthz", "info": "/v1/info"})

    @app.get("/healthz", response_model=Health, responses=errors(500, 503))
    async def healthz() -> Response:
        """200 while this node can serve (Redis and MongoDB answer, not draining)."""
        if not await deps.healthy():
            return _error("unavailable", "node cannot serve")
        return JSON({"ok": True, "node": deps.node})

    @app.get("/v1/info", response_model=Info, responses=errors(500))
    async def info(request: Request) -> JSON:
        """Where clients connect (no token): ``IM_PUBLIC_WS_URL`` if set; else,
        called on this node's own HTTP port, its WebSocket port on the host the
        caller used; called through a proxy on another port (nginx's one port for
        ``/`` and ``/ws``), that origin's ``/ws``."""
        return JSON({"ws_url": deps.public_ws_url or _ws_url(request, deps.ws_port())})

    if deps.metrics_public:
        @app.get("/metrics", response_class=PlainTextResponse,
                 responses={200: {"description": "Prometheus text format 0.0.4",
                                  "content": {"text/plain": {"schema": {"type": "string"}}}}})
        async def metrics() -> Response:
            """Prometheus metrics (here only with IM_METRICS_PUBLIC=1)."""
            return Response(deps.metrics.render(), media_type=METRICS_TYPE)

    _messages(app, deps)
    install_groups(app, deps.groups)
    _rooms(app, deps)
    install_feed(app, deps.feed)
    if deps.relations is not None:
        install_contacts(app, deps.relations)
    if deps.devices is not None:
        install_devices(app, deps.devices)
    if deps.ops is not None and deps.ops.features is not None:
        install_message_features(app, deps.ops)
    if deps.server is not None:
        install_server_api(app, deps.server)
    _demo(app)
    return app


def _ws_url(request: Request, ws_port: int) -> str:
    forwarded = request.headers.get("x-forwarded-proto", "")
    secure = request.url.scheme == "https" or forwarded.split(",")[0].strip() == "https"
    scheme = "wss" if secure else "ws"
    host = request.url.hostname or "127.0.0.1"
    if ":" in host:  # an IPv6 literal
        host = f"[{host}]"
    server = request.scope.get("server")
    direct = server is not None and request.url.port == server[1]
    if direct:
        return f"{scheme}://{host}:{ws_port}/ws"
    port = request.url.port
    return f"{scheme}://{host}{f':{port}' if port else ''}/ws"


def _demo(app: FastAPI) -> None:
    """The demo page and the SDK it imports: static files, no token, not in the schema."""
    if SDK_DIR.is_dir():  # first: /demo/sdk/ is matched before /demo/
        app.mount("/demo/sdk", StaticFiles(directory=SDK_DIR), name="demo-sdk")
    if DEMO_DIR.is_dir():
        app.mount("/demo", StaticFiles(directory=DEMO_DIR, html=True), name="demo")

        @app.get("/demo", include_in_schema=False)
        async def demo(request: Request) -> Response:
            """``/demo`` -> ``/demo/`` (the page's relative URLs need the slash)."""
            query = request.url.query
            return RedirectResponse("/demo/" + (f"?{query}" if query else ""), 307)


ConversationCursor = Annotated[str | None, Query(
    min_length=1, max_length=MAX_CURSOR, description="opaque: the last page's `cursor`")]


def _messages(app: FastAPI, deps: HttpDeps) -> None:
    chat, convs = deps.chat, deps.conversations

    @app.get("/v1/sync", response_model=SyncPage, responses=READ)
    async def sync(user: User, since: Annotated[int, Query(ge=0, le=MAX_MID)] = 0,
                   limit: Limit = 100,
                   changes: Annotated[bool, Query(description=(
                       "also the messages at or below `since` changed after it (edited, "
                       "reacted to, recalled), as they are now"))] = False) -> JSON:
        """The caller's messages after ``since``, oldest first, 1:1 and group."""
        page = await convs.sync(user, since, limit, changes=changes)
        return JSON({"msgs": page.msgs, "next": page.next, "more": page.more})

    @app.post("/v1/sync/ack", response_model=Ok, responses=WRITE)
    async def sync_ack(user: User, body: SyncAck) -> JSON:
        """Offline entries up to ``upto`` are dropped."""
        await chat.sync_ack(user, body.upto)
        return _ok()

    @app.get("/v1/conversations", response_model=ConversationList, responses=READ)
    async def conversations(user: User, limit: Limit = 100,
                            cursor: ConversationCursor = None) -> JSON:
        """1:1 conversations and groups together, most recent activity first,
        ``limit`` a page; the answer's ``cursor`` asks for the next page."""
        return JSON(await convs.conversations(user, limit, cursor))

    @app.post("/v1/conversations/{conv}/read", response_model=Ok,
              responses={**WRITE, **errors(403, 404)})
    async def read(user: User, conv: Id, body: ReadMark) -> JSON:
        """Read up to ``mid`` in a conversation (a peer, or ``g:GROUP``); the
        caller's devices get ``read``, a 1:1 peer's a ``receipt``."""
        if deps.ops is None:
            await convs.mark_read(user, conv, body.mid)
        else:
            await deps.ops.read(user, conv, body.mid)
        return _ok()

    @app.get("/v1/presence", response_model=PresenceStates, responses=READ)
    async def presence(user: User, users: UserList) -> JSON:
        """``users``: comma-separated, at most 500 (and 5,000 characters): online now
        across the nodes, and when each was last seen (unix ms; now while online);
        ``{"hidden": true}`` for a user whose privacy settings hide it from the
        caller."""
        names = user_list(users, MAX_PRESENCE_USERS)
        if deps.ops is None:
            raise ProtocolError("unavailable", "presence is not served here")
        if deps.ops.relations is not None and not deps.ops.relations.afford(user, names):
            raise ProtocolError("rate_limited", "too many users looked up; slow down "
                                "(IM_RELATION_LOOKUP_RATE)")
        return JSON({"users": await deps.ops.presence_state(user, names)})

    @app.delete("/v1/messages/{mid}", response_model=Ok, responses={**READ, **errors(404)})
    async def delete_message(user: User,
                             mid: Annotated[int, Path(ge=0, le=MAX_MID)]) -> JSON:
        """Delete for me: out of the caller's box (sync and history), the peer keeps it."""
        if deps.ops is None:
            raise ProtocolError("not_found", "no such message in your box")
        await deps.ops.forget(user, mid)
        return _ok()

    @app.get("/v1/history/{conv}", response_model=HistoryPage,
             responses={**READ, **errors(403)})
    async def history(user: User, conv: Id,
                      before: Annotated[int | None, Query(ge=0, le=MAX_MID)] = None,
                      limit: Limit = 50) -> JSON:
        """The caller's own conversation, newest first."""
        msgs, nxt = await convs.history(user, conv, before, limit)
        return JSON({"msgs": msgs, "next": nxt})


def _rooms(app: FastAPI, deps: HttpDeps) -> None:
    live = deps.live

    @app.get("/v1/rooms/{room}", response_model=RoomOnline, responses=READ)
    async def room(_: User, room: Id) -> JSON:
        """Members of a live room across all live nodes: ``online`` counts
        connections, ``users`` distinct users (a user connected to the room
        through two nodes counts twice)."""
        conns, users = await live.online(room)
        return JSON({"room": room, "online": conns, "users": users})


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProtocolError)
    async def protocol_error(_: Request, exc: ProtocolError) -> Response:
        return _error(exc.code, exc.message)

    @app.exception_handler(Unavailable)
    async def unavailable(_: Request, exc: Unavailable) -> Response:
        log.warning("unavailable: %s", exc)
        return _error("unavailable", "a dependency is down; retry later")

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        loc = tuple(first.get("loc", ()))
        if loc[:1] == ("body",):
            kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                came = f"as {kind}" if kind else "without a Content-Type"
                return _error("bad_request", "the body must be JSON, sent with Content-Type: "
                              f"application/json (this one came {came})")
            if first.get("type") == "json_invalid":
                return _error("bad_request", "the body is not valid JSON: "
                              f"{(first.get('ctx') or {}).get('error', 'cannot be decoded')} "
                              f"(at character {loc[1] if len(loc) > 1 else 0})")
        where = ".".join(str(x) for x in loc if x != "body") or "request"
        message = str(first.get("msg", "invalid")).removeprefix("Value error, ")
        return _error("bad_request", f"{where}: {message}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 401: "unauthorized", 403: "forbidden", 413: "too_large",
                429: "rate_limited", 503: "unavailable"}.get(exc.status_code, "bad_request")
        headers = exc.headers
        if exc.status_code == 405:  # RFC 9110 15.5.6: Allow lists every method of the path
            headers = {"Allow": _allowed_methods(request)}
        return _error(code, str(exc.detail), exc.status_code, headers)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> Response:
        log.error("internal error", exc_info=exc)
        return _error("internal", "internal error")


def _allowed_methods(request: Request) -> str:
    """The methods of every route whose path matches (Starlette names only the
    first route's, and e.g. ``/v1/follow/{other}`` is two routes)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def _install_openapi(app: FastAPI) -> None:
    """``/openapi.json`` without FastAPI's 422 (this API answers 400 instead)."""
    plain = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = plain()
            for ops in schema.get("paths", {}).values():
                for op in ops.values():
                    op.get("responses", {}).pop("422", None)
            defs = schema.get("components", {}).get("schemas", {})
            for name in ("HTTPValidationError", "ValidationError"):
                defs.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def build_metrics_http(metrics: NodeMetrics) -> ASGIApp:
    """The ``/metrics`` listener's app (``IM_METRICS_HOST``/``IM_METRICS_PORT``)."""

    async def serve(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        if scope["path"] != "/metrics":
            status, body = 404, error_bytes("not_found", "only /metrics is served here")
        elif scope["method"] not in ("GET", "HEAD"):
            status, body = 405, error_bytes("bad_request", "method not allowed")
            headers.append((b"allow", b"GET, HEAD"))
        else:
            status, body = 200, metrics.render()
            headers = [(b"content-type", METRICS_TYPE.encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return serve
