"""One reader's view of all its conversations: the 1:1-vs-group dispatch on
``g:`` and the merges of both sides (sync, history, conversations, read).

The decisions are ``core.inbox``'s (pure); this facade only asks ``ChatService``
and ``GroupService`` for their halves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from core import inbox
from core.cursors import next_cursor
from core.errors import Unavailable
from core.ids import mid_for_time_ms, mid_time_ms
from core.inbox import Position
from core.inflight import SHARE_S
from core.seek_cursor import BadCursor, decode_cursor, encode_cursor
from gateway.chat.service import ChatService
from gateway.errors import ProtocolError
from gateway.groups.service import GroupService
from gateway.inbox.reactions import Reactions
from store.ports import ChangeLog, ConvSettingStore
from store.records import ConvSettings

__all__ = ["HELD_WAIT_S", "Conversations", "SyncPage"]

log = logging.getLogger("gateway.inbox")

GROUP_PREFIX = "g:"
# A call that reads each of the caller's groups (a sync without its index of
# groups with news, its group list, its conversation list: the last two kept a
# moment on the node for a user in many groups) costs one more call of its
# HTTP budget per this many groups read.
GROUPS_PER_CALL = 1000
# How long a full page held whole below a send in flight waits for the bound to
# move (four of the marks' shares), and how often it looks.
HELD_WAIT_S = 4 * SHARE_S
HELD_POLL_S = 0.05
# A mark older than this is not waited for: sends land in milliseconds to a
# second or two; an older one is a send that failed (its mark lingers) or stuck.
HELD_MARK_AGE_MS = 5_000


@dataclass(frozen=True, slots=True)
class SyncPage:
    msgs: list[Any]  # orjson.Fragment (stored bytes) or dicts (from MongoDB)
    next: int
    more: bool


def _mids(msgs: list[Any], positions: list[int]) -> list[int]:
    return [m["mid"] if isinstance(m, dict) else p for m, p in zip(msgs, positions, strict=True)]


class Conversations:
    def __init__(self, chat: ChatService, groups: GroupService, sync_settle_ms: int,
                 low_mark: Callable[[], int | None] = lambda: None,
                 reactions: Reactions | None = None,
                 settings: ConvSettingStore | None = None,
                 changes: ChangeLog | None = None, *, held_wait_s: float = 0.0,
                 held_mark_age_ms: int | None = HELD_MARK_AGE_MS,
                 live_mark: Callable[[], int | None] | None = None) -> None:
        self.chat = chat
        self.groups = groups
        self.reactions = reactions  # counts added to sync and history (None: none)
        self.settings = settings  # muted / pinned / archived (None: none)
        self.changes = changes  # messages changed after a cursor (None: not looked for)
        self.sync_settle_ms = sync_settle_ms
        # The oldest mid a send on any node may still store (``core.inflight``).
        self.low_mark = low_mark
        # How long a full page held whole below that mark waits for it to move
        # (``sync``); 0: not at all, the page passes it at once. A mark older than
        # ``held_mark_age_ms`` is not waited for (None: any is; tests on a clock
        # of their own).
        self.held_wait_s = held_wait_s
        self.held_mark_age_ms = held_mark_age_ms
        # The oldest mid of a send under way on any node (failed ones left out:
        # their marks linger): what a full page stops below. None: ``low_mark``.
        self.live_mark = live_mark if live_mark is not None else low_mark
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

        A full page's cursor stops below a send under way on any node (the
        bound: just below the live mark, which leaves out failed sends whose
        marks linger) and the page ends there, so a client walking pages gets
        no message twice. A full page that lies whole above
        the bound waits for it to move, up to ``held_wait_s`` (the marks are
        shared every ``core.inflight.SHARE_S``; most holds are a send that lands
        in milliseconds, or another node's mark as of its last share), and is
        read again then; still held after that, or held by a mark older than
        ``HELD_MARK_AGE_MS``, the page is answered as a full page always was,
        its cursor at its last message: a client walking pages always moves."""
        page, held = await self._sync(user, since, limit, changes, bounded=True)
        if held is None:
            return page
        deadline = time.monotonic() + self.held_wait_s
        age = self.held_mark_age_ms
        while True:
            low = self.live_mark()
            if low is None or low - 1 >= held:  # the bound moved: read again
                page, held = await self._sync(user, since, limit, changes, bounded=True)
                if held is None:
                    return page
            elif age is not None and mid_time_ms(low) < time.time() * 1000 - age:
                break  # a send under way that long is stuck: not waited for
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(HELD_POLL_S)
        log.info("a sync of %s held below a send that may still land: its page passes it",
                 user)
        page, _ = await self._sync(user, since, limit, changes, bounded=False)
        return page

    async def _sync(self, user: str, since: int, limit: int, changes: bool, *,
                    bounded: bool) -> tuple[SyncPage, int | None]:
        """A page, and (when ``bounded``) the mid its cursor is held below whole
        (None: not held).

        The cursor's horizon and bound are taken before anything is read: a send
        in flight now may be stored, and no longer in flight, by the time slow
        reads end, after they went by its mid; a bound taken then would pass it
        by. A page that is not full never passes the settle horizon nor the
        low mark; a full one may pass the horizon, and the live mark only when
        not ``bounded`` (``core.cursors``)."""
        horizon = mid_for_time_ms(int(time.time() * 1000) - self.sync_settle_ms)
        low, live = self.low_mark(), self.live_mark()
        bound = None if low is None else low - 1
        full_bound = None if live is None else live - 1
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
        more = more or cut is not None
        if not log_read:
            msgs = await self._with_reactions(msgs, _mids(msgs, positions))
            return SyncPage(msgs, since, more), None
        if bound is not None and not more:
            horizon = min(horizon, bound)
        cursor = next_cursor(since, positions, more, horizon,
                             full_bound if bounded and more else None)
        if more and full_bound is not None and bounded:
            if cursor == since and positions:
                held = positions[0]
                return SyncPage([], since, more), held
            keep = [i for i, p in enumerate(positions) if p <= cursor]  # the rest: next page
            msgs, positions = [msgs[i] for i in keep], [positions[i] for i in keep]
        msgs = await self._with_reactions(msgs, _mids(msgs, positions))
        return SyncPage(msgs, cursor, more), None

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
