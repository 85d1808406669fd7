"""Per-user state in Redis: offline store, unread, conversations (``OfflineStore``).

Every multi-key change is one Lua script over keys of one user (one hash
tag), so it is atomic and Redis Cluster friendly. Batched entry points take
many messages and make one round trip for all of them.

Every key expires. The offline zset and its floor live ``offline_ttl_s``
after the last message. The inbox keys (meta, unread mids, conversations,
last messages) live ``user_key_ttl_s`` after their last use, all four with
one deadline (every script that touches one refreshes the four). They are
complete only with the meta hash's ``~``: set by a rebuild from MongoDB
(``InboxSource``: box entries, recalled flags, read marks), never by a
delivery. A delivery to keys that are not complete still writes into them,
only adding (a mid, a later last message), and the rebuild merges into what
it finds, so neither loses the other's writes; a read made while they are
not complete is kept beside them and applied by the merge (so a reader never
keeps a rebuild from finishing), and an erasure made meanwhile moves ``v``:
a rebuild that began before it starts over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from core.ids import mid_for_time_ms
from core.inbox_rebuild import BoxEntry, legacy_marks, rebuild_convs, unread_candidates
from store.errors import Unavailable
from store.keys import Keys
from store.ports import InboxSource
from store.records import (
    ChatMessage,
    ConversationRow,
    Delivery,
    Erasure,
    InboxLimits,
    OfflinePage,
    Rewrite,
)
from store.redis_client import Batch, Lua, RedisClient, cluster_state, redis_guard

__all__ = ["REBUILD_SCAN", "OfflineRedis", "unread_member"]

# A rebuild reads at most this many of the user's newest 1:1 box entries: a
# conversation whose last message is older is left out, and a conversation's
# unread counts only the messages among them.
REBUILD_SCAN = 10_000
REBUILD_TRIES = 3  # rebuilds started over (an erasure meanwhile) before giving up


def unread_member(conv: str, mid: int) -> str:
    """A mid's member in the unread zset: one conversation's sort together."""
    return f"{conv}|{mid:016d}"


class OfflineRedis:
    """Redis side of chat state for one namespace."""

    def __init__(self, redis: RedisClient, keys: Keys, limits: InboxLimits,
                 source: InboxSource, render: Callable[[ChatMessage, str], bytes]) -> None:
        """``render(message, owner)``: what the conversation list keeps as the
        last message (the gateway's frame, as the send path stores it)."""
        self.redis = redis
        self.keys = keys
        self.limits = limits
        self.source = source
        self.render = render
        self._fill = Lua("inbox_fill.lua")
        self._deliver = Lua("deliver.lua")
        self._read = Lua("read.lua")
        self._ack = Lua("offline_ack.lua")
        self._page = Lua("offline_page.lua")
        self._fill_offline = Lua("offline_fill.lua")
        self._convs = Lua("conversations.lua")
        self._convs_of = Lua("conversations_of.lua")
        # One rebuild per user at a time on this node: the calls that find the
        # keys incomplete meanwhile wait for it (after a Redis loss every call
        # of a user would otherwise read the same box from MongoDB again).
        self._rebuilding: dict[str, asyncio.Future[bool]] = {}
        self._erase = Lua("erase.lua")
        self._rewrite = Lua("rewrite.lua")

    # -- delivery ------------------------------------------------------------
    async def deliver(
        self, deliveries: Sequence[Delivery], acked: Sequence[tuple[str, str, str]],
        *, routes: bool = True,
    ) -> list[dict[str, str]]:
        """Record every delivery, set every (sender, cmid) dedup value, and read
        each owner's routes (connection -> node) for the push that follows.

        One round trip for all of it. Returns the routes, one dict per delivery.
        """
        lim = self.limits
        oldest = mid_for_time_ms(int(time.time() * 1000) - lim.offline_ttl_s * 1000)
        async with redis_guard():
            batch = Batch(self.redis)
            pipe = batch.pipe
            for d in deliveries:
                k = self.keys
                batch.script(
                    self._deliver,
                    keys=[k.offline(d.owner), k.offline_meta(d.owner), *self._inbox(d.owner)],
                    args=[
                        d.mid, d.frame, d.conv, "1" if d.unread else "0", lim.offline_max,
                        oldest, lim.unread_cap, lim.convs_max, lim.offline_ttl_s,
                        "1" if d.conv_list else "0", d.preview, lim.user_key_ttl_s,
                        unread_member(d.conv, d.mid),
                    ],
                )
            for sender, cmid, value in acked:
                pipe.set(self.keys.dedup(sender, cmid), value, ex=lim.dedup_ttl_s)
            if routes:
                for d in deliveries:
                    pipe.hgetall(self.keys.routes(d.owner))
            results = await batch.execute()
        found = results[len(deliveries) + len(acked):]
        return [{f.decode(): n.decode() for f, n in r.items()} for r in found]

    def _inbox(self, user: str) -> list[str]:
        k = self.keys
        return [k.inbox_meta(user), k.unread_mids(user), k.convs(user), k.conv_last(user)]

    # -- reading -------------------------------------------------------------
    async def mark_read(self, user: str, conv: str, mid: int) -> int:
        """Unread mids of ``conv`` up to ``mid`` go; the count left (rebuilt from
        MongoDB first if the keys were not complete: the caller has written the
        read mark there before)."""
        args = [conv, unread_member(conv, mid), self.limits.user_key_ttl_s]
        async with redis_guard():
            complete, count = await self._read(self.redis, keys=self._inbox(user), args=args)
        if not complete and await self._rebuild(user):
            async with redis_guard():
                complete, count = await self._read(self.redis, keys=self._inbox(user),
                                                   args=args)
        return int(count)

    async def erase(self, erasures: Sequence[Erasure]) -> None:
        """Recalls and deletions, each atomic for its user, one round trip."""
        k = self.keys
        ttl = self.limits.user_key_ttl_s
        async with redis_guard():
            batch = Batch(self.redis)
            for e in erasures:
                batch.script(self._erase, [k.offline(e.user), k.convs(e.user),
                                           k.conv_last(e.user), k.inbox_meta(e.user),
                                           k.unread_mids(e.user), k.offline_meta(e.user)],
                             [e.mid, e.conv, "recall" if e.recall else "forget", e.frame,
                              e.frame_mid, unread_member(e.conv, e.mid), ttl])
            await batch.execute()

    async def rewrite(self, rewrites: Sequence[Rewrite]) -> None:
        """Edited messages' new frames (``rewrite.lua``), one round trip."""
        k = self.keys
        ttl = self.limits.user_key_ttl_s
        async with redis_guard():
            batch = Batch(self.redis)
            for r in rewrites:
                batch.script(self._rewrite, [k.offline(r.user), k.convs(r.user),
                                             k.conv_last(r.user), k.offline_meta(r.user)],
                             [r.mid, r.conv, r.frame, r.preview, r.edited, ttl])
            await batch.execute()

    async def ack(self, user: str, *, mids: Sequence[int] = (), upto: int = -1) -> None:
        args: list[Any] = ["upto", upto] if upto >= 0 else ["mids", *mids]
        async with redis_guard():
            k = self.keys
            await self._ack(self.redis, [k.offline(user), k.offline_meta(user)], args)

    async def page(self, user: str, since: int, count: int) -> OfflinePage:
        async with redis_guard():
            raw = await self._page(
                self.redis, [self.keys.offline(user), self.keys.offline_meta(user)], [since, count]
            )
        floor, version = raw[0], raw[1].decode() if isinstance(raw[1], bytes) else str(raw[1])
        if floor is None or floor is False or int(floor) > since:
            return OfflinePage(False, [], version)
        rows = [(int(float(raw[i + 1])), raw[i]) for i in range(2, len(raw), 2)]
        return OfflinePage(True, rows, version)

    async def fill(self, user: str, since: int, version: str,
                   rows: Sequence[tuple[int, bytes]], whole: bool) -> bool:
        """``offline_fill.lua``: after a Redis loss the store vouches only for
        what was delivered since, and every client's cursor is older; the first
        sync that read MongoDB puts its page here, and the next from there is
        answered by Redis."""
        if not rows and not whole:
            return False
        lim = self.limits
        oldest = mid_for_time_ms(int(time.time() * 1000) - lim.offline_ttl_s * 1000)
        args: list[Any] = [since, version, "1" if whole else "0", rows[-1][0] if rows else since,
                           lim.offline_max, oldest, lim.offline_ttl_s]
        for mid, member in rows:
            args += [mid, member]
        async with redis_guard():
            done = await self._fill_offline(
                self.redis, [self.keys.offline(user), self.keys.offline_meta(user)], args)
        return bool(done)

    async def recent(self, users: Sequence[str], since: int, count: int) -> list[list[bytes]]:
        """Each user's offline entries after ``since`` (oldest first), one round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for user in users:
                pipe.zrangebyscore(self.keys.offline(user), f"({since}", "+inf", 0, count)
            return list(await pipe.execute())

    async def conversations(self, user: str, count: int, upto: int | None = None
                            ) -> tuple[int, list[ConversationRow]]:
        """(total unread, the ``count`` newest conversations whose last mid is at
        most ``upto``); keys that are not complete are rebuilt from MongoDB first."""
        raw = await self._conversations(user, count, upto)
        if not raw[0] and await self._rebuild(user):
            raw = await self._conversations(user, count, upto)
        rows = [
            ConversationRow(raw[i].decode(), int(float(raw[i + 1])), int(raw[i + 2]),
                            raw[i + 3] or None)
            for i in range(2, len(raw), 4)
        ]
        return int(raw[1]), rows

    async def conversations_of(self, user: str, convs: Sequence[str]
                               ) -> list[ConversationRow]:
        if not convs:
            return []
        raw = await self._of(user, convs)
        if not raw[0] and await self._rebuild(user):
            raw = await self._of(user, convs)
        return [ConversationRow(raw[i].decode(), int(float(raw[i + 1])), int(raw[i + 2]),
                                raw[i + 3] or None) for i in range(1, len(raw), 4)]

    async def _of(self, user: str, convs: Sequence[str]) -> list[Any]:
        async with redis_guard():
            return list(await self._convs_of(self.redis, keys=self._inbox(user), args=convs))

    async def _conversations(self, user: str, count: int, upto: int | None) -> list[Any]:
        async with redis_guard():
            return list(await self._convs(self.redis, keys=self._inbox(user), args=[
                count, self.limits.user_key_ttl_s, "+inf" if upto is None else upto]))

    # -- rebuild ---------------------------------------------------------------
    async def _rebuild(self, user: str) -> bool:
        """Fill the user's inbox keys from MongoDB and mark them complete; False
        if erasures kept racing it (the keys stay as they are). A
        rebuild of ``user`` already under way is joined, not repeated; its
        failure is each waiter's."""
        running = self._rebuilding.get(user)
        if running is not None:
            return await asyncio.shield(running)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._rebuilding[user] = fut
        try:
            done = await self._rebuild_now(user)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: nobody may be waiting
            raise
        else:
            fut.set_result(done)
            return done
        finally:
            del self._rebuilding[user]

    async def _rebuild_now(self, user: str) -> bool:
        meta = self.keys.inbox_meta(user)
        for _ in range(REBUILD_TRIES):
            async with redis_guard():
                got: list[bytes | None] = await self.redis.hmget(  # type: ignore[misc,assignment]
                    meta, ["v", "~"])
            raw, complete = got
            if complete is not None:
                # Another rebuild got there first: one that ended after this call
                # found the keys incomplete (and before it asked), or another node's.
                return True
            args = await self._rebuilt_args(user)
            lim = self.limits
            async with redis_guard():
                done = await self._fill(self.redis, keys=self._inbox(user), args=[
                    raw.decode() if raw else "", lim.user_key_ttl_s, lim.convs_max,
                    lim.unread_cap, *args])
            if done:
                return True
        return False

    async def _rebuilt_args(self, user: str) -> list[Any]:
        """``inbox_fill.lua``'s per-conversation arguments, from MongoDB: at most
        ``REBUILD_SCAN`` box entries, then point reads of marks and messages."""
        lim = self.limits
        entries = await self.source.inbox_entries(user, REBUILD_SCAN)
        convs = sorted({conv for _, conv, _ in entries if not conv.startswith("g:")})
        marks = await self.source.read_marks(user, convs)
        legacy = await self._legacy_marks(user, entries, [c for c in convs if c not in marks])
        if legacy:  # kept, so that the next rebuild needs no old key
            await self.source.set_read_marks([(user, c, m) for c, m in legacy.items()])
            marks.update(legacy)
        recalled = await self.source.recalled_among(user, unread_candidates(entries, marks))
        rows = rebuild_convs(entries, marks, recalled, lim.convs_max, lim.unread_cap)
        lasts = await self.source.get_many([r.last_mid for r in rows])
        args: list[Any] = []
        for r in rows:
            m = lasts.get(r.last_mid)
            if m is None:  # a box entry without its message: nothing to show
                continue
            mark = marks.get(r.conv)
            args += [r.conv, r.last_mid, self.render(m, user),
                     unread_member(r.conv, mark) if mark is not None else "", len(r.unread),
                     *(unread_member(r.conv, u) for u in r.unread)]
        return args

    async def _legacy_marks(self, user: str, entries: Sequence[BoxEntry],
                            unmarked: Sequence[str]) -> dict[str, int]:
        """Marks for ``unmarked`` conversations from the keys a version without
        stored read marks left (``core.inbox_rebuild.legacy_marks``); those
        keys are removed once read."""
        if not unmarked:
            return {}
        async with redis_guard():
            fields: dict[bytes, bytes] = await self.redis.hgetall(  # type: ignore[assignment]
                self.keys.inbox_meta(user))
            # Not '~', 'v' nor the reads kept while incomplete ('r|' + conv):
            # an id never holds '|'.
            counted = {f.decode() for f in fields if f not in (b"~", b"v") and b"|" not in f}
            if not counted:
                return {}
            pipe = self.redis.pipeline(transaction=False)
            for conv in unmarked:
                pipe.zrange(self.keys.legacy_unread_mids(user, conv), 0, 0, withscores=True)
            oldest = {conv: int(got[0][1]) for conv, got in
                      zip(unmarked, await pipe.execute(), strict=True) if got}
        marks = legacy_marks(counted, oldest, entries, unmarked)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for conv in unmarked:
                # DEL staged as a plain command: redis-py's cluster pipeline would not
                # stage an unlink (a coroutine) nor a delete across slots
                pipe.execute_command("DEL", self.keys.legacy_unread_mids(user, conv))
            pipe.hdel(self.keys.inbox_meta(user), *counted)
            await pipe.execute()
        return marks

    async def ping(self) -> None:
        """Redis answers; a Redis Cluster answers on every primary and each
        says ``cluster_state:ok``."""
        async with redis_guard():
            state = await cluster_state(self.redis)
            if state == "single" and not await self.redis.ping():
                raise Unavailable("redis", "no PONG")
        if state == "fail":
            raise Unavailable("redis", "cluster_state:fail")
