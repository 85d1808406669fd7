"""The mids of this node's sends that may still land in a user's store: from
the moment a send has its mid until it is acked, and for ``linger_s`` after it
failed (a store that answered too late may still write it, and the client's
resend reuses the mid). Sync cursors must not pass the oldest of them, on any
node: a message stored under a mid below a cursor already handed out would
never reach that cursor's device by sync. Pure: the caller gives the time.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["SHARE_S", "InFlight"]

# How often each node shares its oldest mid that may still land (its "mark";
# the mid of that moment when it has none in flight): a mark others hold can be
# this old, and a sync held below one is asked again after it.
SHARE_S = 0.5


class InFlight:
    def __init__(self, linger_s: float = 30.0) -> None:
        self.linger_s = linger_s
        self._live: Counter[int] = Counter()  # mid -> sends in flight under it
        self._failed: dict[int, float] = {}  # mid -> when it may be forgotten
        self._kept: set[int] = set()  # failed sends a finisher keeps until found or given up

    def add(self, mid: int) -> None:
        self._live[mid] += 1

    def keep(self, mid: int) -> None:
        """A failed send that may still land, held until ``done`` (the node's
        finisher of failed sends: ``gateway.chat.unfinished``)."""
        self._kept.add(mid)

    def done(self, mid: int) -> None:
        """Acked: it is stored, so nothing under ``mid`` can land later (another
        send of it in flight is a resend, idempotent)."""
        self._live.pop(mid, None)
        self._failed.pop(mid, None)
        self._kept.discard(mid)

    def failed(self, mid: int, now: float) -> None:
        """Not acked: it may still land until ``now + linger_s``."""
        self._drop(mid)
        self._failed[mid] = max(self._failed.get(mid, 0.0), now + self.linger_s)

    def oldest(self, now: float) -> int | None:
        """The lowest mid that may still land, or None."""
        for mid in [m for m, until in self._failed.items() if until <= now]:
            del self._failed[mid]
        return min([*self._live, *self._failed, *self._kept], default=None)

    def oldest_live(self) -> int | None:
        """The lowest mid of a send under way (not one that failed): what a sync
        page waits for (a send lands in milliseconds to seconds; a failed one
        may linger 30 s)."""
        return min(self._live, default=None)

    def _drop(self, mid: int) -> None:
        n = self._live[mid] - 1
        if n > 0:
            self._live[mid] = n
        else:
            self._live.pop(mid, None)
