"""What the client has delivered of the user's stored messages (``msg`` and
``group_msg``): the sync cursor, dedup by ``mid``, pushes held during a sync,
and which mids to ``recv_ack`` in batches. Pure: the transport feeds it frames
and sync pages and sends what it says.

The cursor only moves with the sync's ``next``: a push is not proof that every
lower mid arrived (pushes may be skipped, or arrive out of ``mid`` order), so
it never moves the cursor. The mids delivered are remembered, the newest
``window`` of them, below the cursor too: a message stored late (a dependency
stalled its send, so it was acked after a sync's cursor had passed its mid)
still comes by push, and is delivered if it is newer than the oldest mid
remembered and not among them. A mid older than all of them and at or below
the cursor is taken for a repeat. ``wants_sync`` asks for a sync when half the
window is mids above the cursor. A mid seen twice, by push or by sync, is
delivered once.

Pushes about a stored message (``recalled``, ``edited``, ``reaction``) that
arrive during a sync are held too (``hold``) and given back after the held
messages (``after_sync``), in arrival order: one never comes before the
message it is about (a message held, or in a sync page not read yet).

Each edit and each recall of a message delivered is told once: for every mid
remembered, the newest ``edited`` (unix ms) and whether its recall was told,
from the message as delivered and from the pushes (``update`` says whether to
tell one). A sync page may bring again a message delivered before (pushes do
not move the cursor) edited or recalled meanwhile, e.g. while the client was
offline and missed the push: ``changes`` makes the ``edited`` / ``recalled``
frame of each such change, as the push would have been.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from imgate_client.core.frames import MESSAGE_OPS, MESSAGE_UPDATE_OPS, Frame

__all__ = ["AckBatcher", "Inbox"]


class Inbox:
    """Dedup by mid, the sync cursor and paging (see the module docstring)."""

    def __init__(self, since: int = 0, window: int = 10_000, max_pages: int = 1000) -> None:
        self.cursor = since
        self.window = window
        self.max_pages = max_pages
        self._seen: set[int] = set()
        self._heap: list[int] = []  # the same mids, smallest first, for forgetting
        self._above = 0  # of them, those above the cursor
        self._held: list[Frame] | None = None  # pushes during a sync
        self._after: list[Frame] = []  # pushes about a stored message, held with them
        self._edited: dict[int, int] = {}  # mid remembered -> newest edit told (unix ms)
        self._recalled: set[int] = set()  # mids remembered whose recall was told
        self._changed: list[Frame] = []  # sync entries of mids delivered, changed since
        self._pages = 0
        self.evicted = 0  # mids forgotten for room before a sync covered them

    # -- dedup -----------------------------------------------------------------
    def fresh(self, mid: int) -> bool:
        """True the first time ``mid`` is offered (and remembers it); False for a repeat
        or a mid at or below the cursor."""
        if self.seen(mid):
            return False
        self._seen.add(mid)
        heapq.heappush(self._heap, mid)
        self._above += mid > self.cursor
        while len(self._seen) > self.window:
            gone = heapq.heappop(self._heap)
            self._seen.discard(gone)
            self._edited.pop(gone, None)
            self._recalled.discard(gone)
            if gone > self.cursor:
                self._above -= 1
                self.evicted += 1  # forgotten before a sync covered it
        return True

    def seen(self, mid: int) -> bool:
        """Delivered already, or taken for a repeat: at or below the cursor and
        older than every mid remembered."""
        if mid in self._seen:
            return True
        return mid <= self.cursor and (not self._heap or mid < self._heap[0])

    @property
    def remembered(self) -> int:
        """The mids remembered above the cursor (those a sync would cover)."""
        return self._above

    @property
    def wants_sync(self) -> bool:
        """Half the window is mids above the cursor: a sync would cover them."""
        return self._above >= self.window // 2 and self._held is None

    # -- pushes ----------------------------------------------------------------
    def push(self, frame: Frame) -> Frame | None:
        """A pushed ``msg`` / ``group_msg``: the frame to deliver now, or None (a
        repeat, or held until the sync under way ends)."""
        mid = frame.get("mid")
        if frame.get("op") not in MESSAGE_OPS or not isinstance(mid, int):
            return None
        if self._held is not None:
            self._held.append(frame)
            return None
        return self._delivered(frame) if self.fresh(mid) else None

    def _delivered(self, m: Frame) -> Frame:
        """``m`` is delivered (its mid remembered): its edit and its recall are told."""
        self._told(m["mid"], m)
        return m

    def _told(self, mid: int, f: Frame) -> bool:
        """Note the edit or recall ``f`` (a message, or a push about ``mid``) as told;
        False if it was already (an edit not newer than one told, a recall told)."""
        if f.get("recalled") is True or f.get("op") == "recalled":
            if mid in self._recalled:
                return False
            if mid in self._seen:
                self._recalled.add(mid)
            return True
        if not _edited(f):
            return True
        at = f["edited"]
        if mid in self._recalled or at <= self._edited.get(mid, 0):
            return False  # recalled (told): an older view of it; or an edit told
        if mid in self._seen:  # a mid not remembered is not kept (bounded)
            self._edited[mid] = at
        return True

    def update(self, frame: Frame) -> bool:
        """A push about a stored message, not held: True to tell it (a reaction
        always; an edit or a recall unless told already)."""
        mid = frame.get("mid")
        if frame.get("op") == "reaction" or not isinstance(mid, int):
            return True
        return self._told(mid, frame)

    def hold(self, frame: Frame) -> bool:
        """A push about a stored message (``recalled``, ``edited``, ``reaction``):
        True if held because a sync is under way (``after_sync`` gives it back once
        it ends); False: tell it now."""
        if self._held is None or frame.get("op") not in MESSAGE_UPDATE_OPS:
            return False
        self._after.append(frame)
        return True

    # -- sync ------------------------------------------------------------------
    @property
    def syncing(self) -> bool:
        return self._held is not None

    def begin_sync(self) -> None:
        """From now until ``end_sync``, pushes are held (delivered after the sync's
        older messages, in mid order)."""
        if self._held is None:
            self._held = []
        self._pages = 0

    def sync_params(self, limit: int = 200) -> dict[str, Any]:
        """The query of the next ``GET /v1/sync`` page: with ``changes``, the
        messages this device had that were edited, reacted to or recalled since."""
        return {"since": self.cursor, "limit": limit, "changes": 1}

    def on_sync_page(self, page: dict[str, Any]) -> tuple[list[Frame], bool]:
        """A page's messages not delivered yet (oldest first), and whether to ask for
        another page."""
        out: list[Frame] = []
        for m in page.get("msgs") or ():
            if not isinstance(m, dict) or not isinstance(m.get("mid"), int):
                continue
            if self.fresh(m["mid"]):
                out.append(self._delivered(m))
            elif m["mid"] in self._seen and (m.get("recalled") is True or _edited(m)) \
                    and self._told(m["mid"], m):
                self._changed.append(m)  # edited or recalled since it was delivered
        nxt = page.get("next")
        moved = isinstance(nxt, int) and nxt > self.cursor
        if moved:
            self.cursor = nxt  # type: ignore[assignment]
            self._above = sum(1 for m in self._seen if m > self.cursor)
        self._pages += 1
        return out, bool(page.get("more")) and moved and self._pages < self.max_pages

    def end_sync(self) -> list[Frame]:
        """The sync is over (done or given up): the held pushes not delivered yet, in
        mid order."""
        held, self._held = self._held or [], None
        held.sort(key=lambda f: f["mid"])
        return [self._delivered(f) for f in held if self.fresh(f["mid"])]

    def after_sync(self) -> list[Frame]:
        """The pushes ``hold`` kept, in arrival order, those to tell (``update``):
        tell them after the messages ``end_sync`` returned."""
        after, self._after = self._after, []
        return [f for f in after if self.update(f)]

    def changes(self, user: str | None) -> list[Frame]:
        """The ``edited`` / ``recalled`` frames of the messages delivered before that
        the sync pages since the last call brought again, edited or recalled since
        (``conv`` as ``user`` names it, for 1:1 entries that lack it)."""
        changed, self._changed = self._changed, []
        return [_change(m, user) for m in changed]


def _edited(m: Frame) -> bool:
    at = m.get("edited")
    return isinstance(at, int) and not isinstance(at, bool)


def _change(m: Frame, user: str | None) -> Frame:
    """The push a change of message ``m`` (a sync entry) would have been."""
    conv = m.get("conv")
    if not isinstance(conv, str):
        group = m.get("group")
        conv = f"g:{group}" if isinstance(group, str) else (
            m.get("to") if m.get("from") == user else m.get("from"))
    if m.get("recalled") is True:
        return {"op": "recalled", "mid": m["mid"], "conv": conv, "by": m.get("from")}
    return {"op": "edited", "mid": m["mid"], "conv": conv, "body": m.get("body"),
            "edited": m["edited"]}


class AckBatcher:
    """Mids to ``recv_ack``, batched: ``add`` says when a batch is full; otherwise
    flush ``delay`` seconds after the first mid of a batch (``deadline``). At most
    ``max_pending`` wait (the oldest are dropped: an unacked entry only stays in the
    node's offline store a while longer)."""

    MAX_PER_FRAME = 1000  # the protocol's limit

    def __init__(self, batch: int = 100, delay: float = 0.2, max_pending: int = 10_000) -> None:
        self.batch = min(batch, self.MAX_PER_FRAME)
        self.delay = delay
        self.max_pending = max_pending
        self._mids: list[int] = []
        self.deadline: float | None = None  # monotonic time to flush by
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._mids)

    def add(self, mid: int, now: float | None = None) -> bool:
        """Queue ``mid``; True when a batch is full (flush now)."""
        if not self._mids:
            self.deadline = (time.monotonic() if now is None else now) + self.delay
        self._mids.append(mid)
        if len(self._mids) > self.max_pending:
            del self._mids[0]
            self.dropped += 1
        return len(self._mids) >= self.batch

    def take(self) -> list[int]:
        """The next frame's mids (at most 1,000); the rest stay queued."""
        out, self._mids = self._mids[:self.MAX_PER_FRAME], self._mids[self.MAX_PER_FRAME:]
        self.deadline = None if not self._mids else self.deadline
        return out

    def frame(self, rid: str | None = None) -> dict[str, Any] | None:
        """The next ``recv_ack`` frame, or None if nothing waits."""
        mids = self.take()
        if not mids:
            return None
        f: dict[str, Any] = {"op": "recv_ack", "mids": mids}
        if rid is not None:
            f["id"] = rid
        return f
