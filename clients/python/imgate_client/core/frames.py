"""Frames, request ids, cmids, tokens and close codes: pure helpers, no I/O.

A frame is one JSON object (docs/protocol.md, "WebSocket"): a client frame has
``op`` and maybe ``id``; a reply carries ``re`` = that id; anything without
``re`` is a push.
"""

from __future__ import annotations

import base64
import binascii
import itertools
import os
import re
from typing import Any
from urllib.parse import quote

import orjson

__all__ = [
    "CLOSE_GOING_AWAY", "CLOSE_NORMAL", "CLOSE_STOPPED", "CLOSE_TOKEN_EXPIRED", "Frame",
    "MESSAGE_OPS", "MESSAGE_UPDATE_OPS", "RequestIds", "decode", "encode", "error_of", "is_id",
    "make", "new_cmid", "token_claims", "token_expiry", "token_user", "with_token",
]

Frame = dict[str, Any]

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001  # a node draining: move on to another
CLOSE_TOKEN_EXPIRED = 4001  # refresh the token, then reconnect
CLOSE_STOPPED = 4003  # the product's backend closed it (disconnect, ban, revoke): stop
CLOSE_REPLACED = 4005  # a newer connection took this device's slot (login policy): stop

MESSAGE_OPS = frozenset({"msg", "group_msg"})  # stored messages: they have a mid, sync has them
# Pushes about a stored message (its ``mid``): held with the messages during a sync, so
# one never comes before the message it is about.
MESSAGE_UPDATE_OPS = frozenset({"recalled", "edited", "reaction"})

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def encode(frame: Frame) -> bytes:
    """One frame as JSON bytes (send them as a text frame)."""
    return orjson.dumps(frame)


def decode(data: str | bytes) -> Frame:
    """One frame from JSON text; ValueError unless it is a JSON object."""
    frame = orjson.loads(data)
    if not isinstance(frame, dict):
        raise ValueError("a frame must be a JSON object")
    return frame


def with_token(url: str, token: str | None) -> str:
    """``url`` (or a request target such as ``/ws``) with ``token`` as its ``token``
    query parameter (the node also takes ``Authorization: Bearer``)."""
    if not token:
        return url
    return f"{url}{'&' if '?' in url else '?'}token={quote(token, safe='')}"


def make(op: str, rid: str | int | None = None, **fields: Any) -> Frame:
    """``{"op": op, "id": rid, **fields}`` (no ``id`` when ``rid`` is None)."""
    frame: Frame = {"op": op}
    if rid is not None:
        frame["id"] = rid
    frame.update(fields)
    return frame


def error_of(frame: Frame) -> tuple[str, str] | None:
    """``(code, message)`` of an ``error`` frame, else None."""
    if frame.get("op") != "error":
        return None
    return str(frame.get("code")), str(frame.get("message", ""))


def is_id(value: object) -> bool:
    """A valid user, room, group or cmid id (1-64 of ``[A-Za-z0-9_.:-]``)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


class RequestIds:
    """Fresh request ids: ``<prefix>1``, ``<prefix>2``, ... (strings of at most 64
    characters, as the protocol allows)."""

    def __init__(self, prefix: str = "r") -> None:
        self.prefix = prefix
        self._n = itertools.count(1)

    def next(self) -> str:
        return f"{self.prefix}{next(self._n)}"


_cmid_prefix = os.urandom(6).hex()
_cmid_n = itertools.count(1)


def new_cmid() -> str:
    """A client message id unique to this process and run (48 random bits and a
    counter), within the protocol's 64 characters of ``[A-Za-z0-9_.:-]``."""
    return f"{_cmid_prefix}-{next(_cmid_n):x}"


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, read without checking its signature (the client only
    wants ``sub`` and ``exp``; the node verifies). Empty if it cannot be read."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = orjson.loads(base64.urlsafe_b64decode(payload))
    except (ValueError, binascii.Error):
        return {}
    return claims if isinstance(claims, dict) else {}


def token_expiry(token: str) -> float | None:
    """The token's ``exp`` (unix seconds), if it has a numeric one."""
    exp = token_claims(token).get("exp")
    return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None


def token_user(token: str) -> str | None:
    """The token's ``sub``: the user it speaks for."""
    sub = token_claims(token).get("sub")
    return sub if isinstance(sub, str) else None
