"""1:1 chat: the send path, offline acks, 1:1 read marks, and the 1:1 side of
sync, history and conversations (``Conversations`` merges in the groups').

Send (docs/architecture.md): dedup on (sender, cmid) -> mid -> body and both
box entries in MongoDB -> both users' offline stores, unread and conversation
lists in Redis -> only then ``ack``. Each stage is a ``Batcher``, so under
load many sends share one round trip per stage.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from core import dedup
from core.batcher import Batcher
from core.errors import Unavailable
from core.ids import mid_time_ms
from core.inbox import Position
from core.inflight import InFlight
from core.paging import seek_page
from gateway.chat.claims import Claims
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.frames import (
    conversation_last,
    encode,
    frame_of,
    msg_frame,
    preview,
    tombstone,
)
from gateway.metrics import NodeMetrics
from store.ports import MessageStore, OfflineStore, RouteStore
from store.records import ChatMessage, ConversationRow, Delivery, Erasure

__all__ = ["REPUSH_WINDOW_S", "ChatService", "IdSource", "Pushed", "SendResult"]

log = logging.getLogger("gateway.chat.service")

# A resend of an acked cmid pushes the message again while it is this recent:
# the first ack may have been lost with the node that sent it, and the push
# with it (devices drop repeats by mid). Older resends are answered only.
REPUSH_WINDOW_S = 60.0
REDELIVER_PAGE = 2000  # messages read at once when a dead node's sends are put right
FILL_READ = 1000  # box entries a sync reads from MongoDB when it can refill the offline store


class IdSource(Protocol):
    """Time-ordered unique ids (``core.ids.MidGenerator``)."""

    def next(self) -> int: ...


@dataclass(frozen=True, slots=True)
class SendResult:
    mid: int
    ts: int
    frame: bytes | None  # the push frame; None for a duplicate with nothing to push
    sender_routes: dict[str, str] | None = None  # connection -> node
    receiver_routes: dict[str, str] | None = None
    repeat: bool = False  # a resend's push again: no events, nothing counted


# A send's body as the product's hook has it (gateway.hooks): the same, another,
# or ProtocolError (rejected) / Unavailable (the hook failed).
Vet = Callable[[bytes], Awaitable[bytes]]
# A redelivered message, its frame, the sender's and the receiver's routes.
Pushed = Callable[[ChatMessage, bytes, dict[str, str], dict[str, str]], None]


@dataclass(frozen=True, slots=True)
class _Outgoing:
    msg: ChatMessage
    frame: bytes


@dataclass(frozen=True, slots=True)
class ChatLimits:
    """The batching a 1:1 send goes through (``IM_BATCH_MAX``, ``IM_PENDING_MAX``,
    ``IM_MONGO_LINGER_MS``, ``IM_MONGO_INFLIGHT``)."""

    batch_max: int
    pending_max: int
    mongo_linger_ms: float
    mongo_inflight: int

    @classmethod
    def from_settings(cls, s: Settings) -> ChatLimits:
        return cls(s.batch_max, s.pending_max, s.mongo_linger_ms, s.mongo_inflight)


class ChatService:
    """Orchestrates the stores for 1:1 chat; knows nothing of sockets."""

    def __init__(self, claims: Claims, messages: MessageStore, offline: OfflineStore,
                 routes: RouteStore, mids: IdSource, limits: ChatLimits,
                 metrics: NodeMetrics, inflight: InFlight | None = None) -> None:
        self.claims = claims
        self.inflight = inflight if inflight is not None else InFlight()
        # Told the mids of a send that failed after its message may have been
        # stored (``UnfinishedSends.add``).
        self.unfinished: Callable[[list[int]], None] | None = None
        self.messages = messages
        self.offline = offline
        self.routes = routes
        self.mids = mids
        self.metrics = metrics
        mb, mp = limits.batch_max, limits.pending_max
        # MongoDB's cost per call dominates at small batches, so the write stage
        # lingers briefly (IM_MONGO_LINGER_MS) to let a batch fill.
        self._writes: Batcher[ChatMessage, int] = Batcher(
            self.messages.store_batch, name="mongo",
            linger_s=limits.mongo_linger_ms / 1000, concurrency=limits.mongo_inflight,
            observe=metrics.stage_observer("mongo"), max_batch=mb, max_pending=mp)
        self._deliveries: Batcher[_Outgoing, tuple[dict[str, str], dict[str, str]]] = Batcher(
            self._flush_deliveries, name="redis", observe=metrics.stage_observer("redis"),
            max_batch=mb, max_pending=mp)
        # Read marks go to MongoDB (what unread is rebuilt from once Redis let it
        # expire), many users' in one bulk write.
        self._reads: Batcher[tuple[str, str, int], None] = Batcher(
            self._flush_reads, name="reads", max_batch=mb, max_pending=mp)

    # -- send ----------------------------------------------------------------
    async def send(self, sender: str, to: str, cmid: str, body: Any, *,
                   vet: Vet | None = None, reply_to: int = 0) -> SendResult:
        """Store a message durably; raises ``Unavailable`` if that cannot be done.
        ``vet`` (the product's hook) decides on the body before it is stored,
        and is not asked again for a resend already acked. ``reply_to``: a
        message of this conversation (else ``bad_request``, nothing stored)."""
        if to == sender:
            raise ProtocolError("bad_request", "to must be another user")
        if to.startswith("g:"):
            raise ProtocolError("bad_request", "ids starting with 'g:' name groups")
        if reply_to:
            quoted = await self.messages.get(reply_to)
            if quoted is None or {quoted.sender, quoted.to} != {sender, to}:
                raise ProtocolError("bad_request",
                                    "reply_to must be a message of this conversation")
        mid = self.mids.next()
        # Sync cursors stay below it from now until it is acked: the claim and the
        # product's hook may take longer than the settle time.
        self.inflight.add(mid)
        try:
            prior = await self.claims.claim(sender, cmid, mid)
            if prior is not None and prior.seq is not None:
                raise ProtocolError("bad_request", "cmid was used for a group message")
            if prior is not None and prior.acked:  # acked before: same mid, nothing stored
                self.inflight.done(mid)
                self.metrics.sends.labels("duplicate").inc()
                return await self._repeat(prior.mid)
            # In flight or failed earlier (maybe on a node that died): redone under
            # this send's fresh mid, as the old one may be below sync cursors handed
            # out meanwhile; MongoDB's unique (from, cmid) gives back the old one if
            # that attempt stored the message.
            if vet is not None:
                body = await vet(body)
        except BaseException:
            self.inflight.done(mid)  # nothing was written under it
            raise
        inflight = [mid]
        if prior is not None:  # the first attempt's mid may already be stored, not delivered
            inflight.append(prior.mid)
            self.inflight.add(prior.mid)
        try:
            msg = ChatMessage(mid, sender, to, cmid, body, reply_to=reply_to)
            stored = await self._writes.submit(msg)
            if stored != mid:  # MongoDB already had this cmid under its original mid
                msg = replace(msg, mid=stored)
                mid = stored
                if mid not in inflight:
                    inflight.append(mid)
                    self.inflight.add(mid)
            frame = encode(msg_frame(msg))
            routes = await self._deliveries.submit(_Outgoing(msg, frame))
        except BaseException:
            for m in inflight:
                self.inflight.failed(m, time.monotonic())
            if self.unfinished is not None:  # maybe stored: finished by the node
                self.unfinished(inflight)
            raise
        for m in inflight:
            self.inflight.done(m)
        self.metrics.sends.labels("stored").inc()
        return SendResult(mid, mid_time_ms(mid), frame, *routes)

    async def redeliver(self, node_id: int, low: int, high: int,
                        push: Pushed | None = None) -> int:
        """Put the 1:1 messages node ``node_id`` stored with ``low <= mid <=
        high`` in both users' boxes (where neither side has it: only its body
        was written) and offline stores and mark their sends acked (a node
        that died may have stored them without either: sync would pass them by).
        Idempotent (``deliver.lua`` counts nothing twice); returns how many.
        ``push``: told each message, its frame and both users' routes, once
        it is in the offline stores."""
        done = 0
        while low <= high:
            msgs = await self.messages.between(node_id, low, high, REDELIVER_PAGE)
            ours = [_Outgoing(m, encode(msg_frame(m))) for m in msgs if not m.recalled]
            if ours:
                # The body may be all that was written (the boxes are a second write).
                await self.messages.add_missing_boxes([it.msg for it in ours])
                routes = await self._flush_deliveries(ours)
                if push is not None:
                    for it, (sender_routes, receiver_routes) in zip(ours, routes, strict=True):
                        push(it.msg, it.frame, sender_routes, receiver_routes)
                done += len(ours)
            if len(msgs) < REDELIVER_PAGE:
                break
            low = msgs[-1].mid + 1
        return done

    async def _repeat(self, mid: int) -> SendResult:
        """The answer to a resend of an acked ``mid``, with its push again while it
        is recent (``REPUSH_WINDOW_S``). Its deliveries are redone first
        (idempotent: ``deliver.lua`` counts nothing twice): the first attempt's
        ack value can land while a delivery of the same pipeline did not (on a
        Redis Cluster each master applies its part; one may be down), and that
        attempt was answered ``unavailable``. So a resend is acked only once the
        message is in both users' stores; a store that cannot be reached is
        ``unavailable`` again, and the client asks later."""
        ts = mid_time_ms(mid)
        msg = await self.messages.get(mid)
        if msg is None or msg.recalled:
            return SendResult(mid, ts, None)
        frame = encode(msg_frame(msg))
        routes = await self._deliveries.submit(_Outgoing(msg, frame))
        if time.time() * 1000 - ts > REPUSH_WINDOW_S * 1000:
            return SendResult(mid, ts, None)
        return SendResult(mid, ts, frame, *routes, repeat=True)

    async def _flush_deliveries(
        self, items: list[_Outgoing]
    ) -> list[tuple[dict[str, str], dict[str, str]]]:
        deliveries: list[Delivery] = []
        acked: list[tuple[str, str, str]] = []
        for it in items:
            m = it.msg
            cut = preview(m, it.frame)
            last = b"" if cut is it.frame else cut  # b"": the frame itself
            deliveries.append(Delivery(m.sender, m.to, m.mid, it.frame, unread=False,
                                       preview=last))
            deliveries.append(Delivery(m.to, m.sender, m.mid, it.frame, unread=True,
                                       preview=last))
            acked.append((m.sender, m.cmid, dedup.done(m.mid)))
        routes = await self.offline.deliver(deliveries, acked)
        return [(routes[2 * i], routes[2 * i + 1]) for i in range(len(items))]

    async def _flush_reads(self, marks: list[tuple[str, str, int]]) -> list[None]:
        await self.messages.set_read_marks(marks)
        return [None] * len(marks)

    async def close(self) -> None:
        for b in (self._writes, self._deliveries, self._reads):
            await b.close()

    # -- read side (1:1 only; ``Conversations`` dispatches and merges) ----------
    async def recv_ack(self, user: str, mids: tuple[int, ...]) -> None:
        await self.offline.ack(user, mids=mids)

    async def sync_ack(self, user: str, upto: int) -> None:
        await self.offline.ack(user, upto=upto)

    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        """Read ``conv`` up to ``mid``, a message of that conversation (one point
        read of the store): any other mid is ``not_found`` and changes nothing,
        so a ``read`` cannot push a receipt to a stranger. The mark goes to
        MongoDB first (unread is rebuilt from it), then to Redis."""
        m = await self.messages.get(mid)
        if m is None or {m.sender, m.to} != {user, conv}:
            raise ProtocolError("not_found", "no such message in this conversation")
        await self._reads.submit((user, conv, mid))
        return await self.offline.mark_read(user, conv, mid)

    async def sync_rows(self, user: str, since: int, count: int) -> list[tuple[int, Any]]:
        """(mid, entry) after ``since``, oldest first: the offline store when it can
        vouch for the range (its stored frames, as bytes), else the MongoDB
        boxes (frames as dicts); MongoDB alone while Redis is down."""
        try:
            page = await self.offline.page(user, since, count)
        except Unavailable:
            page = None
        age = max(0.0, time.time() - mid_time_ms(since) / 1000) if since else 604_800.0
        if page is not None and page.complete:
            self.metrics.sync_reads.labels("redis").observe(age)
            return list(page.rows)
        self.metrics.sync_reads.labels("mongo").observe(age)
        if page is None:  # Redis is down: this page only
            return [(m.mid, frame_of(m, user)) for m in
                    await self.messages.box_page(user, after=since, limit=count)]
        # Redis answered: read up to FILL_READ entries, enough to reach the
        # store's floor after a loss, and keep them there (OfflineStore.fill),
        # so that the next sync from here on is answered by Redis.
        read = max(count, FILL_READ)
        rows = [(m.mid, frame_of(m, user)) for m in
                await self.messages.box_page(user, after=since, limit=read)]
        try:
            filled = await self.offline.fill(user, since, page.version,
                                             [(mid, encode(f)) for mid, f in rows],
                                             whole=len(rows) < read)
        except Unavailable:
            filled = False  # the next sync reads MongoDB again
        self.metrics.offline_fills.labels("filled" if filled else "refused").inc()
        return rows[:count]

    async def current(self, user: str, mids: list[int]) -> dict[int, dict[str, Any]]:
        """The frames of these 1:1 messages as ``user`` would sync them now, those
        still in its box (a change to one it deleted for itself is not shown)."""
        kept = await self.messages.in_box(user, mids)
        found = await self.messages.get_many(sorted(kept))
        return {mid: frame_of(m, user) for mid, m in found.items()}

    async def history(self, user: str, conv: str, before: int | None, limit: int
                      ) -> tuple[list[dict[str, Any]], int | None]:
        stored = await self.messages.box_page(user, conv=conv, before=before, limit=limit + 1)
        page, cursor = seek_page(stored, limit, lambda m: m.mid)
        return [frame_of(m, user) for m in page], cursor

    # -- recall, delete for me ------------------------------------------------------
    async def recall(self, user: str, mid: int) -> ChatMessage:
        """``user``'s 1:1 message ``mid`` becomes a tombstone: MongoDB first (the
        truth), then both users' Redis views (unread fixed where it counted)."""
        m = await self.messages.recall(mid, user)
        if m is None:
            if await self.messages.sender_of(mid) is None:
                raise ProtocolError("not_found", "no such message")
            raise ProtocolError("forbidden", "only the sender may recall a message")
        await self.offline.erase([
            Erasure(m.sender, m.to, mid, True, encode(tombstone(m, m.to))),
            Erasure(m.to, m.sender, mid, True, encode(tombstone(m, m.sender)))])
        return m

    async def forget(self, user: str, mid: int) -> str:
        """``mid`` out of ``user``'s box only (the peer keeps it); its conversation."""
        conv = await self.messages.forget(user, mid)
        if conv is None:
            raise ProtocolError("not_found", "no such message in your box")
        left = await self.messages.box_page(user, conv=conv, limit=1)
        newest = left[0] if left and isinstance(left[0], ChatMessage) else None
        await self.offline.erase([Erasure(
            user, conv, mid, False, conversation_last(newest, user) if newest else b"",
            newest.mid if newest else 0)])
        return conv

    async def total_unread(self, user: str) -> int:
        """Unread over the user's 1:1 conversations (and write-diffused groups'
        entries counted there): one script, no row read."""
        total, _ = await self.offline.conversations(user, 0)
        return total

    async def conversation_rows(self, user: str, limit: int, after: Position | None = None
                                ) -> tuple[int, list[tuple[Position, dict[str, Any]]]]:
        """(total unread, [(position, row)]): the user's newest 1:1 conversations
        after ``after``, at least ``limit + 1`` of them if there are."""
        # Positions at ``after``'s mid but not before it (one at most: mids are
        # unique) come back too and are left out by the caller.
        total, rows = await self.offline.conversations(
            user, limit + 2, None if after is None else after[0])
        rows = [r for r in rows if not r.conv.startswith("g:")]
        try:  # how far each peer has read (the demo's receipts after a reload)
            marks = await self.messages.peer_read_marks(user, [r.conv for r in rows])
        except Unavailable:  # the list still answers; without the marks
            marks = None
        return total, [((r.mid, r.conv), _row(r, marks)) for r in rows]


    async def rows_of(self, user: str, convs: list[str]
                      ) -> list[tuple[Position, dict[str, Any]]]:
        """The conversation-list rows of these 1:1 conversations (pinned ones)."""
        rows = await self.offline.conversations_of(user, convs)
        try:
            marks = await self.messages.peer_read_marks(user, [r.conv for r in rows])
        except Unavailable:
            marks = None
        return [((r.mid, r.conv), _row(r, marks)) for r in rows]


def _row(r: ConversationRow, marks: dict[str, int] | None) -> dict[str, Any]:
    row: dict[str, Any] = {"conv": r.conv, "unread": r.unread,
                           "last": orjson.Fragment(r.last) if r.last else None}
    if marks is not None:
        row["peer_read"] = marks.get(r.conv, 0)
    return row
