"""In-memory fakes of the chat store Protocols (``store/ports.py``) and the
route store, for unit tests of the services' logic. No servers.
Groups' fakes are ``fakes_groups.py``, the feed's ``fakes_feed.py``.

Each fake keeps the state its real implementation keeps, in dicts, with the
semantics the services rely on (dedup values, offline floors, forward-only
seqs and read seqs, tombstones), and records what reached it. ``fail(name)``
makes that method raise ``core.errors.Unavailable`` (nothing stored) until
``heal()``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import orjson

from core import dedup
from core.errors import Unavailable
from core.ids import node_of
from store.records import (
    ChatMessage,
    ConversationRow,
    Delivery,
    Erasure,
    GroupMessage,
    OfflinePage,
    Rewrite,
    StoredMessage,
)

__all__ = [
    "FakeDedup",
    "FakeMessages",
    "FakeOffline",
    "FakeRoutes",
    "Faulty",
    "settle",
]


async def settle(check: Callable[[], bool], turns: int = 2000) -> bool:
    """Let background tasks run, one event-loop turn at a time, until ``check()``
    holds; at most ``turns`` turns (no clock involved)."""
    for _ in range(turns):
        if check():
            return True
        await asyncio.sleep(0)
    return check()


class Faulty:
    """A fake that can be told to fail: named methods raise ``Unavailable``."""

    dependency = "fake"

    def __init__(self) -> None:
        self.down: set[str] = set()
        self.lost: set[str] = set()  # done, then failed: the answer lost on its way
        self.calls: Counter[str] = Counter()  # calls of each method, failed ones too

    def fail(self, *methods: str) -> None:
        self.down.update(methods)

    def lose(self, *methods: str) -> None:
        """These methods do their work, then raise ``Unavailable`` (where a
        fake supports it: it calls ``_answer``)."""
        self.lost.update(methods)

    def heal(self) -> None:
        self.down.clear()
        self.lost.clear()

    def _up(self, method: str) -> None:
        self.calls[method] += 1
        if method in self.down:
            raise Unavailable(self.dependency, f"{method} (told to fail)")

    def _answer(self, method: str) -> None:
        if method in self.lost:
            raise Unavailable(self.dependency, f"{method} (done, its answer lost)")


class FakeDedup(Faulty):
    """``DedupStore``: (sender, cmid) -> ``core.dedup`` value; a claim sets pending."""

    dependency = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[tuple[str, str], str] = {}

    async def claim(self, claims: Sequence[tuple[str, str, int]]) -> list[str | None]:
        self._up("claim")
        out: list[str | None] = []
        for sender, cmid, mid in claims:
            out.append(self.values.get((sender, cmid)))
            self.values.setdefault((sender, cmid), dedup.pending(mid))
        return out


class FakeRoutes(Faulty):
    """``RouteStore``: user -> {``node/conn``: node}."""

    dependency = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.routes: dict[str, dict[str, str]] = {}
        self.purged: dict[str, set[str]] = {}

    def connect(self, user: str, node: str, conn: int) -> str:
        """A device of ``user`` on ``node``; returns its route field."""
        self.routes.setdefault(user, {})[f"{node}/{conn}"] = node
        return f"{node}/{conn}"

    async def add(self, routes: Sequence[tuple[str, str, int]]) -> None:
        self._up("add")
        for user, node, conn in routes:
            self.connect(user, node, conn)

    async def remove(self, routes: Sequence[tuple[str, str, int]]) -> None:
        self._up("remove")
        for user, node, conn in routes:
            self.routes.get(user, {}).pop(f"{node}/{conn}", None)

    async def lookup(self, users: Sequence[str]) -> list[dict[str, str]]:
        self._up("lookup")
        return [dict(self.routes.get(u, {})) for u in users]

    async def last_seen(self, users: Sequence[str]) -> list[int | None]:
        self._up("last_seen")
        return [None for _ in users]

    async def purge_many(self, dead: Mapping[str, Iterable[str]]) -> None:
        self._up("purge_many")
        for user, fields in dead.items():
            for f in fields:
                self.routes.get(user, {}).pop(f, None)
                self.purged.setdefault(user, set()).add(f)


@dataclass
class Inbox:
    """One user's offline state. ``floor`` None: nothing recorded (or lost)."""

    entries: dict[int, bytes] = field(default_factory=dict)
    floor: int | None = None
    unread: dict[str, set[int]] = field(default_factory=dict)
    convs: dict[str, tuple[int, bytes]] = field(default_factory=dict)


