"""What a joining member gets from a room's kept history: the last N
messages, or those after a position it saw, and whether that is everything
it missed (``recovered``). Pure: the store reads, this decides.

A room's kept messages have consecutive positions (each append writes every
position it takes), oldest first; those older than the history's age are
treated as gone even while Redis still holds them (with everything before
them, so what is left stays consecutive). ``recovered`` is true only
when the epoch is the member's and every position after its own is kept (or
there is none): a lost epoch or a trimmed gap is never reported as true.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

__all__ = ["Catchup", "RoomLog", "catch_up", "entry_pos_ts"]


@dataclass(frozen=True, slots=True)
class RoomLog:
    """A room's state as read: ``epoch`` None when the room has none (never
    written, or lost); ``entries`` the kept messages (JSON, oldest first)."""

    epoch: str | None
    last: int
    entries: list[bytes]


@dataclass(frozen=True, slots=True)
class Catchup:
    msgs: list[bytes]
    recovered: bool | None  # None: no position was given


def entry_pos_ts(entry: bytes) -> tuple[int, int]:
    """A kept message's position and send time (ms)."""
    obj = orjson.loads(entry)
    return int(obj["pos"]), int(obj.get("ts", 0))


def catch_up(log: RoomLog, *, now_ms: int, max_age_ms: int, history: int,
             since: tuple[str, int] | None) -> Catchup:
    """The messages for a join: after ``since`` (epoch, pos) when given, else
    the last ``history``."""
    kept: list[tuple[int, bytes]] = []
    for entry in log.entries:
        pos, ts = entry_pos_ts(entry)
        if now_ms - ts > max_age_ms:
            kept.clear()  # too old, and so is all before it: kept stays consecutive
        else:
            kept.append((pos, entry))
    if since is None:
        return Catchup([e for _, e in kept[-history:]] if history > 0 else [], None)
    epoch, seen = since
    if log.epoch is None or epoch != log.epoch or seen > log.last:
        return Catchup([e for _, e in kept], False)  # another epoch: all that is kept
    after = [(p, e) for p, e in kept if p > seen]
    recovered = seen == log.last or (bool(after) and after[0][0] == seen + 1)
    return Catchup([e for _, e in after], recovered)
