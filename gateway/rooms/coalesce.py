"""Room fan-out, the pure parts: the delivery cap, sampling, frame building.

Nothing here does I/O or reads a clock; ``gateway/rooms/hub.py`` drives it.
A room's messages arrive as already-encoded fragments (``{"from","body","ts"}``,
encoded once by the node that accepted them); a flush turns a window's worth
into ``room_msgs`` frames and those into WebSocket wire bytes, once, for
every member.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

__all__ = ["DeliveryCap", "room_frames", "sample"]


class DeliveryCap:
    """At most ``rate`` messages a second to each member of one room.

    A token bucket refilled by time; a flush asks how many normal messages
    may go. ``prio`` 1 messages always go but spend tokens too, so a flood of
    them leaves less room for normal ones. ``rate`` 0: no cap.
    """

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def allow(self, now: float, prio: int, normal: int) -> int:
        """Spend tokens for ``prio`` must-deliver messages; return how many of
        ``normal`` messages may go now."""
        if self.rate <= 0:
            return normal
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        self.tokens = max(0.0, self.tokens - prio)
        allowed = min(normal, int(self.tokens))
        self.tokens -= allowed
        return allowed


def sample(frags: Sequence[bytes], prios: Sequence[int], allowed: int,
           rng: random.Random) -> list[bytes]:
    """Every ``prio`` fragment, plus ``allowed`` of the normal ones chosen
    uniformly at random; arrival order is kept."""
    normal = [i for i, p in enumerate(prios) if not p]
    if allowed >= len(normal):
        return list(frags)
    keep = set(rng.sample(normal, allowed)) if allowed > 0 else set()
    return [f for i, (f, p) in enumerate(zip(frags, prios, strict=True)) if p or i in keep]


def room_frames(room: str, frags: Sequence[bytes], max_bytes: int,
                epoch: str | None = None) -> list[bytes]:
    """``room_msgs`` frames carrying ``frags`` in order, each at most about
    ``max_bytes`` (a single fragment larger than that still gets a frame),
    with the room's ``epoch`` when its messages are positioned.

    ``room`` is a validated id (``[A-Za-z0-9_.:-]``) and ``epoch`` hex, so
    neither needs escaping.
    """
    head = b'{"op":"room_msgs","room":"' + room.encode() + (
        b'","epoch":"' + epoch.encode() if epoch is not None else b"") + b'","msgs":['
    tail = b"]}"
    frames: list[bytes] = []
    chunk: list[bytes] = []
    size = len(head) + len(tail)
    for frag in frags:
        if chunk and size + len(frag) + 1 > max_bytes:
            frames.append(head + b",".join(chunk) + tail)
            chunk, size = [], len(head) + len(tail)
        chunk.append(frag)
        size += len(frag) + 1
    if chunk:
        frames.append(head + b",".join(chunk) + tail)
    return frames
