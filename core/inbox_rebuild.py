"""A user's 1:1 conversation list and unread, rebuilt from its box entries.

Redis keeps the conversation list and the unread mids of a user only for a
while (``IM_USER_KEY_TTL_S``); once they have expired they are rebuilt from
what MongoDB keeps: the user's box entries (one per message it sent or
received and has not deleted), the recalled flags of the messages, and the
user's read marks (per conversation, the highest mid read). These functions
make the decisions; the store does the reads and the writes.

- A conversation's last mid is its newest box entry (a recalled message is
  still the last one: it shows as a tombstone).
- Unread: the messages the user received in a conversation after its read
  mark, not recalled, the newest ``unread_cap`` of them.
- At most ``convs_max`` conversations, newest first; the unread of a
  conversation left out is left out with it (as a live list forgets it).
- Group entries (``g:`` conversations) are not part of the 1:1 list.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["BoxEntry", "RebuiltConv", "legacy_marks", "rebuild_convs", "unread_candidates"]

BoxEntry = tuple[int, str, bool]  # (mid, conversation as the owner names it, sent by the owner)


@dataclass(frozen=True, slots=True)
class RebuiltConv:
    conv: str
    last_mid: int
    unread: tuple[int, ...]  # unread mids, ascending


def _direct(entries: Sequence[BoxEntry]) -> list[BoxEntry]:
    return [e for e in entries if not e[1].startswith("g:")]


def unread_candidates(entries: Sequence[BoxEntry], marks: Mapping[str, int]) -> list[int]:
    """Mids received after their conversation's read mark: the ones whose
    recalled flag decides whether they count."""
    return [mid for mid, conv, out in _direct(entries) if not out and mid > marks.get(conv, 0)]


def rebuild_convs(entries: Sequence[BoxEntry], marks: Mapping[str, int],
                  recalled: Collection[int], convs_max: int, unread_cap: int
                  ) -> list[RebuiltConv]:
    """The conversation rows, newest first (``entries`` in any order)."""
    last: dict[str, int] = {}
    unread: dict[str, list[int]] = {}
    for mid, conv, out in _direct(entries):
        if mid > last.get(conv, 0):
            last[conv] = mid
        if not out and mid > marks.get(conv, 0) and mid not in recalled:
            unread.setdefault(conv, []).append(mid)
    newest = sorted(last.items(), key=lambda kv: (kv[1], kv[0]), reverse=True)[:convs_max]
    rows = []
    for conv, mid in newest:
        mids = sorted(set(unread.get(conv, ())))
        rows.append(RebuiltConv(conv, mid, tuple(mids[len(mids) - unread_cap:]
                                                 if len(mids) > unread_cap else mids)))
    return rows


def legacy_marks(counted: Collection[str], oldest_unread: Mapping[str, int],
                 entries: Sequence[BoxEntry], unmarked: Collection[str]) -> dict[str, int]:
    """Read marks for conversations that have none in MongoDB, from what a
    version without stored marks left in Redis: its unread hash (``counted``:
    the conversations it counted, ``*`` for the total) and each conversation's
    oldest unread mid. Such a conversation was read up to just before its
    oldest unread message, or, with none, to its last message. Nothing is made
    up for a user the old version left nothing for (a new user: all unread)."""
    if not counted:
        return {}
    last: dict[str, int] = {}
    for mid, conv, _ in _direct(entries):
        last[conv] = max(mid, last.get(conv, 0))
    out: dict[str, int] = {}
    for conv in unmarked:
        if conv in oldest_unread:
            out[conv] = oldest_unread[conv] - 1
        elif conv in last:
            out[conv] = last[conv]
    return out
