"""Inbox arithmetic: group unread, the sync merge, the conversations merge.

Items stay opaque (stored bytes wrapped for the encoder, or dicts read from
MongoDB): these functions only look at the mids they are paired with.

- Group unread is the group's seq minus the member's read seq, never
  counting what came before the member joined (``from_seq``).
- ``/v1/sync`` merges the user's own page (offline store or boxes) with the
  read-diffused group messages; each source was read with ``limit + 1``, so
  the merged head is exact and "more" is known without another read.
- Conversations: 1:1 rows and group rows, newest first by last mid, paged
  by position (last mid, conversation id) so that a page's work is its
  ``limit`` whatever the number of conversations.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = [
    "GroupRow",
    "Position",
    "RdPlan",
    "rd_plan",
    "busy_groups",
    "conversation_page",
    "group_conversation_row",
    "group_unread",
    "merge_group_pages",
    "merge_sync",
    "newest",
]

T = TypeVar("T")
L = TypeVar("L")


@dataclass(frozen=True, slots=True)
class GroupRow(Generic[L]):
    """One group's line in the conversation list.

    ``mid`` is the sort key: the group's last mid when ``last`` shows, else 0
    (the group sorts after every conversation with a message).
    """

    conv: str
    unread: int
    last: L | None
    mid: int


def group_unread(seq: int, read_seq: int, from_seq: int,
                 recalled: Sequence[int] = ()) -> int:
    """Messages of a group the member has not read, since it joined; a recalled
    seq in that range no longer counts."""
    after = max(read_seq, from_seq)
    return max(0, seq - after - sum(1 for r in recalled if after < r <= seq))


def group_conversation_row(
    group: str, seq: int, lastmid: int, last: L | None, from_seq: int, read_seq: int,
    recalled: Sequence[int] = (),
) -> GroupRow[L]:
    """A member's row for a group in state (``seq``, ``lastmid``, ``last``).

    ``last`` shows only if the newest message came after the member joined
    (``seq > from_seq``): a member never sees a message from before it joined.
    """
    shown = last if last and seq > from_seq else None
    return GroupRow(f"g:{group}", group_unread(seq, read_seq, from_seq, recalled), shown,
                    lastmid if shown is not None else 0)


def merge_sync(
    rows: Sequence[tuple[int, T]], extra: Sequence[tuple[int, T]], limit: int
) -> tuple[list[T], list[int], bool]:
    """Merge two mid-ascending pages: (items, their mids, more than ``limit``).

    Equal mids keep ``rows`` first. ``rows`` alone is taken as it came.
    """
    merged = sorted([*rows, *extra], key=_mid) if extra else list(rows)
    head = merged[:limit]
    return [item for _, item in head], [mid for mid, _ in head], len(merged) > limit


def busy_groups(rdmids: Mapping[str, int], since: int) -> list[str]:
    """Groups with a read-diffused message after ``since`` (the others have none)."""
    return [group for group, rdmid in rdmids.items() if rdmid > since]


@dataclass(frozen=True, slots=True)
class RdPlan:
    """Which groups a sync reads from MongoDB, and how many messages of each.

    ``cut``: the mid of the first message left for the next call (its group
    would have been one group too many); the page stops below it, on every
    side (the user's own store too), and says ``more``. None: no cut."""

    reads: dict[str, int]
    cut: int | None


def rd_plan(indexed: Mapping[str, Sequence[tuple[int, int]]], from_seq: Mapping[str, int],
            limit: int, max_groups: int) -> RdPlan:
    """The groups to read for a page of ``limit`` (plus one, to know "more"),
    from each group's indexed (mid, seq) after the cursor (each at least
    ``limit + 1`` of them, or all it has), at most ``max_groups`` groups.
    Messages from before the member joined (seq at most ``from_seq``) do not
    count."""
    candidates = sorted((mid, g) for g, entries in indexed.items()
                        for mid, seq in entries if seq > from_seq.get(g, 0))
    reads: dict[str, int] = {}
    for taken, (mid, g) in enumerate(candidates):
        if taken == limit + 1:
            break
        if g not in reads and len(reads) == max_groups:
            return RdPlan(reads, mid)
        reads[g] = reads.get(g, 0) + 1
    return RdPlan(reads, None)


def merge_group_pages(
    pages: Iterable[Sequence[tuple[int, T]]], limit: int, below: int | None = None
) -> list[tuple[int, T]]:
    """Several groups' ascending pages as one, oldest first, at most ``limit``;
    with ``below``, only rows under that mid (a plan's cut)."""
    return sorted((row for page in pages for row in page
                   if below is None or row[0] < below), key=_mid)[:limit]


# Where a conversation stands in the list: (its last mid, its id); the list is
# in descending order of positions (a group without a message shown: mid 0).
Position = tuple[int, str]


def conversation_page(rows: Iterable[tuple[Position, T]], limit: int,
                      after: Position | None = None) -> tuple[list[T], Position | None]:
    """The ``limit`` rows after ``after`` (newest first) and the position the
    next page starts after, or None when no row follows.

    Each source must hand in at least ``limit + 1`` rows after ``after`` (or
    all it has) for "no row follows" to be exact."""
    later = newest(rows, limit + 1, after)
    head = later[:limit]
    return [row for _, row in head], (head[-1][0] if len(later) > limit and head else None)


def newest(rows: Iterable[tuple[Position, T]], count: int, after: Position | None = None
           ) -> list[tuple[Position, T]]:
    """The ``count`` rows after ``after`` in the list's order (newest first)."""
    later = (r for r in rows if after is None or r[0] < after)
    return heapq.nlargest(count, later, key=_position)


class ConversationIndex(Generic[T]):
    """Rows sorted once by position, for many pages (``newest`` of each page
    costs a binary search and the page, not a pass over every row)."""

    __slots__ = ("_asc", "_keys", "_where")

    def __init__(self, rows: Iterable[tuple[Position, T]]) -> None:
        self._asc = sorted(rows, key=_position)
        self._keys = [pos for pos, _ in self._asc]
        self._where = {pos[1]: pos for pos in self._keys}  # conversation -> position

    def update(self, conv: str, value: T, mid: int | None = None) -> T | None:
        """Give ``conv`` a new value, and a new position when ``mid`` is given
        (its last message); returns its old value (None: not in the index,
        nothing changed)."""
        pos = self._where.get(conv)
        if pos is None:
            return None
        i = bisect.bisect_left(self._keys, pos)
        old = self._asc[i][1]
        if mid is None or mid == pos[0]:
            self._asc[i] = (pos, value)
            return old
        del self._asc[i], self._keys[i]
        new = (mid, conv)
        j = bisect.bisect_left(self._keys, new)
        self._asc.insert(j, (new, value))
        self._keys.insert(j, new)
        self._where[conv] = new
        return old

    def find(self, conv: str) -> tuple[Position, T] | None:
        """``conv``'s row, if it is in the index."""
        pos = self._where.get(conv)
        if pos is None:
            return None
        return self._asc[bisect.bisect_left(self._keys, pos)]

    def __len__(self) -> int:
        return len(self._asc)

    def newest(self, count: int, after: Position | None = None) -> list[tuple[Position, T]]:
        """As ``newest`` over the rows: the ``count`` after ``after``, newest first."""
        end = len(self._asc) if after is None else bisect.bisect_left(self._keys, after)
        return self._asc[max(0, end - count):end][::-1]


def _position(row: tuple[Position, object]) -> Position:
    return row[0]


def _mid(row: tuple[int, object]) -> int:
    return row[0]
