"""Client frames built from store records (docs/protocol.md): the one place a
stored message becomes the ``msg`` / ``group_msg`` a client sees. Pure."""

from __future__ import annotations

from typing import Any

import orjson

from core.ids import mid_time_ms
from gateway.protocol import encode
from store.records import ChatMessage, GroupMessage, StoredMessage

__all__ = ["body_value", "encode_group", "frame_of", "group_frame", "msg_frame", "tombstone"]


def body_value(body: Any) -> Any:
    """A stored body as a frame carries it: encoded JSON bytes go in as they are
    (``orjson.Fragment``); a body stored as a document (older messages) as is."""
    return orjson.Fragment(body) if isinstance(body, bytes) else body


def msg_frame(m: ChatMessage, reader: str | None = None) -> dict[str, Any]:
    """The ``msg`` push / sync entry; a recalled one is a tombstone without body,
    with ``conv`` as ``reader`` names the conversation."""
    if m.recalled:
        return tombstone(m, m.to if reader == m.sender else m.sender)
    return {"op": "msg", "mid": m.mid, "from": m.sender, "to": m.to, "body": body_value(m.body),
            "ts": mid_time_ms(m.mid)}


def tombstone(m: ChatMessage, conv: str) -> dict[str, Any]:
    return {"op": "msg", "mid": m.mid, "conv": conv, "from": m.sender, "to": m.to,
            "ts": mid_time_ms(m.mid), "recalled": True}


def group_frame(m: GroupMessage) -> dict[str, Any]:
    """The ``group_msg`` push / sync entry; a recalled one without body."""
    if m.recalled:
        return {"op": "group_msg", "mid": m.mid, "seq": m.seq, "group": m.group,
                "conv": f"g:{m.group}", "from": m.sender, "ts": mid_time_ms(m.mid),
                "recalled": True}
    return {"op": "group_msg", "mid": m.mid, "seq": m.seq, "group": m.group,
            "from": m.sender, "body": body_value(m.body), "ts": mid_time_ms(m.mid)}


def frame_of(m: StoredMessage, reader: str | None = None) -> dict[str, Any]:
    return group_frame(m) if isinstance(m, GroupMessage) else msg_frame(m, reader)


def encode_group(m: GroupMessage) -> bytes:
    """A group message encoded once: pushed, kept as the group's ``last``, and
    written to write-diffused members' offline stores, the same bytes."""
    return encode(group_frame(m))
