"""When and where to reconnect, pure: jittered exponential backoff, and what
each way of losing a connection means (docs/protocol.md, close codes).

- close 4003 (disconnect, ban, revoke by the product's backend): ``STOP``.
- close 4005 (a newer connection took this device's slot, the login policy): ``STOP``.
- close 4001 (token expired): ``REFRESH``: a new token (``get_token``), then
  the same URL at once.
- a ``reconnect`` frame, or close 1001 (the node drains): ``MOVE``: the next
  URL, after a small random delay (``move_jitter``: no stampede).
- handshake refused 401: ``REFRESH`` after the backoff; ``STOP`` after
  ``max_refusals`` in a row.
- handshake refused 403 (banned): ``STOP``.
- anything else (network, no close frame, 1008, 1011, 429, 5xx, ...):
  ``RETRY``: the next URL, after the backoff.

The backoff doubles from ``base`` up to ``cap`` with "equal jitter" (half the
delay fixed, half random); it starts over once a connection stayed up for
``stable_s``.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from imgate_client.core.frames import (
    CLOSE_GOING_AWAY,
    CLOSE_REPLACED,
    CLOSE_STOPPED,
    CLOSE_TOKEN_EXPIRED,
)

__all__ = ["Action", "Backoff", "Decision", "ReconnectPolicy"]


class Action(enum.Enum):
    RETRY = "retry"  # the next URL, after the backoff
    MOVE = "move"  # the next URL, soon: the node asked
    REFRESH = "refresh"  # a new token first, then the same URL
    STOP = "stop"  # no reconnect


@dataclass(frozen=True)
class Decision:
    action: Action
    delay: float  # seconds to wait first
    reason: str


class Backoff:
    """Exponential backoff with equal jitter: attempt n waits d/2 + U(0, d/2),
    d = min(cap, base * factor**n)."""

    def __init__(self, base: float = 0.25, cap: float = 10.0, factor: float = 2.0,
                 rng: random.Random | None = None) -> None:
        self.base, self.cap, self.factor = base, cap, factor
        self.rng = rng or random.Random()
        self.attempts = 0

    def next(self) -> float:
        d = min(self.cap, self.base * self.factor ** self.attempts)
        self.attempts += 1
        return d / 2 + self.rng.random() * d / 2

    def reset(self) -> None:
        self.attempts = 0


class ReconnectPolicy:
    """What to do when a connection ends or cannot be opened (module docstring)."""

    def __init__(self, backoff: Backoff | None = None, *, move_jitter: float = 0.5,
                 stable_s: float = 5.0, max_refusals: int = 3,
                 rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.backoff = backoff or Backoff(rng=self.rng)
        self.move_jitter = move_jitter
        self.stable_s = stable_s
        self.max_refusals = max_refusals
        self.refusals = 0  # 401s in a row
        self._up_since: float | None = None

    def on_open(self, now: float) -> None:
        """A connection is up (handshake done)."""
        self._up_since = now
        self.refusals = 0

    def on_close(self, code: int | None, now: float, told_to_move: bool = False) -> Decision:
        """The connection ended with close ``code`` (None: no close frame)."""
        if self._up_since is not None and now - self._up_since >= self.stable_s:
            self.backoff.reset()
        self._up_since = None
        if code == CLOSE_STOPPED:
            return Decision(Action.STOP, 0.0, "closed by the server (4003)")
        if code == CLOSE_REPLACED:  # reconnecting would only take the slot back
            return Decision(Action.STOP, 0.0, "replaced by a newer connection (4005)")
        if code == CLOSE_TOKEN_EXPIRED:
            return Decision(Action.REFRESH, 0.0, "token expired (4001)")
        if told_to_move or code == CLOSE_GOING_AWAY:
            return Decision(Action.MOVE, self.rng.random() * self.move_jitter,
                            "the node is draining")
        return Decision(Action.RETRY, self.backoff.next(), f"connection lost ({code})")

    def on_refused(self, status: int | None) -> Decision:
        """The handshake failed: HTTP ``status``, or None (network, timeout)."""
        if status == 403:
            return Decision(Action.STOP, 0.0, "refused: 403 (banned)")
        if status == 401:
            self.refusals += 1
            if self.refusals > self.max_refusals:
                return Decision(Action.STOP, 0.0, "refused: 401 (no valid token)")
            return Decision(Action.REFRESH, self.backoff.next(), "refused: 401")
        return Decision(Action.RETRY, self.backoff.next(),
                        f"refused: {status}" if status else "cannot connect")
