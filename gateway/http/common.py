"""What every module of user routes shares: the caller, the JSON answer, the
query and path types, and the error statuses each kind of call documents.

``gateway.http.api`` builds the app and installs the route modules
(``gateway.http.feed``, ...); they import these from here, not from it, so
no route module imports the app's builder (no cycle).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Depends, Path, Query, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from core.ids import MAX_MID
from gateway.auth import check_user_id
from gateway.errors import ProtocolError
from gateway.http.guard import USER_KEY
from gateway.http.models import UserId, errors

__all__ = ["JSON", "MAX_LIMIT", "READ", "WRITE", "Cursor", "Limit", "PostId", "User",
           "UserCursor", "UserList", "bearer", "current_user", "ok", "user_list"]

MAX_LIMIT = 200
# Comma-separated user ids in a query: percent-encoded, up to three times this
# must fit the HTTP server's 16 KB request head.
UserList = Annotated[str, Query(min_length=1, max_length=5000)]

Limit = Annotated[int, Query(ge=1, le=MAX_LIMIT)]
PostId = Annotated[int, Path(ge=0, le=MAX_MID)]
Cursor = Annotated[int | None, Query(ge=0, le=MAX_MID)]
UserCursor = Annotated[UserId | None, Query()]

# Error statuses each kind of call can answer (documented in /openapi.json).
READ = errors(400, 401, 429, 500, 503)
WRITE = errors(400, 401, 413, 429, 500, 503)

bearer = HTTPBearer(auto_error=False, bearerFormat="JWT",
                    description="a JWT (HS256) whose `sub` is the user id")


def current_user(request: Request,
                 _: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]) -> str:
    """The caller: ``HttpGuard`` checked the token before the body was read."""
    user = request.scope.get(USER_KEY)
    if not isinstance(user, str):
        raise ProtocolError("unauthorized", "a token is required")
    return user


User = Annotated[str, Depends(current_user)]


class JSON(JSONResponse):
    """orjson-encoded body: stored message bytes pass through as ``orjson.Fragment``.
    (A ``JSONResponse`` so that FastAPI documents each route's answer model.)"""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def ok() -> JSON:
    return JSON({"ok": True})


def user_list(raw: str, most: int) -> list[str]:
    """The distinct user ids of a comma-separated ``users`` query, 1 to ``most``."""
    names = list(dict.fromkeys(u for u in raw.split(",") if u))
    if not names or len(names) > most:
        raise ProtocolError("bad_request", f"users: 1-{most} user ids")
    for u in names:
        if why := check_user_id(u):
            raise ProtocolError("bad_request", f"users: {why}")
    return names
