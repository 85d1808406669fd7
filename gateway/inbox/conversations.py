"""One reader's view of all its conversations: the 1:1-vs-group dispatch on
``g:`` and the merges of both sides (sync, history, conversations, read).

The decisions are ``core.inbox``'s (pure); this facade only asks ``ChatService``
and ``GroupService`` for their halves.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from core import inbox
from core.cursors import next_cursor
from core.errors import Unavailable
from core.ids import mid_for_time_ms
from core.inbox import Position
from core.seek_cursor import BadCursor, decode_cursor, encode_cursor
from gateway.chat.service import ChatService
from gateway.errors import ProtocolError
from gateway.groups.service import GroupService
from gateway.inbox.reactions import Reactions
from store.ports import ChangeLog, ConvSettingStore
from store.records import ConvSettings

__all__ = ["Conversations", "SyncPage"]

GROUP_PREFIX = "g:"
# A call that reads each of the caller's groups (a sync without its index of
# groups with news, its group list, its conversation list: the last two kept a
# moment on the node for a user in many groups) costs one more call of its
# HTTP budget per this many groups read.
GROUPS_PER_CALL = 1000


@dataclass(frozen=True, slots=True)
class SyncPage:
    msgs: list[Any]  # orjson.Fragment (stored bytes) or dicts (from MongoDB)
    next: int
    more: bool


class Conversations:
    def __init__(self, chat: ChatService, groups: GroupService, sync_settle_ms: int,
                 low_mark: Callable[[], int | None] = lambda: None,
                 reactions: Reactions | None = None,
                 settings: ConvSettingStore | None = None,
                 changes: ChangeLog | None = None, *, held_wait_s: float = 0.0) -> None:
        self.chat = chat
        self.groups = groups
        self.reactions = reactions  # counts added to sync and history (None: none)
        self.settings = settings  # muted / pinned / archived (None: none)
        self.changes = changes  # messages changed after a cursor (None: not looked for)
        self.sync_settle_ms = sync_settle_ms
        # The oldest mid a send on any node may still store (``core.inflight``).
        self.low_mark = low_mark
        # A full page held whole below that mark is read again once, after this
        # long (the marks are shared every ``core.inflight.SHARE_S``): most holds
        # are a send that lands in milliseconds, or another node's mark that is
        # the mid of its last share; 0: answered held at once.
        self.held_wait_s = held_wait_s
        # (user, n): the call was worth n more calls of the user's HTTP budget (a
        # user in many groups: its lists read every group's numbers). Set by the
        # HTTP API; a no-op elsewhere.
        self.spend: Callable[[str, float], None] = lambda _user, _n: None
        self.groups_per_call = GROUPS_PER_CALL

    def charge(self, user: str, groups: int) -> None:
        """A call of ``user`` read ``groups`` of its groups: its HTTP budget pays."""
        self.spend(user, groups / self.groups_per_call)

    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        """Read up to ``mid``; returns the conversation's unread count after it."""
        if conv.startswith(GROUP_PREFIX):
            return await self.groups.read(user, conv[len(GROUP_PREFIX):], mid)
        return await self.chat.mark_read(user, conv, mid)

    async def history(self, user: str, conv: str, before: int | None, limit: int
                      ) -> tuple[list[dict[str, Any]], int | None]:
        if conv.startswith(GROUP_PREFIX):
            page, cursor = await self.groups.history(user, conv[len(GROUP_PREFIX):], before,
                                                     limit)
        else:
            page, cursor = await self.chat.history(user, conv, before, limit)
        return await self._with_reactions(page, [int(f["mid"]) for f in page]), cursor

    async def _with_reactions(self, msgs: list[Any], mids: list[int]) -> list[Any]:
        """Counts added (``Reactions.attach``); stored bytes as ``orjson.Fragment``."""
        if self.reactions is not None:
            return await self.reactions.attach(msgs, mids)
        return [orjson.Fragment(m) if isinstance(m, bytes) else m for m in msgs]

    async def sync(self, user: str, since: int, limit: int, *, changes: bool = False
                   ) -> SyncPage:
        """Messages after ``since``, oldest first: the user's own store (1:1 and
        write-diffused groups) merged with its read-diffused groups.

        A full page whose cursor the bound held where it was (``more`` with
        ``next == since``: every message of it above a send that may still land)
        is read again once after ``held_wait_s``, so a client walking a burst
        page by page keeps moving; still held, it is answered so (the client
        asks again later: ``docs/protocol.md``)."""
        page, held = await self._sync(user, since, limit, changes)
        if held and self.held_wait_s > 0:
            await asyncio.sleep(self.held_wait_s)
            page, held = await self._sync(user, since, limit, changes)
        return page

    async def _sync(self, user: str, since: int, limit: int, changes: bool
                    ) -> tuple[SyncPage, bool]:
        """A page, and whether the bound held its cursor back whole.

        The cursor's horizon and bound are taken before anything is read: a send
        in flight now may be stored, and no longer in flight, by the time slow
        reads end, after they went by its mid; a bound taken then would pass it
        by. A full page may take the cursor past the settle horizon, never past
        the bound (``core.cursors``)."""
        horizon = mid_for_time_ms(int(time.time() * 1000) - self.sync_settle_ms)
        low = self.low_mark()
        bound = None if low is None else low - 1
        rows = await self.chat.sync_rows(user, since, limit + 1)
        extra, cut, groups = await self.groups.sync_rd(user, since, limit)
        self.charge(user, groups)
        changed: list[tuple[int, Any]] = []
        log_read = True
        if changes:
            try:
                changed = await self._changed(user, since, limit + 1)
            except Unavailable:  # (Redis is down) the cursor stays: they come later
                log_read = False
        if cut is not None:  # the groups' side stopped below it: so does this page
            rows = [r for r in rows if r[0] < cut]
            changed = [r for r in changed if r[0] < cut]
        msgs, positions, more = inbox.merge_sync(rows, [*extra, *changed], limit)
        mids = [m["mid"] if isinstance(m, dict) else p for m, p in zip(msgs, positions,
                                                                        strict=True)]
        msgs = await self._with_reactions(msgs, mids)
        mids = positions
        more = more or cut is not None
        if not log_read:
            return SyncPage(msgs, since, more), False
        cursor = next_cursor(since, mids, more, horizon, bound)
        held = more and cursor == since and bound is not None and bool(mids) and mids[0] > bound
        return SyncPage(msgs, cursor, more), held

    async def _changed(self, user: str, since: int, limit: int) -> list[tuple[int, Any]]:
        """(position, the message as it is now) of the messages changed after
        ``since`` (edited, reacted to, recalled) that a device syncing from there
        already had (mid at most ``since``: the others come as themselves)."""
        if self.changes is None or since == 0:
            return []
        mine = await self.groups.memberships(user)
        log = [c for c in await self.changes.since(user, dict.fromkeys(mine, 0), since, limit)
               if c[1] <= since]
        if not log:
            return []
        now = {**await self.chat.current(user, [mid for _, mid, g in log if g is None]),
               **await self.groups.current(mine, [mid for _, mid, g in log if g is not None])}
        return [(position, now[mid]) for position, mid, _ in log if mid in now]

    async def total_unread(self, user: str) -> int:
        """Unread over every conversation (what ``offline.msg`` events carry)."""
        total = await self.chat.total_unread(user)
        group_total, _, groups = await self.groups.conversation_rows(user, 0)
        self.charge(user, groups)
        return total + group_total

    async def conversations(self, user: str, limit: int, cursor: str | None = None
                            ) -> dict[str, Any]:
        """1:1 conversations and groups, newest first, ``limit`` a page; the
        total covers both. ``cursor``: the previous page's."""
        after = None if cursor is None else _position(user, cursor)
        mine = await self.settings.of_user(user) if self.settings is not None else {}
        pinned = {c for c, v in mine.items() if v.pinned}
        # Pinned conversations lead the first page and are left out of the
        # others: each side reads as many more rows as there are.
        extra = len(pinned)
        total, direct = await self.chat.conversation_rows(user, limit + extra, after)
        group_total, group_rows, groups = await self.groups.conversation_rows(
            user, limit + extra, after)
        self.charge(user, groups)
        rows, last = inbox.conversation_page(
            [r for r in [*direct, *group_rows] if r[0][1] not in pinned], limit, after)
        if pinned and after is None:
            top = [*await self.chat.rows_of(user, sorted(c for c in pinned
                                                         if not c.startswith(GROUP_PREFIX))),
                   *await self.groups.rows_of(user, sorted(c[len(GROUP_PREFIX):] for c in pinned
                                                           if c.startswith(GROUP_PREFIX)))]
            rows = [row for _, row in sorted(top, key=lambda r: r[0], reverse=True)] + rows
        for row in rows:
            value = mine.get(row["conv"], ConvSettings())
            row.update(muted=value.muted, pinned=value.pinned, archived=value.archived)
        return {"total_unread": total + group_total, "conversations": rows,
                "cursor": None if last is None else encode_cursor(
                    _scope(user), f"{last[0]}|{last[1]}")}


def _scope(user: str) -> str:
    return f"conversations:{user}"


def _position(user: str, cursor: str) -> Position:
    """The position a cursor of ``user``'s conversation list carries."""
    try:
        mid, _, conv = decode_cursor(_scope(user), cursor).partition("|")
        return int(mid), conv
    except (BadCursor, ValueError):
        raise ProtocolError("bad_request", "cursor: not a cursor of this list") from None
