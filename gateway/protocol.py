"""The client protocol codec: parse and validate frames, encode replies.

Pure functions, no I/O. A frame is one JSON object with ``op``; anything
that does not fit the contract (docs/protocol.md) raises ``ProtocolError``
with the request id when one could be read, so the reply can carry ``re``.
Ids are checked against one pattern before they are used in a key or query.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from core.ids import MAX_MID
from gateway.errors import ProtocolError

__all__ = [
    "ID_PATTERN",
    "OPS",
    "Frame",
    "Op",
    "PresenceSub",
    "Recall",
    "Edit",
    "React",
    "check_emoji",
    "check_reply_to",
    "Typing",
    "parse",
    "GroupSend",
    "Join",
    "Leave",
    "Ping",
    "Refresh",
    "encode_body",
    "Read",
    "RecvAck",
    "RoomSend",
    "Send",
    "check_id",
    "check_mid",
    "parse_frame",
]

ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
MAX_RECV_ACK = 1000


@dataclass(frozen=True, slots=True)
class Send:
    id: object
    to: str
    cmid: str
    body: bytes  # encoded JSON
    reply_to: int = 0  # a mid of the same conversation (0: none)


@dataclass(frozen=True, slots=True)
class GroupSend:
    id: object
    group: str
    cmid: str
    body: bytes  # encoded JSON
    reply_to: int = 0


@dataclass(frozen=True, slots=True)
class Edit:
    id: object
    mid: int
    body: bytes  # encoded JSON


@dataclass(frozen=True, slots=True)
class React:
    id: object
    mid: int
    emoji: str
    on: bool


@dataclass(frozen=True, slots=True)
class Join:
    id: object
    room: str
    history: int = 0  # the room's last N messages in the reply
    since: tuple[str, int] | None = None  # (epoch, pos): what followed it, and recovered


@dataclass(frozen=True, slots=True)
class Leave:
    id: object
    room: str


@dataclass(frozen=True, slots=True)
class RoomSend:
    id: object
    room: str
    body: bytes  # encoded JSON
    prio: int


@dataclass(frozen=True, slots=True)
class RecvAck:
    id: object
    mids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Read:
    id: object
    conv: str
    mid: int


@dataclass(frozen=True, slots=True)
class Ping:
    id: object


@dataclass(frozen=True, slots=True)
class Refresh:
    id: object
    token: str


@dataclass(frozen=True, slots=True)
class Recall:
    id: object
    mid: int


@dataclass(frozen=True, slots=True)
class Typing:
    id: object
    conv: str  # a peer, or g:GROUP


@dataclass(frozen=True, slots=True)
class PresenceSub:
    id: object
    users: tuple[str, ...]
    watch: bool  # presence_sub; False: presence_unsub


MAX_TOKEN = 8192  # characters of a token in a refresh frame
MAX_PRESENCE_USERS = 500  # users of one presence_sub / presence_unsub
MAX_ROOM_HISTORY = 100  # messages a join may ask for
Frame = (Send | GroupSend | Join | Leave | RoomSend | RecvAck | Read | Ping | Refresh | Recall
         | Typing | PresenceSub | Edit | React)
MAX_EMOJI = 32  # characters of a reaction's emoji


def check_id(value: object, field: str, re_: object = None) -> str:
    """Return ``value`` if it is a valid user/room/group id, else refuse it."""
    if isinstance(value, str) and ID_PATTERN.fullmatch(value):
        return value
    raise ProtocolError(
        "bad_request", f"{field} must be 1-64 characters of [A-Za-z0-9_.:-]", re_
    )


def check_mid(value: object, field: str, re_: object = None) -> int:
    """Return ``value`` if it is an integer mid in 0..2**53-1, else refuse it."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MID:
        return value
    raise ProtocolError("bad_request", f"{field} must be an integer in 0..{MAX_MID}", re_)


def _request_id(obj: dict[str, Any]) -> object:
    rid = obj.get("id")
    if rid is None:
        return None
    if isinstance(rid, bool) or not isinstance(rid, (str, int)):
        raise ProtocolError("bad_request", "id must be a string or an integer")
    if isinstance(rid, str) and len(rid) > 64:
        raise ProtocolError("bad_request", "id must be at most 64 characters")
    return rid


