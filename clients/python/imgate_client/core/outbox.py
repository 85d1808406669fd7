"""The in-flight send table: every ``send`` / ``group_send`` not yet answered for
good, keyed by its ``cmid``, written again (same cmid, fresh request id) after a
reconnect, after ``ack_timeout`` without an answer, or after an ``unavailable``
/ ``rate_limited`` answer (with a jittered delay). The node stores a cmid once
and answers every resend with the original ``mid``, so resending is always safe.

Sans-I/O: the transport asks ``due(gen, now)`` what to write on its connection
(``gen`` numbers the connections: a new one makes every entry due), writes the
frames ``write`` returns, and hands each reply to ``on_reply``.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from imgate_client.core.frames import Frame, RequestIds, make, new_cmid

__all__ = ["Outbox", "Outcome", "PendingSend"]

RETRY_CODES = frozenset({"unavailable", "rate_limited"})


class Outcome(enum.Enum):
    ACKED = "acked"  # done: the reply is the ack
    RETRY = "retry"  # unavailable / rate_limited: written again at ``retry_at``
    FAILED = "failed"  # done: refused for good (bad_request, forbidden, ...)


@dataclass(eq=False)
class PendingSend:
    """One send until it is answered for good."""

    cmid: str
    op: str  # "send" or "group_send"
    fields: dict[str, Any]  # to / group, body
    attempts: int = 0  # frames written
    refusals: int = 0  # unavailable / rate_limited answers so far
    timeouts: int = 0  # frames written again after ack_timeout without an answer
    gen: int = -1  # connection the last frame went out on
    sent_at: float = 0.0  # when (the caller's clock) the last frame went out
    retry_at: float | None = None  # set after a retryable refusal
    rids: list[str] = field(default_factory=list)  # request ids of every frame

    def frame(self, rid: str) -> Frame:
        return make(self.op, rid, cmid=self.cmid, **self.fields)


class Outbox:
    """The in-flight sends (see the module docstring)."""

    def __init__(self, ids: RequestIds | None = None, *, ack_timeout: float = 10.0,
                 retry_base: float = 0.5, retry_cap: float = 5.0,
                 rng: random.Random | None = None) -> None:
        self.ids = ids or RequestIds("s")
        self.ack_timeout = ack_timeout
        self.retry_base, self.retry_cap = retry_base, retry_cap
        self.rng = rng or random.Random()
        self._pending: dict[str, PendingSend] = {}  # by cmid, in the order added
        self._by_rid: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._pending)

    def __contains__(self, cmid: object) -> bool:
        return cmid in self._pending

    def __iter__(self) -> Iterator[PendingSend]:
        return iter(list(self._pending.values()))

    def get(self, cmid: str) -> PendingSend | None:
        return self._pending.get(cmid)

    def add(self, op: str, fields: dict[str, Any], cmid: str | None = None) -> PendingSend:
        """A new send (``op`` "send" with ``to``, or "group_send" with ``group``;
        ``body``); ValueError if ``cmid`` is already in flight."""
        if op not in ("send", "group_send"):
            raise ValueError(f"not a send op: {op!r}")
        cmid = cmid or new_cmid()
        if cmid in self._pending:
            raise ValueError(f"cmid {cmid!r} is already in flight")
        p = self._pending[cmid] = PendingSend(cmid, op, dict(fields))
        return p

    def write(self, p: PendingSend, gen: int, now: float) -> Frame:
        """The frame to write for ``p`` on connection ``gen`` now (a fresh request id)."""
        if p.attempts and p.gen == gen and p.retry_at is None:
            p.timeouts += 1  # same connection, not refused: the last frame went unanswered
        rid = self.ids.next()
        p.rids.append(rid)
        self._by_rid[rid] = p.cmid
        p.attempts += 1
        p.gen, p.sent_at, p.retry_at = gen, now, None
        return p.frame(rid)

    def due(self, gen: int, now: float) -> list[PendingSend]:
        """Entries to write on connection ``gen`` now, oldest first: never written on
        it, answered ``unavailable`` / ``rate_limited`` and due again, or unanswered
        for ``ack_timeout``."""
        out = []
        for p in self._pending.values():
            if p.retry_at is not None:
                if p.retry_at <= now:
                    out.append(p)
            elif p.gen != gen or now - p.sent_at >= self.ack_timeout:
                out.append(p)
        return out

    def next_deadline(self) -> float | None:
        """The earliest time ``due`` may return something more on the same connection."""
        times = [p.retry_at if p.retry_at is not None else p.sent_at + self.ack_timeout
                 for p in self._pending.values()]
        return min(times) if times else None

    def on_reply(self, frame: Frame, now: float) -> tuple[PendingSend, Outcome] | None:
        """A reply (``re``) to one of our frames: the entry and what became of it;
        None if it answers no entry in flight (a late reply to a resend already acked)."""
        cmid = self._by_rid.get(frame.get("re"))  # type: ignore[arg-type]
        if cmid is None and frame.get("op") == "ack":
            cmid = frame.get("cmid")
        p = self._pending.get(cmid) if isinstance(cmid, str) else None
        if p is None:
            return None
        if frame.get("op") == "ack":
            self.remove(p.cmid)
            return p, Outcome.ACKED
        if frame.get("code") in RETRY_CODES:
            delay = min(self.retry_cap, self.retry_base * 2 ** p.refusals)
            p.refusals += 1
            p.retry_at = now + delay / 2 + self.rng.random() * delay / 2
            return p, Outcome.RETRY
        self.remove(p.cmid)
        return p, Outcome.FAILED

    def unanswered(self, gen: int) -> int:
        """Entries whose last frame went out on connection ``gen`` and is still waiting
        for its answer (not those waiting to be retried after a refusal)."""
        return sum(1 for p in self._pending.values()
                   if p.attempts and p.gen == gen and p.retry_at is None)

    def remove(self, cmid: str) -> PendingSend | None:
        """Forget ``cmid`` (answered, or given up by the caller)."""
        p = self._pending.pop(cmid, None)
        if p is not None:
            for rid in p.rids:
                self._by_rid.pop(rid, None)
        return p
