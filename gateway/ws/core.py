"""The decisions of one WebSocket session, without I/O: a frame in, actions out.

Like websockets' ``protocol.py``, this core is fed what the socket received
(``receive``) and answers with what to do; the asyncio layer only carries
it out. It parses and validates the frame, counts bad frames (closing the
connection at the limit), spends the connection's budgets, answers pings,
and says which ops run as tasks and which are handled at once, all as the
op table (``gateway.protocol.OPS``) says. The clock is passed in.

Budgets (token buckets, per connection): every frame spends from the op
budget (``recv_ack`` one token per ``RECV_ACK_MIDS_PER_TOKEN`` mids more),
sends also from the send budget; a frame over budget is refused with
``rate_limited`` and costs nothing more. Each refusal spends from a third
bucket: a connection that keeps flooding after being told empties it and is
closed with 1008, so a flood costs the node a bounded number of replies.

Actions, in the order they are to be carried out:
- ``Accepted(op)``: a valid frame arrived (the ``frames_in`` metric's label);
- ``Reply(data, error)``: write these bytes; ``error`` is the protocol error
  code when they are an error frame (the ``errors`` metric's label);
- ``Spawn(op, frame)``: run op ``op``'s handler as a task (bounded per
  connection by the driver);
- ``Inline(op, frame)``: run op ``op``'s handler at once, no task (``room_send``);
- ``Close(code, reason, why)``: close the connection; ``why`` labels the metric.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.ratelimit import TokenBucket
from gateway import frames
from gateway import protocol as p
from gateway.config import Settings
from gateway.errors import ProtocolError

__all__ = [
    "Accepted",
    "ConnectionLimits",
    "Action",
    "Close",
    "Inline",
    "Reply",
    "SessionCore",
    "SessionLimits",
    "Spawn",
]

# RFC 6455 7.4.1: "1008 indicates that an endpoint is terminating the
# connection because it has received a message that violates its policy."
POLICY_VIOLATION = 1008

RECV_ACK_MIDS_PER_TOKEN = p.RECV_ACK_MIDS_PER_TOKEN


@dataclass(frozen=True, slots=True)
class SessionLimits:
    """Per-connection limits: body bytes, bad frames before close, budgets."""

    max_body: int
    bad_frame_limit: int
    send_rate: float
    send_burst: int
    op_rate: float = 300.0
    op_burst: int = 600
    refuse_rate: float = 10.0
    refuse_burst: int = 100
    push_confirm_s: float = 0.5  # IM_PUSH_CONFIRM_MS: an ack waits for its pushes' hand-off

    @classmethod
    def from_settings(cls, s: Settings) -> SessionLimits:
        return cls(s.max_body, s.bad_frame_limit, s.send_rate, s.send_burst,
                   op_rate=s.op_rate, op_burst=s.op_burst, refuse_rate=s.refuse_rate,
                   refuse_burst=s.refuse_burst, push_confirm_s=s.push_confirm_ms / 1000)


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What the session's driver bounds per connection and per user: devices of
    one user on a node, ops in flight, reply bytes queued before a drop."""

    max_conns_per_user: int
    max_inflight: int
    reply_buffer_max: int
    ip_handshake_rate: float = 0.0  # per client address (0: no limit)
    ip_handshake_burst: int = 0
    max_conns_per_ip: int = 0
    trusted_proxies: str = ""
    user_handshake_rate: float = 0.0  # per user (0: no limit)
    user_handshake_burst: int = 0
    keepalive_s: int = 20  # a ping per connection this often; no pong by the next: closed

    @classmethod
    def from_settings(cls, s: Settings) -> ConnectionLimits:
        return cls(s.max_conns_per_user, s.max_inflight, s.reply_buffer_max,
                   s.ip_handshake_rate, s.ip_handshake_burst, s.max_conns_per_ip,
                   s.trusted_proxies, s.user_handshake_rate, s.user_handshake_burst,
                   s.keepalive_s)


@dataclass(frozen=True, slots=True)
class Accepted:
    """A valid frame of op ``op`` (the frame class name, lowercased)."""

    op: str


@dataclass(frozen=True, slots=True)
class Reply:
    """Bytes to write; ``error`` is the code when they are an error frame."""

    data: bytes
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Spawn:
    """Run op ``op``'s handler on ``frame`` as a task."""

    op: str
    frame: p.Frame


