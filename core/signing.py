"""The signature of what a node or the webhook relay POSTs to the product's
backend (hooks, events), pure: ``X-Imgate-Signature`` is ``sha256=`` + hex
HMAC-SHA256(secret, ``"{timestamp}."`` + raw body), ``X-Imgate-Timestamp``
the unix seconds of the attempt. A receiver recomputes it over the raw body,
compares in constant time and refuses a timestamp far from its own clock."""

from __future__ import annotations

import hashlib
import hmac
import time

__all__ = ["sign", "verify"]


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """``X-Imgate-Signature`` of ``body`` sent at ``timestamp`` (unix seconds)."""
    return "sha256=" + hmac.new(secret, f"{timestamp}.".encode() + body,
                                hashlib.sha256).hexdigest()


def verify(secret: bytes, timestamp: str, body: bytes, signature: str, *,
           tolerance_s: float = 300, now: float | None = None) -> bool:
    """A receiver's check: the signature matches and the timestamp is recent."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)