class FakeOffline(Faulty):
    """``OfflineStore``: as ``deliver.lua`` and friends. Acked values land in the
    dedup store (the same Redis keys); routes come from the route store."""

    dependency = "redis"

    def __init__(self, dedup_store: FakeDedup, routes: FakeRoutes) -> None:
        super().__init__()
        self.dedup = dedup_store
        self.routes = routes
        self.inboxes: dict[str, Inbox] = {}
        self.deliveries: list[Delivery] = []
        self.acked: list[tuple[str, str, str]] = []
        self.erased: list[Erasure] = []

    async def rewrite(self, rewrites: Sequence[Rewrite]) -> None:
        """As ``rewrite.lua``: a kept frame is replaced unless it is a tombstone
        or carries a later edit."""
        self._up("rewrite")
        for r in rewrites:
            box = self.inboxes.get(r.user)
            if box is None:
                continue
            if r.mid in box.entries and _replaceable(box.entries[r.mid], r.edited):
                box.entries[r.mid] = r.frame
            mid, shown = box.convs.get(r.conv, (0, b""))
            if not r.conv.startswith("g:") and mid == r.mid and _replaceable(shown, r.edited):
                box.convs[r.conv] = (mid, r.preview)

    async def conversations_of(self, user: str, convs: Sequence[str]
                               ) -> list[ConversationRow]:
        self._up("conversations_of")
        box = self.inboxes.get(user, Inbox())
        return [ConversationRow(c, box.convs[c][0], len(box.unread.get(c, ())), box.convs[c][1])
                for c in convs if c in box.convs]

    async def deliver(self, deliveries: Sequence[Delivery],
                      acked: Sequence[tuple[str, str, str]], *, routes: bool = True
                      ) -> list[dict[str, str]]:
        self._up("deliver")
        for d in deliveries:
            self.deliveries.append(d)
            box = self.inboxes.setdefault(d.owner, Inbox())
            if box.floor is None:  # a new store vouches only from here on
                box.floor = d.mid - 1
            if d.mid in box.entries:
                continue  # a retry counts nothing twice
            box.entries[d.mid] = d.frame
            if d.unread:
                box.unread.setdefault(d.conv, set()).add(d.mid)
            if d.conv_list and d.mid > box.convs.get(d.conv, (0, b""))[0]:
                box.convs[d.conv] = (d.mid, d.frame)
        for sender, cmid, value in acked:
            self.acked.append((sender, cmid, value))
            self.dedup.values[(sender, cmid)] = value
        if not routes:
            return []
        return await self.routes.lookup([d.owner for d in deliveries])

    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        self._up("mark_read")
        left = {m for m in self.inboxes.get(user, Inbox()).unread.get(conv, set()) if m > mid}
        if user in self.inboxes:
            self.inboxes[user].unread[conv] = left
        return len(left)

    async def erase(self, erasures: Sequence[Erasure]) -> None:
        """As ``erase.lua``, per erasure: a recall puts the tombstone in the
        entry's place (and in the conversation's last, if it was that); a
        forget drops the entry and, if it was the last, puts the newest left
        (``frame``/``frame_mid``) there or takes the conversation off the list.
        A mid still unread is no longer counted."""
        self._up("erase")
        for e in erasures:
            self.erased.append(e)
            box = self.inboxes.setdefault(e.user, Inbox())
            if e.mid in box.entries:
                if e.recall:
                    box.entries[e.mid] = e.frame
                else:
                    del box.entries[e.mid]
            last = box.convs.get(e.conv)
            if last is not None and last[0] == e.mid:
                if e.recall:
                    box.convs[e.conv] = (e.mid, e.frame)
                elif e.frame:
                    box.convs[e.conv] = (e.frame_mid, e.frame)
                else:
                    del box.convs[e.conv]
            unread = box.unread.get(e.conv)
            if unread is not None:
                unread.discard(e.mid)
                if not unread:
                    del box.unread[e.conv]

    async def ack(self, user: str, *, mids: Sequence[int] = (), upto: int = -1) -> None:
        self._up("ack")
        box = self.inboxes.get(user)
        if box is None:
            return
        gone = [m for m in box.entries if m <= upto] if upto >= 0 else list(mids)
        for m in gone:
            box.entries.pop(m, None)
        high = max([upto, *gone])
        if box.floor is not None and box.floor < high:
            box.floor = high

    async def page(self, user: str, since: int, count: int) -> OfflinePage:
        self._up("page")
        box = self.inboxes.get(user)
        if box is None or box.floor is None or box.floor > since:
            return OfflinePage(False, [])
        return OfflinePage(True, sorted((m, f) for m, f in box.entries.items() if m > since)
                           [:count])

    async def fill(self, user: str, since: int, version: str,
                   rows: Sequence[tuple[int, bytes]], whole: bool) -> bool:
        """Never fills (allowed: "could not"); the fill is tested on Redis."""
        self._up("fill")
        return False

    async def recent(self, users: Sequence[str], since: int, count: int
                     ) -> list[list[bytes]]:
        self._up("recent")
        return [[f for m, f in sorted(self.inboxes.get(u, Inbox()).entries.items())
                 if m > since][:count] for u in users]

    async def conversations(self, user: str, count: int, upto: int | None = None
                            ) -> tuple[int, list[ConversationRow]]:
        self._up("conversations")
        box = self.inboxes.get(user, Inbox())
        newest = sorted(((c, v) for c, v in box.convs.items() if upto is None or v[0] <= upto),
                        key=lambda kv: kv[1][0], reverse=True)[:count]
        rows = [ConversationRow(c, mid, len(box.unread.get(c, ())), last)
                for c, (mid, last) in newest]
        return sum(len(s) for s in box.unread.values()), rows

    async def ping(self) -> None:
        self._up("ping")


