"""The HTTP API (FastAPI): offline sync, conversations, history, groups, rooms, the
feed, health, metrics.

Every error answers ``{"error": {"code", "message"}}`` with the status of its
code; a validation failure is a 400, a dependency that is down a 503, and
nothing raw (a traceback, a driver message) reaches the client.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, StrictInt
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.errors import Unavailable
from core.ids import MAX_MID
from gateway.auth import bearer_token, verify_token
from gateway.chat import ChatService
from gateway.conversations import Conversations
from gateway.errors import HTTP_STATUS, ProtocolError
from gateway.feed import FeedService
from gateway.groups import GroupService
from gateway.live import LiveRooms
from gateway.metrics import NodeMetrics
from gateway.protocol import ID_PATTERN, check_id

__all__ = ["HttpDeps", "build_http"]

log = logging.getLogger("gateway.http")
MAX_LIMIT = 200

Mid = Annotated[StrictInt, Field(ge=0, le=MAX_MID)]
Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
ConvId = Annotated[str, Path(min_length=1, max_length=64, pattern=ID_PATTERN.pattern)]
PostId = Annotated[int, Path(ge=0, le=MAX_MID)]
Cursor = Annotated[int | None, Query(ge=0, le=MAX_MID)]
IdCursor = Annotated[str | None, Query(max_length=64, pattern=ID_PATTERN.pattern)]
MemberId = Annotated[str, Field(min_length=1, max_length=64, pattern=ID_PATTERN.pattern,
                                strict=True)]


def current_user(request: Request) -> str:
    """The caller, from ``Authorization: Bearer``; 401 otherwise."""
    token = bearer_token(request.headers.get("authorization"))
    secret: str = request.app.state.auth_secret
    return verify_token(secret, token)


User = Annotated[str, Depends(current_user)]


class SyncAck(BaseModel):
    model_config = ConfigDict(extra="forbid")
    upto: Mid


class NewGroup(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Annotated[str, Field(min_length=1, max_length=128)]
    members: Annotated[list[MemberId], Field(max_length=1000)] = []


class NewMembers(BaseModel):
    model_config = ConfigDict(extra="forbid")
    members: Annotated[list[MemberId], Field(min_length=1, max_length=1000)]


class NewPost(BaseModel):
    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, Field(strict=True)]
    repost_of: Annotated[StrictInt, Field(ge=0, le=MAX_MID)] | None = None
    reply_to: Annotated[StrictInt, Field(ge=0, le=MAX_MID)] | None = None


class ReadMark(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mid: Mid


class JSON(Response):
    """orjson-encoded body: stored message bytes pass through as ``orjson.Fragment``."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def _error(code: str, message: str, status: int | None = None) -> JSON:
    return JSON({"error": {"code": code, "message": message}},
                status_code=status or HTTP_STATUS[code])


@dataclass(frozen=True)
class HttpDeps:
    """What the HTTP API calls: the services, and the node's health."""

    node: str
    auth_secret: str
    chat: ChatService
    conversations: Conversations
    groups: GroupService
    feed: FeedService
    live: LiveRooms
    metrics: NodeMetrics
    healthy: Callable[[], Awaitable[bool]]