@dataclass(frozen=True, slots=True)
class Inline:
    """Run op ``op``'s handler on ``frame`` at once, without a task."""

    op: str
    frame: p.Frame


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection with ``code`` and ``reason``; ``why`` labels the metric."""

    code: int
    reason: str
    why: str


Action = Accepted | Reply | Spawn | Inline | Close


class UserBudget:
    """What every connection of one user on a node spends together: its sends
    and ops per second, and its ops in flight (``tasks``). More connections
    never buy a user more."""

    __slots__ = ("sends", "ops", "tasks", "refs")

    def __init__(self, limits: SessionLimits, now: float) -> None:
        self.sends = TokenBucket(limits.send_rate, limits.send_burst, now)
        self.ops = TokenBucket(limits.op_rate, limits.op_burst, now)
        self.tasks: set[Any] = set()  # in flight, over all the user's connections
        self.refs = 0  # connections holding it


class UserBudgets:
    """One ``UserBudget`` per user with a connection on the node (pure)."""

    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self._budgets: dict[str, UserBudget] = {}

    def __len__(self) -> int:
        return len(self._budgets)

    def acquire(self, user: str, now: float) -> UserBudget:
        """The user's budget, for one more connection (``release`` it at its end)."""
        budget = self._budgets.get(user)
        if budget is None:
            budget = self._budgets[user] = UserBudget(self.limits, now)
        budget.refs += 1
        return budget

    def release(self, user: str) -> None:
        budget = self._budgets.get(user)
        if budget is not None:
            budget.refs -= 1
            if budget.refs <= 0:
                del self._budgets[user]


class SessionCore:
    """One connection's frame handling: bad-frame count and the user's send and
    op token buckets (shared by its connections on the node, ``UserBudget``)."""

    __slots__ = ("limits", "_bucket", "_ops", "_refusals", "_bad_frames", "closed")

    def __init__(self, limits: SessionLimits, now: float,
                 budget: UserBudget | None = None) -> None:
        self.limits = limits
        budget = budget or UserBudget(limits, now)
        self._bucket = budget.sends
        self._ops = budget.ops
        self._refusals = TokenBucket(limits.refuse_rate, limits.refuse_burst, now)
        self._bad_frames = 0
        self.closed = False  # a Close was given: later frames are ignored

    @property
    def bad_frames(self) -> int:
        """Frames refused so far on this connection."""
        return self._bad_frames

    def receive(self, data: str | bytes, now: float) -> list[Action]:
        """What to do with one frame the client sent at ``now`` (nothing once closed)."""
        if self.closed:
            return []
        actions = self._receive(data, now)
        self.closed = any(isinstance(a, Close) for a in actions)
        return actions

    def _receive(self, data: str | bytes, now: float) -> list[Action]:
        try:
            op, frame = p.parse(data, self.limits.max_body)
        except ProtocolError as err:
            if not self._ops.take(now):
                return self._over_budget(err.re, now)
            return self._refuse(err)
        if not self._ops.take(now, 1 if op.cost is None else op.cost(frame)):
            return self._over_budget(frame.id, now)
        return [Accepted(type(frame).__name__.lower()), self._dispatch(op, frame, now)]

    def _over_budget(self, rid: object, now: float, what: str = "frames") -> list[Action]:
        """``rate_limited``; or, for a connection that keeps flooding, close 1008."""
        if not self._refusals.take(now):
            return [Close(POLICY_VIOLATION, "flooding: too many frames over the budget",
                          "flood")]
        return [_error(ProtocolError("rate_limited", f"too many {what}; slow down", rid))]

    def _dispatch(self, op: p.Op, frame: p.Frame, now: float) -> Action:
        if op.budget == "send" and not self._bucket.take(now):
            if not self._refusals.take(now):
                return Close(POLICY_VIOLATION, "flooding: too many sends over the budget",
                             "flood")
            return _error(ProtocolError("rate_limited", "too many sends", frame.id))
        if op.run == "core":  # ping: the only op the core answers itself
            return Reply(_pong(frame.id))
        return Spawn(op.name, frame) if op.run == "task" else Inline(op.name, frame)

    def _refuse(self, err: ProtocolError) -> list[Action]:
        actions: list[Action] = [_error(err)]
        self._bad_frames += 1
        if self._bad_frames >= self.limits.bad_frame_limit:
            actions.append(Close(POLICY_VIOLATION, "too many bad frames", "bad_frames"))
        return actions


def _error(err: ProtocolError) -> Reply:
    return Reply(frames.error(err), err.code)


def _pong(rid: object) -> bytes:
    return frames.pong(rid)
