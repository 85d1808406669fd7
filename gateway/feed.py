"""The feed: follows, posts, hybrid fan-out, the timeline read, counters.

Posting (seed 002's hybrid): the post is stored, the author's own timeline
gets it, and if the author has at most ``IM_FEED_PUSH_MAX`` followers the
post is queued for fan-out: a worker writes one timeline entry (ids only)
per follower in unordered, idempotent bulk writes, off the request path.
A bigger author's post is marked unpushed and the author's ``pull_max``
rises: readers pull it. A timeline page merges, below the cursor:
  A. the reader's own timeline window (pushed entries, newest ``IM_FEED_TIMELINE_MAX``);
  B. unpushed posts of followed authors whose ``pull_max`` says they have any;
  C. once A is exhausted (trimmed window, or followed after the posts were
     pushed): the followed authors' own posts;
  D. posts of followed authors whose fan-out is still under way (a Redis
     zset of them, entered before the post is queued, left when it is done).
Each source is sorted and cut at the page size, so the union's head is the
true head; ids are time-ordered, so the cursor (the last id) is a seek key.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from core.ids import mid_for_time_ms, mid_time_ms
from gateway.errors import ProtocolError
from gateway.protocol import encode
from store.errors import Unavailable

if TYPE_CHECKING:
    from gateway.node import Node

__all__ = ["FeedService"]

log = logging.getLogger("gateway.feed")
FANOUT_CHUNK = 1000


class FeedService:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.settings = node.settings
        self.store = node.stores.feed
        self.cache = node.stores.feed_cache
        self._queue: asyncio.Queue[int] = asyncio.Queue(maxsize=self.settings.feed_queue_max)
        self._queued: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pushes: set[asyncio.Task[None]] = set()
        self._last_sweep = 0.0
        self.fanouts = 0  # posts fanned out by this node

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(2)]
        self._tasks.append(asyncio.create_task(self._housekeeping()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Unavailable):
            await self._flush_counts()

    # -- follows -----------------------------------------------------------------
    async def follow(self, user: str, other: str, yes: bool) -> None:
        if user == other:
            raise ProtocolError("bad_request", "you cannot follow yourself")
        if yes:
            await self.store.follow(user, other)
        else:
            await self.store.unfollow(user, other)
        await self.cache.followed(user, other, yes)

    async def profile(self, user: str) -> dict[str, Any]:
        doc = await self.store.user(user)
        return {"user": user, "following": int(doc.get("following", 0)),
                "followers": int(doc.get("followers", 0))}

    async def follow_page(self, kind: str, user: str, cursor: str | None, limit: int
                          ) -> dict[str, Any]:
        ids = await self.store.page_ids(kind, user, cursor, limit + 1)
        more = len(ids) > limit
        ids = ids[:limit]
        return {"users": ids, "cursor": ids[-1] if more else None}

    # -- posts -----------------------------------------------------------------------
    async def create(self, author: str, text: str, repost_of: int | None,
                     reply_to: int | None) -> dict[str, Any]:
        if len(text) > self.settings.feed_text_max:
            raise ProtocolError("too_large", f"text is {len(text)} characters; the limit is "
                                f"{self.settings.feed_text_max}")
        if not text.strip() and repost_of is None:
            raise ProtocolError("bad_request", "text is required (a repost may have none)")
        if repost_of is not None and reply_to is not None:
            raise ProtocolError("bad_request", "a post is a repost or a comment, not both")
        ref = repost_of if repost_of is not None else reply_to
        if ref is not None:
            found = (await self.store.get_posts([ref])).get(ref)
            if found is None or found.get("deleted"):
                raise ProtocolError("not_found", f"no such post {ref}")
        post = self.node.chat.mids.next()
        comment = reply_to is not None
        followers = int((await self.store.user(author)).get("followers", 0))
        pushed = not comment and followers <= self.settings.feed_push_max
        doc = {"_id": post, "author": author, "text": text, "ts": mid_time_ms(post),
               "repost_of": repost_of, "reply_to": reply_to, "deleted": False,
               "pushed": pushed, "fanout": "pending" if pushed else "none",
               "counts": {"reposts": 0, "comments": 0, "likes": 0}}
        if pushed:  # before the insert: from the moment it exists, readers merge it
            await self.cache.pending(author, post, True)
        await self.store.insert_post(doc)
        if not comment:
            await self.store.push(post, author, [author])  # the author sees it at once
            if not pushed:
                await self.cache.set_pull(author, post)
        if repost_of is not None:
            await self.cache.bump(repost_of, "r")
        if reply_to is not None:
            await self.cache.bump(reply_to, "c")
        if pushed:
            await self._enqueue(post)
        return (await self.shape([doc]))[0]

    async def delete(self, user: str, post: int) -> None:
        doc = (await self.store.get_posts([post])).get(post)
        if doc is None or doc.get("deleted"):
            raise ProtocolError("not_found", "no such post")
        if doc["author"] != user:
            raise ProtocolError("forbidden", "only the author may delete a post")
        await self.store.delete_post(post)

    async def like(self, user: str, post: int) -> None:
        doc = (await self.store.get_posts([post])).get(post)
        if doc is None or doc.get("deleted"):
            raise ProtocolError("not_found", "no such post")
        if await self.store.like(post, user):
            await self.cache.bump(post, "l")

    async def shape(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The post shape, counts from Redis (one round trip for the page); a
        repost carries its original, or ``{"id", "deleted": true}``."""
        ref_ids = [d["repost_of"] for d in docs if d.get("repost_of") is not None]
        originals = await self.store.get_posts(ref_ids) if ref_ids else {}
        live_refs = [o for o in originals.values() if not o.get("deleted")]
        counts = await self.cache.counts(docs + live_refs)

        def one(d: dict[str, Any]) -> dict[str, Any]:
            return {"id": d["_id"], "author": d["author"], "text": d["text"], "ts": d["ts"],
                    "repost_of": d.get("repost_of"), "reply_to": d.get("reply_to"),
                    "counts": counts[d["_id"]]}

        out = []
        for d in docs:
            post = one(d)
            ref = d.get("repost_of")
            if ref is not None:
                o = originals.get(ref)
                post["original"] = one(o) if o and not o.get("deleted") else {"id": ref,
                                                                               "deleted": True}
            out.append(post)
        return out

    # -- reads -------------------------------------------------------------------------
    async def timeline(self, user: str, cursor: int | None, limit: int) -> dict[str, Any]:
        authors = await self.cache.following(user) | {user}
        want = limit + 1
        floor = await self.cache.floor(user)
        top = {"reply_to": None, "deleted": False}  # checked on the documents, not queried
        raw = await self.store.timeline_page(user, floor, cursor, 2 * want)
        window = {p for p, a in raw if a in authors}
        # A truncated window only vouches for ids down to its last raw entry.
        bound = raw[-1][0] if len(raw) == 2 * want else None
        pulls = await self.cache.pull_max(authors)
        queries = [self.store.posts_page({"author": a}, cursor, want,
                                         where={**top, "pushed": False}) for a in pulls]
        # Fan-outs under way (their entries may not be here yet): by id from Redis.
        in_flight = [p for a, p in await self.cache.pending_below(cursor) if a in authors]
        in_flight = sorted(in_flight, reverse=True)[:want]
        everyone = {"author": {"$in": sorted(authors)}}
        if bound is None:
            queries.append(self.store.posts_page(everyone, cursor, want, where=top))
        docs = {d["_id"]: d for page in await asyncio.gather(*queries) for d in page}
        ids = sorted(window | set(docs) | set(in_flight), reverse=True)
        if bound is not None:
            ids = [i for i in ids if i >= bound]
        more = len(ids) > limit or bound is not None
        ids = ids[:limit]
        missing = [i for i in ids if i not in docs]
        if missing:
            docs.update(await self.store.get_posts(missing))
        page = [docs[i] for i in ids if i in docs and not docs[i].get("deleted")
                and docs[i]["author"] in authors]
        nxt = (ids[-1] if ids else bound) if more else None
        return {"posts": await self.shape(page), "cursor": nxt}

    async def posts_of(self, query: dict[str, Any], cursor: int | None, limit: int
                       ) -> dict[str, Any]:
        docs = await self.store.posts_page(query, cursor, limit + 1, where={"deleted": False})
        more = len(docs) > limit
        docs = docs[:limit]
        return {"posts": await self.shape(docs), "cursor": docs[-1]["_id"] if more else None}

    async def user_posts(self, user: str, cursor: int | None, limit: int) -> dict[str, Any]:
        docs = await self.store.posts_page({"author": user}, cursor, limit + 1,
                                           where={"deleted": False, "reply_to": None})
        more = len(docs) > limit
        docs = docs[:limit]
        return {"posts": await self.shape(docs), "cursor": docs[-1]["_id"] if more else None}

    async def comments(self, post: int, cursor: int | None, limit: int) -> dict[str, Any]:
        if post not in await self.store.get_posts([post]):
            raise ProtocolError("not_found", "no such post")
        return await self.posts_of({"reply_to": post}, cursor, limit)

    # -- fan-out -------------------------------------------------------------------------
    async def _enqueue(self, post: int) -> None:
        if post not in self._queued:
            self._queued.add(post)
            await self._queue.put(post)  # bounded: posting waits when fan-out lags

    async def _worker(self) -> None:
        while True:
            post = await self._queue.get()
            try:
                await self.fan_out(post)
            except Unavailable as exc:  # the sweeper resumes it
                log.warning("fan-out of %d paused: %s", post, exc)
            except Exception:
                log.exception("fan-out of %d failed", post)
            finally:
                self._queued.discard(post)

    async def fan_out(self, post: int) -> None:
        doc = (await self.store.get_posts([post])).get(post)
        if doc is None or doc.get("fanout") != "pending":
            return
        s, after = self.settings, None
        frame = encode({"op": "feed", "post": post, "author": doc["author"], "ts": doc["ts"]})
        while True:
            fans = await self.store.fan_page(doc["author"], after, FANOUT_CHUNK)
            if not fans:
                break
            await self.store.push(post, doc["author"], fans)
            await self.cache.grew(fans, s.feed_timeline_max, s.feed_timeline_max // 4)
            self._tell_online(fans, frame)
            after = fans[-1]
        await self.store.set_fanout(post, "done")
        await self.cache.pending(doc["author"], post, False)
        self.fanouts += 1

    def _tell_online(self, users: list[str], frame: bytes) -> None:
        """The optional ``feed`` push to followers online anywhere (best effort)."""
        async def push() -> None:
            try:
                routes = await self.node.routes.lookup(users)
            except Unavailable:
                return
            for user, r in zip(users, routes, strict=True):
                if r:
                    self.node.router.push(user, frame, r)

        task = asyncio.create_task(push())
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    # -- housekeeping ------------------------------------------------------------------
    async def _housekeeping(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self._flush_counts()
                await self._trim()
                if time.monotonic() - self._last_sweep > 10:
                    self._last_sweep = time.monotonic()
                    await self._sweep()
            except Unavailable as exc:
                log.warning("feed housekeeping paused: %s", exc)
            except Exception:
                log.exception("feed housekeeping failed")

    async def _flush_counts(self) -> None:
        """Counters changed in Redis go to MongoDB (seed 001), 500 posts a round."""
        counts, unmerged = await self.cache.dirty(500)
        if unmerged:  # merge MongoDB's flushed values first, then flush the sum
            docs = await self.store.get_posts(unmerged)
            counts.update(await self.cache.counts(list(docs.values())))
        if counts:
            try:
                await self.store.flush_counts(counts)
            except Unavailable:
                await self.cache.redirty(counts)
                raise

    async def _trim(self) -> None:
        keep = self.settings.feed_timeline_max
        for user in await self.cache.due_trims(50):
            floor = await self.store.trim(user, keep)
            if floor is not None:
                await self.cache.set_floor(user, floor)
            await self.cache.trimmed(user, keep)

    async def _sweep(self) -> None:
        """Resume fan-outs a dead node (or a store outage) left pending."""
        older = mid_for_time_ms(int((time.time() - 30) * 1000))
        for doc in await self.store.stuck_fanouts(older):
            if self._queue.full():
                return
            with contextlib.suppress(asyncio.QueueFull):
                if doc["_id"] not in self._queued:
                    self._queued.add(doc["_id"])
                    self._queue.put_nowait(doc["_id"])

