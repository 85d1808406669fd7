"""Message ids: 53-bit, time-ordered, unique across nodes.

Layout (most significant first)::

    41 bits  milliseconds since EPOCH_MS (2025-01-01 UTC; good until 2094)
     8 bits  node id (0..255)
     4 bits  sequence within the millisecond

A mid fits below 2**53, so it is exact as a JSON number and as a Redis
sorted-set score (a double). When a node issues more than 16 ids in one
millisecond it borrows the next millisecond instead of waiting; the logical
clock never goes backwards, so ids from one generator strictly increase.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from core.errors import Unavailable

__all__ = [
    "EPOCH_MS",
    "MAX_MID",
    "MAX_NODE_ID",
    "MidGenerator",
    "mid_for_time_ms",
    "mid_time_ms",
    "node_of",
]

EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z
TIME_BITS = 41
NODE_BITS = 8
SEQ_BITS = 4
MAX_NODE_ID = (1 << NODE_BITS) - 1
MAX_SEQ = (1 << SEQ_BITS) - 1
MAX_MID = (1 << (TIME_BITS + NODE_BITS + SEQ_BITS)) - 1  # 2**53 - 1
_LOW_BITS = NODE_BITS + SEQ_BITS


def mid_time_ms(mid: int) -> int:
    """Unix time in milliseconds at which ``mid`` was issued."""
    return (mid >> _LOW_BITS) + EPOCH_MS


def mid_for_time_ms(unix_ms: int) -> int:
    """The smallest mid any node can issue at ``unix_ms`` (a range bound)."""
    return max(0, unix_ms - EPOCH_MS) << _LOW_BITS


class MidGenerator:
    """Issues strictly increasing mids for one node; no I/O, not thread-safe."""

    def __init__(self, node_id: int, clock_ms: Callable[[], int] | None = None) -> None:
        if not 0 <= node_id <= MAX_NODE_ID:
            raise ValueError(f"node id must be in 0..{MAX_NODE_ID}, got {node_id}")
        self.node_id = node_id
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._last_ms = 0
        self._seq = 0
        self.held = True  # False while the node's lease on ``node_id`` is not confirmed

    def hold(self, held: bool) -> None:
        """Whether the node holds its number: a node that lost its lease must
        not mint ids another node may be minting (``next`` raises meanwhile)."""
        self.held = held

    def next(self) -> int:
        if not self.held:
            raise Unavailable("lease", "this node's id lease is not confirmed")
        now = self._clock_ms() - EPOCH_MS
        if now > self._last_ms:
            self._last_ms, self._seq = now, 0
        elif self._seq < MAX_SEQ:
            self._seq += 1
        else:  # sequence exhausted (or clock went back): borrow the next millisecond
            self._last_ms, self._seq = self._last_ms + 1, 0
        return (self._last_ms << _LOW_BITS) | (self.node_id << SEQ_BITS) | self._seq


def node_of(mid: int) -> int:
    """The node id a mid was issued by."""
    return (mid >> SEQ_BITS) & MAX_NODE_ID
