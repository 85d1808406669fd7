"""Envelopes between nodes: many pushes in one broker message. Pure.

A record is ``(header, frame)``: ``frame`` is already-encoded client bytes;
the header (a small JSON object, its keys named below) says who gets it:

- ``{USERS: [user, ...]}``: every local device of those users;
- ``{USERS: [...], CONTROL: {...}}``: a control for those users' devices
  (``router.controls``; the frame is empty);
- ``{GROUP: group}``: every local device of the group's members;
- ``{PRESENCE: user}``: every local device watching that user;
- ``{ROOM: room}``, with ``PRIO: 1`` for a must-deliver message and, when
  the room keeps history, ``POS`` and ``EPOCH``: the room's local members.

Layout per record::

    u32 header length | header JSON | u32 frame length | frame

The frame bytes are carried as they are: encoded once by the node that
accepted the message, written unchanged by the node that holds the socket.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

__all__ = ["CONTROL", "EPOCH", "GROUP", "POS", "PRESENCE", "PRIO", "ROOM", "USERS",
           "EnvelopeError", "Record", "decode", "encode"]

# The header's keys: short, since every record of every envelope carries them.
USERS = "u"  # list of user ids
CONTROL = "c"  # a control (router.controls' wire form) for USERS' devices
GROUP = "g"  # a group id
PRESENCE = "pr"  # the user whose presence changed
ROOM = "r"  # a room id
PRIO = "p"  # 1: a must-deliver room message (absent: normal)
POS = "n"  # a room message's position
EPOCH = "e"  # the epoch its position belongs to

_LEN = struct.Struct(">I")
Record = tuple[dict[str, Any], bytes]


class EnvelopeError(ValueError):
    """A malformed envelope (never produced by a node of this version)."""


def encode(records: Sequence[Record]) -> bytes:
    parts: list[bytes] = []
    for head, frame in records:
        header = orjson.dumps(head)
        parts += (_LEN.pack(len(header)), header, _LEN.pack(len(frame)), frame)
    return b"".join(parts)


def decode(data: bytes) -> Iterator[tuple[dict[str, Any], bytes]]:
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos < end:
        header, pos = _chunk(view, pos, end)
        frame, pos = _chunk(view, pos, end)
        try:
            head = orjson.loads(header)
        except orjson.JSONDecodeError:
            raise EnvelopeError("bad record header") from None
        if not isinstance(head, dict):
            raise EnvelopeError("record header is not an object")
        yield head, bytes(frame)


def _chunk(view: memoryview, pos: int, end: int) -> tuple[memoryview, int]:
    if pos + 4 > end:
        raise EnvelopeError("truncated length")
    (n,) = _LEN.unpack_from(view, pos)
    pos += 4
    if pos + n > end:
        raise EnvelopeError("truncated record")
    return view[pos:pos + n], pos + n
