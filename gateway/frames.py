"""Every frame the server sends a client (docs/protocol.md), built here. Pure.

One constructor per frame: replies (``ack``, ``ok``, ``error``, ``pong``,
``joined``, ``left``, ``presence``), pushes (``msg`` / ``group_msg`` from
store records, ``typing``, ``read``, ``receipt``, ``recalled``, ``edited``, ``reaction``,
``conv_settings``,
``group_event``, ``feed``, ``notice``, ``room_gap``, ``reconnect``). Each returns the
encoded bytes, built once and written unchanged to every socket that gets
them; a reply without a request id carries no ``re``. ``room_msgs`` is the
one frame built elsewhere: ``gateway.rooms.coalesce`` joins a window's
already-encoded messages into it byte by byte (the room fan-out's hot path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from core.ids import mid_time_ms
from gateway.errors import ProtocolError
from store.records import ChatMessage, GroupMessage, StoredMessage

__all__ = ["ack", "body_value", "conv_settings", "edited", "encode", "encode_group", "error",
           "feed", "frame_of", "group_event", "group_frame", "joined", "left", "msg_frame",
           "notice", "ok", "pong", "presence", "reaction", "read", "receipt", "recalled",
           "reconnect", "room_gap", "tombstone", "typing"]


def body_value(body: Any) -> Any:
    """A stored body as a frame carries it: encoded JSON bytes go in as they are
    (``orjson.Fragment``); a body stored as a document (older messages) as is."""
    return orjson.Fragment(body) if isinstance(body, bytes) else body


def msg_frame(m: ChatMessage, reader: str | None = None) -> dict[str, Any]:
    """The ``msg`` push / sync entry; a recalled one is a tombstone without body,
    with ``conv`` as ``reader`` names the conversation."""
    if m.recalled:
        return tombstone(m, m.to if reader == m.sender else m.sender)
    frame = {"op": "msg", "mid": m.mid, "from": m.sender, "to": m.to, "body": body_value(m.body)}
    return _tail(frame, m.reply_to, m.mid, m.edited)


def _tail(frame: dict[str, Any], reply_to: int, mid: int, edited: int) -> dict[str, Any]:
    """A message frame's last fields: ``reply_to`` (when it answers one), ``ts``,
    ``edited`` (when it was)."""
    if reply_to:
        frame["reply_to"] = reply_to
    frame["ts"] = mid_time_ms(mid)
    if edited:
        frame["edited"] = edited
    return frame


PREVIEW_MAX = 512  # bytes of a conversation's last message kept as it is
PREVIEW_CHARS = 200  # characters of a text body kept in a cut preview


def preview(m: ChatMessage, frame: bytes) -> bytes:
    """A conversation's last message as the conversation list shows it: the
    ``msg`` frame itself up to ``PREVIEW_MAX`` bytes, else the frame with its
    body cut (a string, or an object's ``text``, to ``PREVIEW_CHARS``
    characters; any other body left out) and ``"truncated": true``."""
    if len(frame) <= PREVIEW_MAX:
        return frame
    body = orjson.loads(m.body) if isinstance(m.body, bytes) else m.body
    if isinstance(body, str):
        cut: Any = body[:PREVIEW_CHARS]
    elif isinstance(body, dict) and isinstance(body.get("text"), str):
        cut = {"text": body["text"][:PREVIEW_CHARS]}
    else:
        cut = None
    return orjson.dumps({**msg_frame(m), "body": cut, "truncated": True})


def conversation_last(m: ChatMessage, reader: str) -> bytes:
    """What ``reader``'s conversation list keeps as its last message ``m`` (as
    the send path and a recall leave it): its preview, or its tombstone."""
    return preview(m, encode(msg_frame(m, reader)))


def tombstone(m: ChatMessage, conv: str) -> dict[str, Any]:
    return {"op": "msg", "mid": m.mid, "conv": conv, "from": m.sender, "to": m.to,
            "ts": mid_time_ms(m.mid), "recalled": True}


def group_frame(m: GroupMessage) -> dict[str, Any]:
    """The ``group_msg`` push / sync entry; a recalled one without body."""
    if m.recalled:
        return {"op": "group_msg", "mid": m.mid, "seq": m.seq, "group": m.group,
                "conv": f"g:{m.group}", "from": m.sender, "ts": mid_time_ms(m.mid),
                "recalled": True}
    frame = {"op": "group_msg", "mid": m.mid, "seq": m.seq, "group": m.group,
             "from": m.sender, "body": body_value(m.body)}
    return _tail(frame, m.reply_to, m.mid, m.edited)


def frame_of(m: StoredMessage, reader: str | None = None) -> dict[str, Any]:
    return group_frame(m) if isinstance(m, GroupMessage) else msg_frame(m, reader)


def encode_group(m: GroupMessage) -> bytes:
    """A group message encoded once: pushed, kept as the group's ``last``, and
    written to write-diffused members' offline stores, the same bytes."""
    return encode(group_frame(m))


