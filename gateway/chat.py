"""1:1 chat: the send path, offline sync, unread, conversations, history.

Send (docs/architecture.md): dedup on (sender, cmid) -> mid -> body and both
box entries in MongoDB -> both users' offline stores, unread and conversation
lists in Redis -> only then ``ack``. Each stage is a ``Batcher``, so under
load many sends share one round trip per stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from core.batcher import Batcher
from core.cursors import next_cursor
from core.ids import MidGenerator, mid_for_time_ms, mid_time_ms
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.metrics import NodeMetrics
from gateway.protocol import encode
from store import Stores
from store.errors import Unavailable
from store.inbox import Delivery
from store.messages import ChatMessage, msg_frame

if TYPE_CHECKING:
    from gateway.groups import GroupService

__all__ = ["ChatService", "SendResult", "SyncPage"]

Claim = tuple[str, str, int]


@dataclass(frozen=True, slots=True)
class SendResult:
    mid: int
    ts: int
    frame: bytes | None  # the push frame; None for a duplicate (nothing new to push)
    sender_routes: dict[str, str] | None = None  # connection -> node
    receiver_routes: dict[str, str] | None = None


@dataclass(frozen=True, slots=True)
class SyncPage:
    msgs: list[Any]  # orjson.Fragment (stored bytes) or dicts (from MongoDB)
    next: int
    more: bool


@dataclass(frozen=True, slots=True)
class _Outgoing:
    msg: ChatMessage
    frame: bytes


class ChatService:
    """Orchestrates the stores for 1:1 chat; knows nothing of sockets."""

    def __init__(
        self, stores: Stores, mids: MidGenerator, settings: Settings, metrics: NodeMetrics
    ) -> None:
        self.stores = stores
        self.mids = mids
        self.settings = settings
        self.metrics = metrics
        self.groups: GroupService | None = None  # set by the node
        common = {"max_batch": settings.batch_max, "max_pending": settings.pending_max}
        self._claims: Batcher[Claim, str | None] = Batcher(
            self._flush_claims, name="redis", observe=metrics.stage_observer("dedup"), **common)
        # MongoDB's cost per call dominates at small batches, so the write stage
        # lingers briefly (IM_MONGO_LINGER_MS) to let a batch fill.
        self._writes: Batcher[ChatMessage, int] = Batcher(
            self._flush_writes, name="mongo", linger_s=settings.mongo_linger_ms / 1000,
            concurrency=settings.mongo_inflight, observe=metrics.stage_observer("mongo"),
            **common)
        self._deliveries: Batcher[_Outgoing, tuple[dict[str, str], dict[str, str]]] = Batcher(
            self._flush_deliveries, name="redis", observe=metrics.stage_observer("redis"),
            **common)

    async def claim(self, sender: str, cmid: str, mid: int) -> str | None:
        """Dedup claim on (sender, cmid): None if new, else ``p:...`` / ``d:...``."""
        return await self._claims.submit((sender, cmid, mid))

    # -- send ----------------------------------------------------------------
    async def send(self, sender: str, to: str, cmid: str, body: Any) -> SendResult:
        """Store a message durably; raises ``Unavailable`` if that cannot be done."""
        if to == sender:
            raise ProtocolError("bad_request", "to must be another user")
        if to.startswith("g:"):
            raise ProtocolError("bad_request", "ids starting with 'g:' name groups")
        mid = self.mids.next()
        prior = await self._claims.submit((sender, cmid, mid))
        if prior is not None:
            state, _, old = prior.partition(":")
            if state == "d":  # acked before: same mid, nothing stored
                self.metrics.sends.labels("duplicate").inc()
                return SendResult(int(old), mid_time_ms(int(old)), None)
            mid = int(old)  # in flight or failed earlier: redo it under the same mid
        msg = ChatMessage(mid, sender, to, cmid, body)
        stored = await self._writes.submit(msg)
        if stored != mid:  # MongoDB already had this cmid under its original mid
            msg = replace(msg, mid=stored)
            mid = stored
        frame = encode(msg_frame(mid, sender, to, body))
        routes = await self._deliveries.submit(_Outgoing(msg, frame))
        self.metrics.sends.labels("stored").inc()
        return SendResult(mid, mid_time_ms(mid), frame, *routes)

    async def _flush_claims(self, claims: list[Claim]) -> list[str | None]:
        return await self.stores.inbox.claim_cmids(claims)

    async def _flush_writes(self, msgs: list[ChatMessage]) -> list[int | BaseException]:
        return await self.stores.messages.store_batch(msgs)

    async def _flush_deliveries(
        self, items: list[_Outgoing]
    ) -> list[tuple[dict[str, str], dict[str, str]]]:
        deliveries: list[Delivery] = []
        done: list[Claim] = []
        for it in items:
            m = it.msg
            deliveries.append(Delivery(m.sender, m.to, m.mid, it.frame, unread=False))
            deliveries.append(Delivery(m.to, m.sender, m.mid, it.frame, unread=True))
            done.append((m.sender, m.cmid, m.mid))
        routes = await self.stores.inbox.deliver(deliveries, done)
        return [(routes[2 * i], routes[2 * i + 1]) for i in range(len(items))]

    async def close(self) -> None:
        for b in (self._claims, self._writes, self._deliveries):
            await b.close()

    # -- read side -----------------------------------------------------------
    async def recv_ack(self, user: str, mids: tuple[int, ...]) -> None:
        await self.stores.inbox.offline_ack(user, mids=mids)

    async def sync_ack(self, user: str, upto: int) -> None:
        await self.stores.inbox.offline_ack(user, upto=upto)

    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        if conv.startswith("g:"):
            if self.groups is None:
                raise ProtocolError("forbidden", "not a member of this group")
            return await self.groups.read(user, conv[2:], mid)
        return await self.stores.inbox.mark_read(user, conv, mid)

    async def sync(self, user: str, since: int, limit: int) -> SyncPage:
        """Messages after ``since``, oldest first: Redis when it can vouch, else MongoDB."""
        try:
            page = await self.stores.inbox.offline_page(user, since, limit + 1)
        except Unavailable:
            page = None  # the boxes in MongoDB answer alone
        rows: list[tuple[int, Any]]
        if page is not None and page.complete:
            rows = [(mid, orjson.Fragment(raw)) for mid, raw in page.rows]
        else:
            frames = await self.stores.messages.box_page(user, after=since, limit=limit + 1)
            rows = [(f["mid"], f) for f in frames]
        if self.groups is not None:  # read-diffused group messages live with their group
            extra = await self.groups.sync_rd(user, since, limit + 1)
            if extra:
                rows = sorted(rows + [(f["mid"], f) for f in extra], key=lambda r: r[0])
        mids = [mid for mid, _ in rows]
        msgs = [m for _, m in rows]
        more = len(mids) > limit
        mids, msgs = mids[:limit], msgs[:limit]
        horizon = mid_for_time_ms(int(time.time() * 1000) - self.settings.sync_settle_ms)
        return SyncPage(msgs, next_cursor(since, mids, more, horizon), more)

    async def history(
        self, user: str, conv: str, before: int | None, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        if conv.startswith("g:"):
            if self.groups is None:
                raise ProtocolError("forbidden", "not a member of this group")
            return await self.groups.history(user, conv[2:], before, limit)
        frames = await self.stores.messages.box_page(user, conv=conv, before=before,
                                                     limit=limit + 1)
        more = len(frames) > limit
        frames = frames[:limit]
        return frames, (frames[-1]["mid"] if more else None)

    async def conversations(self, user: str, limit: int) -> dict[str, Any]:
        """1:1 conversations and groups, newest first; the total covers both."""
        total, rows = await self.stores.inbox.conversations(user, limit)
        merged: list[tuple[int, dict[str, Any]]] = [
            (r.mid, {"conv": r.conv, "unread": r.unread,
                     "last": orjson.Fragment(r.last) if r.last else None})
            for r in rows if not r.conv.startswith("g:")]
        if self.groups is not None:
            group_total, group_rows = await self.groups.conversation_rows(user)
            total += group_total
            merged += group_rows
        merged.sort(key=lambda r: r[0], reverse=True)
        return {"total_unread": total, "conversations": [row for _, row in merged[:limit]]}
