"""Group chat: the send path with per-group seq, unread, reads, history.
(Membership, name, owner and dissolve are ``gateway.groups.admin``.)

Send: member? -> dedup on (sender, cmid) -> mid -> (batched) seqs from the
group's counter in MongoDB (one ``$inc`` per group per batch) -> one copy of
each message in ``group_msgs`` -> small groups (at most
``IM_GROUP_WRITE_DIFFUSION_MAX`` members) also get a box entry and an offline
entry per member (``gateway.groups.diffusion``); bigger ones nothing more (members
read the group by mid: read diffusion) -> the group's state in Redis ->
``ack`` with ``seq`` -> one push envelope per node holding members.

Unread of a group = its seq - the member's read seq: a message costs the
same O(1) counter work whatever the member count. The arithmetic and the
batch bookkeeping are ``core.groupseq`` and ``core.inbox`` (pure).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson

from core import dedup, groupseq, inbox
from core.batcher import Batcher
from core.errors import Unavailable
from core.ids import mid_time_ms, node_of
from core.inbox import Position
from core.inflight import InFlight
from core.paging import seek_page
from core.ttl_cache import TtlCache
from gateway.chat.claims import Claims
from gateway.chat.service import REDELIVER_PAGE, REPUSH_WINDOW_S, IdSource, Vet
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.frames import encode_group, group_frame
from gateway.groups.diffusion import GroupDiffusion
from gateway.metrics import NodeMetrics
from store.errors import GroupGone
from store.ports import GroupCache, GroupNews, GroupStore, OfflineStore
from store.records import Erasure, GroupMessage, Membership

__all__ = ["GroupSendResult", "GroupService"]

log = logging.getLogger("gateway.groups.service")
# Groups a sync reads from MongoDB in one call (those holding its next
# messages, known from their indexes): its work whatever the user's groups.
SYNC_GROUP_READS = 16
# A user in this many groups or more has its groups' numbers, as its
# conversation list read them, kept for VIEW_S on the node (its own reads and
# sends here update them in place): a list asked for again and again reads
# them once.
VIEW_MIN_GROUPS = 200
VIEW_S = 2.0


@dataclass(slots=True)
class _GroupList:
    """A user's groups in its conversation list: the total unread over them and
    (position, unread) of each, sorted."""

    total: int
    index: inbox.ConversationIndex[int]

    def update(self, group: str, unread: int, mid: int | None = None) -> None:
        """The user's own send (``mid``) or read changed a group's unread."""
        old = self.index.update(f"g:{group}", unread, mid)
        if old is not None:
            self.total += unread - old


@dataclass(frozen=True, slots=True)
class GroupSendResult:
    mid: int
    seq: int
    ts: int
    frame: bytes | None  # None for a duplicate with nothing to push
    diffused: bool = False  # write diffusion: each member got a box entry
    repeat: bool = False  # a resend's push again: no events


@dataclass(frozen=True, slots=True)
class _Pending:
    group: str
    sender: str
    cmid: str
    body: Any
    mid: int
    reply_to: int = 0


@dataclass(frozen=True, slots=True)
class _Stored:
    msg: GroupMessage
    frame: bytes  # encoded once: pushed, diffused, kept as the group's last


@dataclass(frozen=True, slots=True)
class GroupLimits:
    """Batching of group sends, and the size up to which a group's messages are
    written to each member's box (``IM_GROUP_WRITE_DIFFUSION_MAX``)."""

    batch_max: int
    pending_max: int
    mongo_linger_ms: float
    write_diffusion_max: int
    news_sync: bool = True  # IM_GROUP_NEWS_SYNC: syncs read the index of groups with news

    @classmethod
    def from_settings(cls, s: Settings) -> GroupLimits:
        return cls(s.batch_max, s.pending_max, s.mongo_linger_ms, s.group_write_diffusion_max,
                   bool(s.group_news_sync))


