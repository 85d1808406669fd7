"""Tokens as the node expects them: JWT, HS256, ``sub`` = user id (docs/protocol.md)."""

from __future__ import annotations

import time

import jwt

__all__ = ["issue_token"]


def issue_token(secret: str, user: str, ttl_s: int = 3600) -> str:
    """A token for ``user`` signed with ``secret``, valid ``ttl_s`` seconds."""
    now = int(time.time())
    return jwt.encode({"sub": user, "iat": now, "exp": now + ttl_s}, secret, "HS256")
