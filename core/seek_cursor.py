"""Opaque seek cursors: where the next page of a list starts, handed to the
client and back unchanged. Pure.

A cursor is the unpadded base64url of the seek key followed by an 8-byte
BLAKE2b digest of the list's scope (e.g. ``friends:USER``) and the key. The
digest is a checksum, not a secret: it refuses a cursor that was altered,
cut short, or taken from another list (the caller answers 400), and the
canonical-form check refuses the spellings base64 would otherwise let
through (stray trailing bits). It is unkeyed because nothing depends on a
cursor's secrecy: the lists it pages are readable by every user, so a forged
one can only name a seek position, and callers still validate the key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re

__all__ = ["MAX_CURSOR", "BadCursor", "decode_cursor", "encode_cursor"]

DIGEST = 8
MAX_CURSOR = 128  # characters: a 64-character id and the digest fit
_PERSON = b"imgate.cursor"  # BLAKE2b personalisation: these digests only
_B64URL = re.compile(r"[A-Za-z0-9_-]+")


class BadCursor(ValueError):
    """Not a cursor this list handed out."""


def encode_cursor(scope: str, key: str) -> str:
    raw = key.encode()
    return _b64(raw + _digest(scope, raw))


def decode_cursor(scope: str, cursor: str) -> str:
    """The seek key ``cursor`` carries, if ``encode_cursor(scope, key)`` made it."""
    if len(cursor) > MAX_CURSOR or not _B64URL.fullmatch(cursor):
        raise BadCursor("not a cursor")
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
    except (binascii.Error, ValueError) as exc:
        raise BadCursor("not a cursor") from exc
    key, digest = raw[:-DIGEST], raw[-DIGEST:]
    if (len(raw) <= DIGEST or _b64(raw) != cursor
            or not hmac.compare_digest(digest, _digest(scope, key))):
        raise BadCursor("not a cursor of this list")
    try:
        return key.decode()
    except UnicodeDecodeError as exc:  # only a forged digest gets here
        raise BadCursor("not a cursor") from exc


def _digest(scope: str, key: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=DIGEST, person=_PERSON)
    h.update(scope.encode())
    h.update(b"\0")  # scope "a" + key "b:c" never equals scope "a:b" + key "c"
    h.update(key)
    return h.digest()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
