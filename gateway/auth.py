"""Tokens: JWT signed HS256 with ``IM_AUTH_SECRET``; ``sub`` is the user id."""

from __future__ import annotations

import time

import jwt

from gateway.errors import ProtocolError
from gateway.protocol import ID_PATTERN

__all__ = ["issue_token", "verify_token", "bearer_token"]

ALGORITHM = "HS256"


def issue_token(secret: str, user: str, ttl_s: int = 86_400) -> str:
    if not ID_PATTERN.fullmatch(user):
        raise ValueError("user id must be 1-64 characters of [A-Za-z0-9_.:-]")
    now = int(time.time())
    return jwt.encode({"sub": user, "iat": now, "exp": now + ttl_s}, secret, ALGORITHM)


def verify_token(secret: str, token: str | None) -> str:
    """Return the user id in a valid token; raise ``unauthorized`` otherwise."""
    if not token:
        raise ProtocolError("unauthorized", "a token is required")
    try:
        claims = jwt.decode(
            token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "sub"]}
        )
    except jwt.ExpiredSignatureError:
        raise ProtocolError("unauthorized", "token expired") from None
    except jwt.PyJWTError:
        raise ProtocolError("unauthorized", "token is invalid") from None
    sub = claims.get("sub")
    if not isinstance(sub, str) or not ID_PATTERN.fullmatch(sub):
        raise ProtocolError("unauthorized", "token subject is not a valid user id")
    return sub


def bearer_token(header: str | None) -> str | None:
    """The token in an ``Authorization: Bearer ...`` header, if any."""
    if header and header[:7].lower() == "bearer ":
        return header[7:].strip() or None
    return None