def _body(obj: dict[str, Any], max_body: int, rid: object) -> bytes:
    """The body as encoded JSON bytes: it is carried, stored and returned as
    these bytes, never re-encoded, so any JSON the codec reads can be stored
    (a store's own document format, e.g. BSON's 8-byte integers or its rule
    against NUL in keys, never sees the body's structure)."""
    if "body" not in obj:
        raise ProtocolError("bad_request", "body is required", rid)
    try:
        raw = orjson.dumps(obj["body"])
    except orjson.JSONEncodeError:  # e.g. an integer beyond 64 bits
        raise ProtocolError("bad_request", "body is not encodable JSON", rid) from None
    if len(raw) > max_body:
        raise ProtocolError("too_large", f"body is {len(raw)} bytes; the limit is {max_body}",
                            rid)
    return raw


def encode_body(value: Any, max_body: int) -> bytes:
    """A body given outside a frame (the server API) as the bytes a frame's is."""
    return _body({"body": value}, max_body, None)


def check_reply_to(value: object, re_: object = None) -> int:
    """An optional ``reply_to``: absent or null is 0 (none), else a mid above 0."""
    if value is None:
        return 0
    mid = check_mid(value, "reply_to", re_)
    if mid == 0:
        raise ProtocolError("bad_request", "reply_to must be the mid of a message", re_)
    return mid


def check_emoji(value: object, re_: object = None) -> str:
    """A reaction: 1-32 characters, none of them a control character."""
    if isinstance(value, str) and 0 < len(value) <= MAX_EMOJI and value.isprintable() \
            and _encodable(value):
        return value
    raise ProtocolError("bad_request", f"emoji must be 1-{MAX_EMOJI} printable characters",
                        re_)


def _parse_send(obj: dict[str, Any], rid: object, max_body: int) -> Send:
    to = check_id(obj.get("to"), "to", rid)
    cmid = check_id(obj.get("cmid"), "cmid", rid)
    return Send(rid, to, cmid, _body(obj, max_body, rid), check_reply_to(obj.get("reply_to"), rid))


def _parse_group_send(obj: dict[str, Any], rid: object, max_body: int) -> GroupSend:
    group = check_id(obj.get("group"), "group", rid)
    cmid = check_id(obj.get("cmid"), "cmid", rid)
    return GroupSend(rid, group, cmid, _body(obj, max_body, rid),
                     check_reply_to(obj.get("reply_to"), rid))


def _parse_edit(obj: dict[str, Any], rid: object, max_body: int) -> Edit:
    return Edit(rid, check_mid(obj.get("mid"), "mid", rid), _body(obj, max_body, rid))


def _parse_react(obj: dict[str, Any], rid: object, max_body: int) -> React:
    on = obj.get("on", True)
    if not isinstance(on, bool):
        raise ProtocolError("bad_request", "on must be true or false", rid)
    return React(rid, check_mid(obj.get("mid"), "mid", rid),
                 check_emoji(obj.get("emoji"), rid), on)


def _parse_room_send(obj: dict[str, Any], rid: object, max_body: int) -> RoomSend:
    room = check_id(obj.get("room"), "room", rid)
    prio = obj.get("prio", 0)
    if prio not in (0, 1) or isinstance(prio, bool):
        raise ProtocolError("bad_request", "prio must be 0 or 1", rid)
    return RoomSend(rid, room, _body(obj, max_body, rid), int(prio))


def _parse_join(obj: dict[str, Any], rid: object, max_body: int) -> Join:
    room = check_id(obj.get("room"), "room", rid)
    history = obj.get("history", 0)
    if not isinstance(history, int) or isinstance(history, bool) \
            or not 0 <= history <= MAX_ROOM_HISTORY:
        raise ProtocolError("bad_request", f"history must be an integer in 0..{MAX_ROOM_HISTORY}",
                            rid)
    since = obj.get("since")
    if since is None:
        return Join(rid, room, history)
    epoch = since.get("epoch") if isinstance(since, dict) else None
    pos = since.get("pos") if isinstance(since, dict) else None
    if not isinstance(epoch, str) or not 0 < len(epoch) <= 64 or not isinstance(pos, int) \
            or isinstance(pos, bool) or not 0 <= pos <= MAX_MID:
        raise ProtocolError("bad_request", 'since must be {"epoch": string of 1-64 characters, '
                            f'"pos": integer in 0..{MAX_MID}}}', rid)
    return Join(rid, room, history, (epoch, pos))