class FakeMessages(Faulty):
    """``MessageStore``: bodies unique on (sender, cmid), per-user boxes by mid."""

    dependency = "mongo"

    def __init__(self) -> None:
        super().__init__()
        self.bodies: dict[int, StoredMessage] = {}
        self.cmids: dict[tuple[str, str], int] = {}
        self.boxes: dict[str, dict[int, str]] = {}  # owner -> mid -> conv
        self.batches: list[list[ChatMessage]] = []
        self.group_boxes: list[tuple[GroupMessage, list[str]]] = []
        self.read_marks: dict[tuple[str, str], int] = {}

    async def store_batch(self, msgs: Sequence[ChatMessage]) -> list[int | BaseException]:
        self._up("store_batch")
        self.batches.append(list(msgs))
        out: list[int | BaseException] = []
        for m in msgs:
            mid = self.cmids.setdefault((m.sender, m.cmid), m.mid)
            self.bodies.setdefault(mid, m)
            self._box(m.sender, mid, m.to)
            self._box(m.to, mid, m.sender)
            out.append(mid)
        return out

    def _box(self, owner: str, mid: int, conv: str) -> None:
        self.boxes.setdefault(owner, {})[mid] = conv

    async def box_page(self, owner: str, *, conv: str | None = None,
                       after: int | None = None, before: int | None = None,
                       limit: int = 50) -> list[StoredMessage]:
        self._up("box_page")
        mids = [m for m, c in self.boxes.get(owner, {}).items() if conv in (None, c)]
        if after is not None:
            picked = sorted(m for m in mids if m > after)
        else:
            picked = sorted((m for m in mids if before is None or m < before), reverse=True)
        return [self.bodies[m] for m in picked[:limit] if m in self.bodies]

    async def recall(self, mid: int, sender: str) -> ChatMessage | None:
        """Recalled, body dropped; None if ``sender`` sent no 1:1 message ``mid``."""
        self._up("recall")
        m = self.bodies.get(mid)
        if not isinstance(m, ChatMessage) or m.sender != sender:
            return None
        self.bodies[mid] = m = ChatMessage(m.mid, m.sender, m.to, m.cmid, None, recalled=True)
        return m

    async def edit(self, mid: int, sender: str, body: bytes, at_ms: int) -> bool:
        self._up("edit")
        m = self.bodies.get(mid)
        if not isinstance(m, ChatMessage) or m.sender != sender or m.recalled \
                or m.edited >= at_ms:
            return False
        self.bodies[mid] = replace(m, body=body, edited=at_ms)
        return True

    async def mark_reacted(self, mid: int) -> None:
        self._up("mark_reacted")
        m = self.bodies.get(mid)
        if isinstance(m, ChatMessage):
            self.bodies[mid] = replace(m, reacted=True)

    async def get_many(self, mids: Sequence[int]) -> dict[int, ChatMessage]:
        self._up("get_many")
        return {m: b for m in mids if isinstance(b := self.bodies.get(m), ChatMessage)}

    async def in_box(self, owner: str, mids: Sequence[int]) -> set[int]:
        self._up("in_box")
        return {m for m in mids if m in self.boxes.get(owner, {})}

    async def reacted_among(self, mids: Sequence[int]) -> set[int]:
        self._up("reacted_among")
        return {mid for mid in mids if (m := self.bodies.get(mid)) is not None and m.reacted}

    async def sender_of(self, mid: int) -> str | None:
        """The sender of the 1:1 message ``mid`` (group messages are the group store's)."""
        self._up("sender_of")
        m = self.bodies.get(mid)
        return m.sender if isinstance(m, ChatMessage) else None

    async def get(self, mid: int) -> ChatMessage | None:
        self._up("get")
        m = self.bodies.get(mid)
        return m if isinstance(m, ChatMessage) else None

    async def between(self, node: int, low: int, high: int, limit: int) -> list[ChatMessage]:
        self._up("between")
        return [m for mid, m in sorted(self.bodies.items())
                if low <= mid <= high and node_of(mid) == node
                and isinstance(m, ChatMessage)][:limit]

    async def add_missing_boxes(self, msgs: Sequence[ChatMessage]) -> int:
        self._up("add_missing_boxes")
        bare = [m for m in msgs if m.mid not in self.boxes.get(m.sender, {})
                and m.mid not in self.boxes.get(m.to, {})]
        for m in bare:
            self._box(m.sender, m.mid, m.to)
            self._box(m.to, m.mid, m.sender)
        return len(bare)

    async def forget(self, owner: str, mid: int) -> str | None:
        """Out of ``owner``'s box only (the body stays for the other side)."""
        self._up("forget")
        return self.boxes.get(owner, {}).pop(mid, None)

    async def add_group_boxes(self, entries: Sequence[tuple[GroupMessage, Sequence[str]]]
                              ) -> None:
        self._up("add_group_boxes")
        for m, members in entries:
            self.group_boxes.append((m, list(members)))
            self.bodies[m.mid] = m  # the real store reads these from group_msgs
            for u in members:
                self._box(u, m.mid, f"g:{m.group}")

    async def set_read_marks(self, marks: Sequence[tuple[str, str, int]]) -> None:
        self._up("set_read_marks")
        for user, conv, mid in marks:
            self.read_marks[(user, conv)] = max(mid, self.read_marks.get((user, conv), mid))

    async def peer_read_marks(self, user: str, peers: Sequence[str]) -> dict[str, int]:
        self._up("peer_read_marks")
        return {p: self.read_marks[(p, user)] for p in peers if (p, user) in self.read_marks}

    async def ping(self) -> None:
        self._up("ping")

    async def ensure_indexes(self) -> None:
        pass


if TYPE_CHECKING:  # mypy proves each fake satisfies its Protocol
    from store.ports import DedupStore, MessageStore, OfflineStore, RouteStore

    _d: DedupStore = FakeDedup()
    _r: RouteStore = FakeRoutes()
    _o: OfflineStore = FakeOffline(FakeDedup(), FakeRoutes())
    _m: MessageStore = FakeMessages()


class FakeQuotas:
    """``QuotaStore`` with a clock the test moves (``now``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.counts: dict[tuple[str, str, int], int] = {}

    async def take(self, user: str, what: str, limit: int, window_s: int) -> bool:
        key = (user, what, int(self.now) // window_s)
        self.counts[key] = self.counts.get(key, 0) + 1
        return self.counts[key] <= limit


def _replaceable(frame: bytes, at_ms: int) -> bool:
    """As ``rewrite.lua``'s check: not a tombstone, no later edit."""
    try:
        f = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return True
    return isinstance(f, dict) and not f.get("recalled") and int(f.get("edited") or 0) < at_ms