class GroupService:
    """Groups for one node; knows nothing of sockets."""

    def __init__(self, store: GroupStore, cache: GroupCache, claims: Claims, mids: IdSource,
                 diffusion: GroupDiffusion, offline: OfflineStore, limits: GroupLimits,
                 metrics: NodeMetrics, inflight: InFlight | None = None,
                 news: GroupNews | None = None) -> None:
        self.store = store
        self.news = news  # each user's groups with news (None: a sync reads them all)
        self.news_sync = limits.news_sync  # IM_GROUP_NEWS_SYNC: syncs read from it
        self.inflight = inflight if inflight is not None else InFlight()
        self.unfinished: Callable[[list[int]], None] | None = None  # as ChatService's
        self.cache = cache
        self.claims = claims
        self.mids = mids
        self.diffusion = diffusion
        self.offline = offline
        self.metrics = metrics
        self.wd_max = limits.write_diffusion_max
        self._writes: Batcher[_Pending, _Stored] = Batcher(
            self._flush, name="mongo", max_batch=limits.batch_max,
            max_pending=limits.pending_max, linger_s=limits.mongo_linger_ms / 1000,
            observe=metrics.stage_observer("group"))
        self._repairs: set[asyncio.Task[None]] = set()
        self._views: TtlCache[str, _GroupList] = TtlCache(10_000)

    # -- send ----------------------------------------------------------------------
    async def send(self, sender: str, group: str, cmid: str, body: Any, *,
                   as_server: bool = False, vet: Vet | None = None,
                   reply_to: int = 0) -> GroupSendResult:
        """``as_server``: the product's backend sends as ``sender``, who need not
        be a member (the group must exist). A dissolved group is ``not_found``:
        here when it is seen, else when its seq is allocated (``_flush``)."""
        if as_server or not await self.cache.is_member(group, sender):
            doc = await self.store.get(group)
            if doc is None or doc.get("dissolved"):
                raise ProtocolError("not_found", "no such group")
            if not as_server:
                raise ProtocolError("forbidden", "not a member of this group")
        if reply_to and await self.store.message(group, reply_to) is None:
            raise ProtocolError("bad_request", "reply_to must be a message of this conversation")
        mid = self.mids.next()
        # Sync cursors stay below it from now until it is acked: the claim and the
        # product's hook may take longer than the settle time.
        self.inflight.add(mid)
        try:
            prior = await self.claims.claim(sender, cmid, mid)
            if prior is not None and prior.acked:
                self.inflight.done(mid)
                if prior.seq is not None:
                    return await self._repeat(group, prior.mid, prior.seq)
                raise ProtocolError("bad_request", "cmid was used for a 1:1 message")
            # In flight or failed earlier: a fresh mid, as for 1:1 (ChatService.send).
            if vet is not None:  # the product's hook (not asked again for an acked resend)
                body = await vet(body)
        except BaseException:
            self.inflight.done(mid)  # nothing was written under it
            raise
        try:
            done = await self._writes.submit(_Pending(group, sender, cmid, body, mid, reply_to))
        except BaseException:
            self.inflight.failed(mid, time.monotonic())
            if self.unfinished is not None:  # maybe stored: finished by the node
                self.unfinished([mid])
            raise
        self.inflight.done(mid)
        m = done.msg  # for a resend MongoDB already had: its original mid
        return GroupSendResult(m.mid, m.seq, mid_time_ms(m.mid), done.frame, m.wd)

    async def redeliver(self, node_id: int, low: int, high: int,
                        push: Callable[[str, bytes], None] | None = None) -> int:
        """Record the group messages node ``node_id`` stored with ``low <= mid <=
        high``: the group's state, write-diffused members' boxes and offline
        entries, the senders' sends acked (as ``ChatService.redeliver`` for 1:1:
        a node that died between storing a message and recording it leaves it
        where sync cursors pass it by). Idempotent; returns how many. ``push``:
        told each group and frame once recorded."""
        done = 0
        while low <= high:
            msgs = await self.store.between(low, high, REDELIVER_PAGE)
            ours = [_Stored(m, encode_group(m)) for m in msgs
                    if node_of(m.mid) == node_id and not m.recalled]
            if ours:
                await self.diffusion.diffuse([(s.msg, s.frame) for s in ours if s.msg.wd])
                await self._record(ours)
                if push is not None:
                    for st in ours:
                        push(st.msg.group, st.frame)
                done += len(ours)
            if len(msgs) < REDELIVER_PAGE:
                break
            low = msgs[-1].mid + 1
        return done

    async def _repeat(self, group: str, mid: int, seq: int) -> GroupSendResult:
        """A resend of an acked group message: the same mid and seq, and its push
        again while it is recent (``REPUSH_WINDOW_S``, as for 1:1)."""
        ts = mid_time_ms(mid)
        if time.time() * 1000 - ts > REPUSH_WINDOW_S * 1000:
            return GroupSendResult(mid, seq, ts, None)
        try:
            m = await self.store.message(group, mid)
        except Unavailable as exc:
            log.warning("no push again for a resent group message: %s", exc)
            return GroupSendResult(mid, seq, ts, None)
        if m is None or m.recalled:
            return GroupSendResult(mid, seq, ts, None)
        return GroupSendResult(mid, seq, ts, encode_group(m), m.wd, repeat=True)

    async def _flush(self, items: list[_Pending]) -> list[_Stored | BaseException]:
        by_group = groupseq.by_group([it.group for it in items])
        sizes = await self.cache.sizes(by_group)
        small = {g for g, n in sizes.items() if n <= self.wd_max}
        ends = await asyncio.gather(*(
            self.store.allocate(g, len(idx), max(items[i].mid for i in idx),
                                0 if g in small else max(items[i].mid for i in idx))
            for g, idx in by_group.items()), return_exceptions=True)
        out: list[_Stored | BaseException] = [Unavailable("mongo")] * len(items)
        allocated: list[GroupMessage] = []
        where: list[int] = []
        for (g, idx), end in zip(by_group.items(), ends, strict=True):
            if isinstance(end, BaseException):
                for i in idx:  # dissolved: nothing taken, nothing stored
                    out[i] = (ProtocolError("not_found", "no such group")
                              if isinstance(end, GroupGone) else end)
                continue
            for i, seq in groupseq.assign(idx, end):
                it = items[i]
                allocated.append(GroupMessage(g, seq, it.mid, it.sender, it.cmid, it.body,
                                              g in small, reply_to=it.reply_to))
                where.append(i)
        if not allocated:
            return out
        try:
            stored = await self.store.insert(allocated)
        except Exception:  # down, or an item it refused: nothing of the batch is acked
            self._repair(allocated)  # their seqs get tombstones (once MongoDB is back)
            raise
        ok: list[_Stored] = []
        for i, m in zip(where, stored, strict=True):
            if isinstance(m, GroupMessage):
                done = _Stored(m, encode_group(m))
                ok.append(done)
                out[i] = done
            else:
                out[i] = m
        await self.diffusion.diffuse([(s.msg, s.frame) for s in ok if s.msg.wd])
        await self._record(ok)
        return out

    async def _record(self, stored: list[_Stored]) -> None:
        """The groups' state in Redis, the senders' read seqs (their own messages
        are not unread to them), then the senders' dedup keys (acked)."""
        frames = {id(s.msg): s.frame for s in stored}
        summary = groupseq.summarize([s.msg for s in stored])
        await self.cache.record([(g, m.seq, m.mid, frames[id(m)], summary.rdmid.get(g, 0))
                                 for g, m in summary.newest.items()], summary.reads,
                                [(s.msg.group, s.msg.mid, s.msg.seq, s.frame) for s in stored
                                 if not s.msg.wd])
        await self._mark_news(stored)
        now = time.monotonic()
        for user, g, seq in summary.reads:  # its own messages are read: its list changed
            found, view = self._views.get(user, now)
            if found and view is not None:  # (a concurrent message elsewhere shows later)
                newest = summary.newest[g]
                view.update(g, max(0, newest.seq - seq), newest.mid)
        self._later(self.store.set_reads(summary.reads))  # only Redis' rebuild needs it
        await self.offline.deliver([], [(s.msg.sender, s.msg.cmid,
                                         dedup.done(s.msg.mid, s.msg.seq)) for s in stored],
                                   routes=False)

    async def _mark_news(self, stored: list[_Stored]) -> None:
        """The read-diffused groups of a batch are news to their members (before
        the sends are acked: a sync that follows an ack finds the group)."""
        newest: dict[str, int] = {}
        for s in stored:
            if not s.msg.wd:
                newest[s.msg.group] = max(newest.get(s.msg.group, 0), mid_time_ms(s.msg.mid))
        if self.news is None or not newest:
            return
        due = await self.news.due(newest)
        if due:
            await self.news.mark({g: newest[g] for g in due}, await self.cache.members(due))

    def _later(self, work: Coroutine[Any, Any, None]) -> None:
        """Durable copies nobody waits for. Bounded: past 1,000 pending the write
        is skipped (a later send of the same member carries a higher read seq)."""
        async def run() -> None:
            try:
                await work
            except Unavailable as exc:
                log.warning("deferred group write failed: %s", exc)

        if len(self._repairs) > 1000:
            work.close()
            return
        self._track(asyncio.create_task(run()))

    def _repair(self, msgs: list[GroupMessage]) -> None:
        async def fill() -> None:
            for _ in range(300):
                try:
                    await self.store.fill(msgs)
                    return
                except Unavailable:
                    await asyncio.sleep(1.0)
            log.error("seqs %s stay unfilled", [(m.group, m.seq) for m in msgs][:10])

        self._track(asyncio.create_task(fill()))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._repairs.add(task)
        task.add_done_callback(self._repairs.discard)

    async def close(self) -> None:
        await self._writes.close()
        if self._repairs:
            await asyncio.wait(self._repairs, timeout=5)

    # -- recall ----------------------------------------------------------------------
    async def recall(self, user: str, mid: int) -> GroupMessage:
        """``user``'s group message ``mid`` becomes a tombstone: MongoDB first (the
        truth), then the group's state (members' unread leaves it out) and, for
        a write-diffusion group, each member's offline entry (one round trip)."""
        m = await self.store.recall(mid, user)
        if m is None:
            if await self.store.sender_of(mid) is None:
                raise ProtocolError("not_found", "no such message")
            raise ProtocolError("forbidden", "only the sender may recall a message")
        tomb = encode_group(m)
        await self.cache.recalled(m.group, m.seq, m.mid, tomb)
        if m.wd:
            members = (await self.cache.members([m.group])).get(m.group, [])
            await self.offline.erase([Erasure(u, f"g:{m.group}", mid, True, tomb)
                                      for u in members])
        return m

    # -- reading ---------------------------------------------------------------------
    async def _membership(self, user: str, group: str, *, former: bool = False
                          ) -> tuple[int, int]:
        """``former``: a member of a group since dissolved counts (history)."""
        mine: Membership | None = (await self.cache.user_groups(user)).get(group)
        if mine is None and former:
            mine = await self.store.former(group, user)
        if mine is None:
            raise ProtocolError("forbidden", "not a member of this group")
        return mine.from_seq, mine.read_seq

    async def read(self, user: str, group: str, mid: int) -> int:
        """Read up to ``mid``; returns the group's unread count after it."""
        from_seq, _ = await self._membership(user, group)
        seq = await self.store.seq_of(group, mid)
        if seq is None:
            raise ProtocolError("not_found", "no such message in this group")
        read = await self.cache.set_read(user, group, max(seq, from_seq))
        if read is None:
            raise ProtocolError("forbidden", "not a member of this group")
        await self.store.set_reads([(user, group, read)])
        state = (await self.cache.states([group]))[group]
        unread = inbox.group_unread(state.seq, read, from_seq, state.recalled)
        found, view = self._views.get(user, time.monotonic())
        if found and view is not None:  # its list shows the read at once
            view.update(group, unread)
        return unread

    async def memberships(self, user: str) -> dict[str, Membership]:
        return await self.cache.user_groups(user)

    async def current(self, mine: dict[str, Membership], mids: list[int]
                      ) -> dict[int, dict[str, Any]]:
        """The frames of these group messages now, those of the user's groups
        sent after it joined (``mine``: its memberships)."""
        found = await self.store.by_mids(mids)
        return {mid: group_frame(m) for mid, m in found.items()
                if m.group in mine and m.seq > mine[m.group].from_seq}

    async def history(self, user: str, group: str, before: int | None, limit: int
                      ) -> tuple[list[dict[str, Any]], int | None]:
        from_seq, _ = await self._membership(user, group, former=True)
        msgs = await self.store.page(group, from_seq=from_seq, before=before, limit=limit + 1)
        page, cursor = seek_page(msgs, limit, lambda m: m.mid)
        return [group_frame(m) for m in page], cursor

    async def _view(self, user: str) -> tuple[_GroupList, int]:
        """The user's groups as its conversation list shows them (``VIEW_S`` old
        at most for a user in ``VIEW_MIN_GROUPS`` groups or more: such a list
        asked for again and again costs a page each time, not a pass over
        every group); and how many groups it read for it (0: kept)."""
        now = time.monotonic()
        found, view = self._views.get(user, now)
        if found and view is not None:
            return view, 0
        mine = await self.cache.user_groups(user)
        states = await self.cache.states(mine, last=False) if mine else {}
        total = 0
        marks: list[tuple[Position, int]] = []
        for g, st in states.items():
            m = mine[g]
            unread = inbox.group_unread(st.seq, m.read_seq, m.from_seq, st.recalled)
            total += unread
            shown = st.lastmid > 0 and st.seq > m.from_seq  # else sorts last (mid 0)
            marks.append(((st.lastmid if shown else 0, f"g:{g}"), unread))
        view = _GroupList(total, inbox.ConversationIndex(marks))
        if len(mine) >= VIEW_MIN_GROUPS:
            self._views.set(user, view, now + VIEW_S)
        return view, len(mine)

    async def sync_rd(self, user: str, since: int, limit: int
                      ) -> tuple[list[tuple[int, dict[str, Any]]], int | None, int]:
        """(mid, frame) of read-diffused group messages after ``since`` (write-diffused
        ones are in the user's own offline store and box), oldest first, at most
        ``limit + 1`` (one more than a page: "more" is known); and the cut
        (``inbox.RdPlan``): the page stops below it; and how many groups it
        read (the call's cost grows with it): those with news after ``since``
        (``GroupNews``), or all the user's groups when that index is not complete.

        The groups' indexes say which groups hold the next messages, so at most
        ``SYNC_GROUP_READS`` groups are read from MongoDB, whatever the number of
        the user's groups with news; a group whose index does not reach back to
        ``since`` is read as well (and its index rebuilt for the next call)."""
        mine, seeding = await self._groups_with_news(user, since)
        states = await self.cache.states(mine, last=False) if mine else {}
        if seeding and self.news is not None:
            await self.news.seed(user, {g: mid_time_ms(st.rdmid)
                                        for g, st in states.items() if st.rdmid})
        busy = inbox.busy_groups({g: st.rdmid for g, st in states.items()}, since)
        if not busy:  # (no groups at all: none)
            return [], None, len(mine)
        indexed = await self.cache.rd_after({g: mine[g].from_seq for g in busy}, since,
                                            limit + 1)
        known = {g: e for g, e in indexed.items() if e is not None}
        unknown = [g for g in busy if indexed[g] is None]
        plan = inbox.rd_plan(known, {g: mine[g].from_seq for g in busy}, limit,
                             SYNC_GROUP_READS)
        kept = await self._kept_frames({g: [seq for _, seq in known[g][:n]]
                                        for g, n in plan.reads.items()})
        reads = [*((g, n) for g, n in plan.reads.items() if g not in kept),
                 *((g, limit + 1) for g in unknown)]
        pages = await asyncio.gather(*(
            self.store.page(g, from_seq=mine[g].from_seq, after=since, limit=count,
                            only_rd=True) for g, count in reads))
        self.metrics.group_sync_pages.labels("redis").inc(len(kept))
        self.metrics.group_sync_pages.labels("mongo").inc(len(reads))
        for g in unknown[:SYNC_GROUP_READS]:
            self._later(self.cache.rebuild_rd(g))
        cut = plan.cut
        rows = inbox.merge_group_pages(
            [*([(m.mid, group_frame(m)) for m in page] for page in pages),
             *([(mid, orjson.loads(f)) for (mid, _), f in zip(known[g], frames, strict=False)]
               for g, frames in kept.items())], limit + 1, below=cut)
        return rows, cut, len(mine)

    async def _kept_frames(self, wanted: dict[str, list[int]]) -> dict[str, list[bytes]]:
        """The planned groups' messages are those of their indexes: the groups
        whose frames Redis keeps for all of them (the others are read from
        MongoDB; all of them when Redis fails here)."""
        if not wanted:
            return {}
        try:
            got = await self.cache.rd_frames(wanted)
        except Unavailable:
            return {}
        return {g: frames for g, frames in got.items() if frames is not None}

    async def _groups_with_news(self, user: str, since: int
                                ) -> tuple[dict[str, Membership], bool]:
        """The user's groups that may have read-diffused messages after
        ``since`` (its index of groups with news), or all its groups when the
        index is not complete; and whether the caller must seed it."""
        if self.news is None:
            return await self.cache.user_groups(user), False
        if not self.news_sync:  # rolling out from a release without the index: none
            return await self.cache.user_groups(user), False  # is opened, none read
        try:
            news = await self.news.news(user, mid_time_ms(since))
        except Unavailable:  # Redis is down: as without an index (nothing to seed)
            return await self.cache.user_groups(user), False
        if news is None:
            return await self.cache.user_groups(user), True
        return await self.cache.user_groups_among(user, news), False

    async def rows_of(self, user: str, groups: list[str]
                      ) -> list[tuple[Position, dict[str, Any]]]:
        """The conversation-list rows of these groups of the user (pinned ones)."""
        view, read = await self._view(user)
        found = [row for g in groups if (row := view.index.find(f"g:{g}")) is not None]
        return await self._rows(found)

    async def _rows(self, head: list[tuple[Position, int]]
                    ) -> list[tuple[Position, dict[str, Any]]]:
        full = await self.cache.states([pos[1][2:] for pos, _ in head if pos[0]])
        rows: list[tuple[Position, dict[str, Any]]] = []
        for (mid, conv), unread in head:
            known = full.get(conv[2:])
            last = known.last if known is not None and mid else None
            rows.append(((mid, conv), {"conv": conv, "unread": unread,
                                       "last": orjson.Fragment(last) if last else None}))
        return rows

    async def conversation_rows(self, user: str, limit: int, after: Position | None = None
                                ) -> tuple[int, list[tuple[Position, dict[str, Any]]], int]:
        """(total unread over the user's groups, [(position, row)]): the ``limit +
        1`` newest groups after ``after``. Every group's numbers are read (one
        small hash read each, for the total; kept ``VIEW_S`` for a user in many
        groups), the newest message only of the groups listed; and how many
        groups were read."""
        view, read = await self._view(user)
        if not len(view.index):
            return 0, [], read
        head = view.index.newest(limit + 1, after)
        return view.total, await self._rows(head), read
