"""Errors that reach clients: each carries a protocol code and a safe message."""

from __future__ import annotations

__all__ = ["CODES", "HTTP_STATUS", "ProtocolError"]

CODES = frozenset(
    {
        "bad_request",
        "unauthorized",
        "forbidden",
        "not_found",
        "too_large",
        "rate_limited",
        "unavailable",
        "internal",
    }
)

HTTP_STATUS = {
    "bad_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "too_large": 413,
    "rate_limited": 429,
    "unavailable": 503,
    "internal": 500,
}


class ProtocolError(Exception):
    """A refusal the client is meant to see: ``code`` is one of ``CODES``."""

    def __init__(self, code: str, message: str, re: object = None) -> None:
        assert code in CODES, code
        super().__init__(message)
        self.code = code
        self.message = message
        self.re = re