def encode(frame: dict[str, Any]) -> bytes:
    """Encode a server frame once; the bytes are what every socket gets."""
    return orjson.dumps(frame)


def _reply(op: str, re: object, fields: Mapping[str, Any]) -> bytes:
    """``{"op", "re" (when known), **fields}``: ``re`` names the request answered."""
    frame: dict[str, Any] = {"op": op}
    if re is not None:
        frame["re"] = re
    frame.update(fields)
    return orjson.dumps(frame)


# -- replies -------------------------------------------------------------------------------------
def ack(re: object, cmid: str, mid: int, ts: int, seq: int | None = None) -> bytes:
    """A send (``seq`` None) or group send (its ``seq``) was stored."""
    if seq is None:
        return _reply("ack", re, {"cmid": cmid, "mid": mid, "ts": ts})
    return _reply("ack", re, {"cmid": cmid, "mid": mid, "seq": seq, "ts": ts})


_OK = b'{"op":"ok"}'


def ok(re: object = None) -> bytes:
    return _OK if re is None else orjson.dumps({"op": "ok", "re": re})


def error(err: ProtocolError) -> bytes:
    """A refusal: its protocol code and safe message (``re`` when known)."""
    frame: dict[str, Any] = {"op": "error", "code": err.code, "message": err.message}
    if err.re is not None:
        frame["re"] = err.re
    return orjson.dumps(frame)


def pong(re: object = None) -> bytes:
    return _reply("pong", re, {})


def joined(re: object, room: str, fields: Mapping[str, Any]) -> bytes:
    """A join's answer: ``online``, ``users``, and with history kept ``epoch``,
    ``pos``, ``msgs`` and ``recovered``."""
    return _reply("joined", re, {"room": room, **fields})


def left(room: str, re: object = None, reason: str | None = None) -> bytes:
    """A leave's answer, or (``reason`` "kicked") the server took the device out."""
    return _reply("left", re, {"room": room} if reason is None
                  else {"room": room, "reason": reason})


def presence(users: Mapping[str, Any], re: object = None) -> bytes:
    """Users' ``{"online", "last_seen"}``: a ``presence_sub`` answer or a change."""
    return _reply("presence", re, {"users": users})


# -- pushes --------------------------------------------------------------------------------------
def typing(conv: str, sender: str) -> bytes:
    return orjson.dumps({"op": "typing", "conv": conv, "from": sender})


def read(conv: str, mid: int, unread: int) -> bytes:
    """To the reader's other devices: read up to ``mid``, ``unread`` left."""
    return orjson.dumps({"op": "read", "conv": conv, "mid": mid, "unread": unread})


def receipt(conv: str, mid: int) -> bytes:
    """To a 1:1 peer: ``conv`` read its messages up to ``mid``."""
    return orjson.dumps({"op": "receipt", "conv": conv, "mid": mid})


def recalled(mid: int, conv: str, by: str) -> bytes:
    return orjson.dumps({"op": "recalled", "mid": mid, "conv": conv, "by": by})


def edited(mid: int, conv: str, body: bytes, at_ms: int) -> bytes:
    """A message's new body (``body``: encoded JSON), edited at ``at_ms``."""
    return orjson.dumps({"op": "edited", "mid": mid, "conv": conv,
                         "body": orjson.Fragment(body), "edited": at_ms})


def reaction(mid: int, conv: str, user: str, emoji: str, on: bool) -> bytes:
    """``user`` added (``on``) or removed its ``emoji`` on message ``mid``."""
    return orjson.dumps({"op": "reaction", "mid": mid, "conv": conv, "from": user,
                         "emoji": emoji, "on": on})


def conv_settings(conv: str, settings: Mapping[str, bool]) -> bytes:
    """To the user's devices: its settings of ``conv`` (muted, pinned, archived)."""
    return orjson.dumps({"op": "conv_settings", "conv": conv, **settings})


def group_event(group: str, event: str, users: Sequence[str], by: str) -> bytes:
    """A membership change of ``group`` (joined, left, removed, ...)."""
    return orjson.dumps({"op": "group_event", "group": group, "event": event,
                         "users": list(users), "by": by})


def feed(post: Any, author: str, ts: Any) -> bytes:
    """The optional push of a new post to its author's followers online."""
    return orjson.dumps({"op": "feed", "post": post, "author": author, "ts": ts})


def notice(body: bytes, ts_ms: int) -> bytes:
    """The server API's ``notice``: ``body`` is already-encoded JSON; not stored."""
    return b'{"op":"notice","body":' + body + b',"ts":' + str(ts_ms).encode() + b"}"


def room_gap(room: str, epoch: str, after: int) -> bytes:
    """Room messages after ``after`` may be missing here and are no longer kept
    (or could not be read): rejoin with ``since`` to get what is kept."""
    return orjson.dumps({"op": "room_gap", "room": room, "epoch": epoch, "after": after})


def reconnect() -> bytes:
    """The node is draining: connect again (to another node)."""
    return b'{"op":"reconnect"}'