def _parse_recv_ack(obj: dict[str, Any], rid: object, max_body: int) -> RecvAck:
    mids = obj.get("mids")
    if not isinstance(mids, list) or not mids or len(mids) > MAX_RECV_ACK:
        raise ProtocolError("bad_request", f"mids must be a list of 1..{MAX_RECV_ACK} mids", rid)
    return RecvAck(rid, tuple(check_mid(m, "mids[]", rid) for m in mids))


def _parse_read(obj: dict[str, Any], rid: object, max_body: int) -> Read:
    conv = check_id(obj.get("conv"), "conv", rid)
    return Read(rid, conv, check_mid(obj.get("mid"), "mid", rid))


def _reject_constant(name: str) -> None:
    raise ValueError(name)


def _undecodable(data: str | bytes) -> ProtocolError:
    """The error for a frame orjson refused. When the stdlib parser can still read
    it (JSON text with a lone surrogate escape such as ``"\\ud800"``: valid by
    the grammar, not storable as text; or a number orjson cannot hold) the error
    says which and names the request when its id is one a reply can carry.
    Error path only; the frame is at most ``max_frame`` bytes."""
    plain = ProtocolError("bad_request", "frame is not valid JSON")
    try:
        obj = json.loads(data, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return plain
    if not isinstance(obj, dict):
        return plain
    rid = _replyable_id(obj)
    if _has_lone_surrogate(obj):
        return ProtocolError("bad_request", "frame holds a lone surrogate escape "
                             "(\\ud800-\\udfff not in a pair): not valid Unicode text", rid)
    return ProtocolError("bad_request", "frame holds a number out of range "
                         "(integers -2**63..2**64-1, finite floats)", rid)


def _replyable_id(obj: dict[str, Any]) -> object:
    """The frame's id if ``_request_id`` takes it and orjson can write it back
    (the stdlib parser reads integers of any size and lone surrogates); else None."""
    try:
        rid = _request_id(obj)
    except ProtocolError:
        return None
    if isinstance(rid, int) and not -(1 << 63) <= rid < (1 << 64):
        return None
    if isinstance(rid, str) and not _encodable(rid):
        return None
    return rid


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _has_lone_surrogate(value: object) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if not _encodable(v):
                return True
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _parse_leave(obj: dict[str, Any], rid: object, max_body: int) -> Leave:
    return Leave(rid, check_id(obj.get("room"), "room", rid))


def _parse_recall(obj: dict[str, Any], rid: object, max_body: int) -> Recall:
    return Recall(rid, check_mid(obj.get("mid"), "mid", rid))


def _parse_typing(obj: dict[str, Any], rid: object, max_body: int) -> Typing:
    return Typing(rid, check_id(obj.get("conv"), "conv", rid))


def _parse_ping(obj: dict[str, Any], rid: object, max_body: int) -> Ping:
    return Ping(rid)


def _parse_presence(watch: bool) -> Parser:
    def parse(obj: dict[str, Any], rid: object, max_body: int) -> PresenceSub:
        users = obj.get("users")
        if not isinstance(users, list) or not 0 < len(users) <= MAX_PRESENCE_USERS:
            raise ProtocolError("bad_request", f"users must be a list of 1-{MAX_PRESENCE_USERS}"
                                " user ids", rid)
        return PresenceSub(rid, tuple(check_id(u, "users", rid) for u in users), watch)

    return parse


def _parse_refresh(obj: dict[str, Any], rid: object, max_body: int) -> Refresh:
    token = obj.get("token")
    if not isinstance(token, str) or not 0 < len(token) <= MAX_TOKEN:
        raise ProtocolError("bad_request", f"token must be a string of 1-{MAX_TOKEN} "
                            "characters", rid)
    return Refresh(rid, token)


PRESENCE_USERS_PER_TOKEN = 10  # one presence_sub of 500 users costs 51 op tokens


def _presence_cost(frame: Frame) -> float:
    """One op token, and one more per ``PRESENCE_USERS_PER_TOKEN`` users."""
    assert isinstance(frame, PresenceSub)
    return 1 + len(frame.users) // PRESENCE_USERS_PER_TOKEN


def _recv_ack_cost(frame: Frame) -> float:
    """One op token, and one more per ``RECV_ACK_MIDS_PER_TOKEN`` mids."""
    assert isinstance(frame, RecvAck)
    return 1 + len(frame.mids) // RECV_ACK_MIDS_PER_TOKEN


Parser = Callable[[dict[str, Any], object, int], Frame]  # (frame object, request id, max body)


@dataclass(frozen=True, slots=True)
class Op:
    """One client op, as the parser, the session core and the session see it.

    - ``parse``: validates the frame object into a frame (``ProtocolError``
      otherwise).
    - ``run``: ``task``: the session runs its handler as a task (at most
      ``IM_MAX_INFLIGHT`` per connection; the reader waits beyond);
      ``now``: its handler runs at once, with no task (``room_send``: no
      task per message); ``core``: the session core answers it (``ping``).
    - ``budget``: every frame spends op tokens (``cost``, 1 by default);
      ``send`` ops also spend from the connection's send budget.

    The session serves op ``name`` with its method ``op_<name>``; a row
    without one fails the node at start (and a unit test).
    """

    name: str
    parse: Parser
    run: Literal["task", "now", "core"] = "task"
    budget: Literal["op", "send"] = "op"
    cost: Callable[[Frame], float] | None = None


RECV_ACK_MIDS_PER_TOKEN = 10  # one recv_ack of 1,000 mids costs 101 op tokens
# Ops that read the store each time cost more op tokens than a ping: a read
# mark (a point read of the message, a write of the mark), a recall.
STORE_OP_COST = 5.0


def _store_cost(_frame: Frame) -> float:
    return STORE_OP_COST

# The client ops (docs/protocol.md). Adding an op: a frame class above, a row
# here, and the session's ``op_<name>`` handler.
OPS: dict[str, Op] = {op.name: op for op in (
    Op("send", _parse_send, budget="send"),
    Op("group_send", _parse_group_send, budget="send"),
    Op("recv_ack", _parse_recv_ack, cost=_recv_ack_cost),
    Op("read", _parse_read, cost=_store_cost),
    Op("ping", _parse_ping, run="core"),
    Op("join", _parse_join),
    Op("leave", _parse_leave),
    Op("room_send", _parse_room_send, run="now"),
    Op("recall", _parse_recall, cost=_store_cost),
    Op("edit", _parse_edit, cost=_store_cost),
    Op("react", _parse_react, cost=_store_cost),
    Op("typing", _parse_typing),
    Op("presence_sub", _parse_presence(True), cost=_presence_cost),
    Op("presence_unsub", _parse_presence(False), cost=_presence_cost),
    Op("refresh", _parse_refresh),
)}


def parse(data: str | bytes, max_body: int) -> tuple[Op, Frame]:
    """Decode and validate one client frame: its op's row and the frame."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _undecodable(data) from None
    if not isinstance(obj, dict):
        raise ProtocolError("bad_request", "frame must be a JSON object")
    rid = _request_id(obj)
    name = obj.get("op")
    op = OPS.get(name) if isinstance(name, str) else None
    if op is None:
        if not isinstance(name, str):
            raise ProtocolError("bad_request", "op is required and must be a string", rid)
        raise ProtocolError("bad_request", f"unknown op {name[:32]!r}", rid)
    return op, op.parse(obj, rid, max_body)


def parse_frame(data: str | bytes, max_body: int) -> Frame:
    """Decode and validate one client frame (``parse`` without the row)."""
    return parse(data, max_body)[1]