def build_http(deps: HttpDeps) -> FastAPI:
    """The node's HTTP API; ``/docs`` and ``/openapi.json`` describe it."""
    app = FastAPI(title="imgate", version="1", default_response_class=JSON)
    _install_error_handlers(app)
    app.state.auth_secret = deps.auth_secret
    chat, convs, groups, feed, live = (deps.chat, deps.conversations, deps.groups, deps.feed,
                                       deps.live)

    @app.get("/healthz")
    async def healthz() -> Response:
        if not await deps.healthy():
            return _error("unavailable", "node cannot serve")
        return JSON({"ok": True, "node": deps.node})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(deps.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/sync")
    async def sync(user: User, since: Annotated[int, Query(ge=0, le=MAX_MID)] = 0,
                   limit: Limit = 100) -> JSON:
        page = await convs.sync(user, since, limit)
        return JSON({"msgs": page.msgs, "next": page.next, "more": page.more})

    @app.post("/v1/sync/ack")
    async def sync_ack(user: User, body: SyncAck) -> JSON:
        await chat.sync_ack(user, body.upto)
        return JSON({"ok": True})

    @app.get("/v1/conversations")
    async def conversations(user: User, limit: Limit = 100) -> JSON:
        return JSON(await convs.conversations(user, limit))

    @app.post("/v1/conversations/{conv}/read")
    async def read(user: User, conv: ConvId, body: ReadMark) -> JSON:
        await convs.mark_read(user, check_id(conv, "conv"), body.mid)
        return JSON({"ok": True})

    @app.get("/v1/history/{conv}")
    async def history(user: User, conv: ConvId,
                      before: Annotated[int | None, Query(ge=0, le=MAX_MID)] = None,
                      limit: Limit = 50) -> JSON:
        msgs, nxt = await convs.history(user, check_id(conv, "conv"), before, limit)
        return JSON({"msgs": msgs, "next": nxt})

    @app.post("/v1/groups")
    async def create_group(user: User, body: NewGroup) -> JSON:
        """Create a group; the caller is its owner and a member."""
        return JSON({"group": await groups.create(user, body.name, body.members)})

    @app.post("/v1/groups/{group}/members")
    async def add_members(user: User, group: ConvId, body: NewMembers) -> JSON:
        """Owner only; new members see messages from now on."""
        await groups.add(user, group, body.members)
        return JSON({"ok": True})

    @app.delete("/v1/groups/{group}/members/{member}")
    async def remove_member(user: User, group: ConvId, member: ConvId) -> JSON:
        """Owner only; the member gets nothing sent after this answer."""
        await groups.remove(user, group, member)
        return JSON({"ok": True})

    @app.post("/v1/follow/{other}")
    async def follow(user: User, other: ConvId) -> JSON:
        await feed.follow(user, other, True)
        return JSON({"ok": True})

    @app.delete("/v1/follow/{other}")
    async def unfollow(user: User, other: ConvId) -> JSON:
        await feed.follow(user, other, False)
        return JSON({"ok": True})

    @app.get("/v1/users/{other}")
    async def profile(_: User, other: ConvId) -> JSON:
        """Follow counts (an extension of the contract)."""
        return JSON(await feed.profile(other))

    @app.get("/v1/users/{other}/following")
    async def following(_: User, other: ConvId, cursor: IdCursor = None,
                        limit: Limit = 50) -> JSON:
        """Who ``other`` follows, by id, seek-paginated (an extension)."""
        return JSON(await feed.follow_page("following", other, cursor, limit))

    @app.get("/v1/users/{other}/followers")
    async def followers(_: User, other: ConvId, cursor: IdCursor = None,
                        limit: Limit = 50) -> JSON:
        """Who follows ``other``, by id, seek-paginated (an extension)."""
        return JSON(await feed.follow_page("followers", other, cursor, limit))

    @app.post("/v1/posts")
    async def create_post(user: User, body: NewPost) -> JSON:
        return JSON({"post": await feed.create(user, body.text, body.repost_of,
                                               body.reply_to)})

    @app.delete("/v1/posts/{post}")
    async def delete_post(user: User, post: PostId) -> JSON:
        await feed.delete(user, post)
        return JSON({"ok": True})

    @app.post("/v1/posts/{post}/like")
    async def like(user: User, post: PostId) -> JSON:
        await feed.like(user, post)
        return JSON({"ok": True})

    @app.get("/v1/timeline")
    async def timeline(user: User, cursor: Cursor = None, limit: Limit = 50) -> JSON:
        return JSON(await feed.timeline(user, cursor, limit))

    @app.get("/v1/users/{other}/posts")
    async def user_posts(_: User, other: ConvId, cursor: Cursor = None,
                         limit: Limit = 50) -> JSON:
        return JSON(await feed.user_posts(other, cursor, limit))

    @app.get("/v1/posts/{post}/comments")
    async def comments(_: User, post: PostId, cursor: Cursor = None,
                       limit: Limit = 50) -> JSON:
        return JSON(await feed.comments(post, cursor, limit))

    @app.get("/v1/rooms/{room}")
    async def room(_: User, room: ConvId) -> JSON:
        """Members of a live room across all live nodes."""
        room = check_id(room, "room")
        return JSON({"room": room, "online": await live.online(room)})

    return app


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProtocolError)
    async def protocol_error(_: Request, exc: ProtocolError) -> JSON:
        return _error(exc.code, exc.message)

    @app.exception_handler(Unavailable)
    async def unavailable(_: Request, exc: Unavailable) -> JSON:
        log.warning("unavailable: %s", exc)
        return _error("unavailable", "a dependency is down; retry later")

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSON:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body") or "request"
        return _error("bad_request", f"{where}: {first.get('msg', 'invalid')}")

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSON:
        code = {404: "not_found", 405: "bad_request", 401: "unauthorized",
                403: "forbidden"}.get(exc.status_code, "bad_request")
        return _error(code, str(exc.detail), exc.status_code)

    @app.exception_handler(Exception)
    async def internal(_: Request, exc: Exception) -> JSON:
        log.error("internal error", exc_info=exc)
        return _error("internal", "internal error")
