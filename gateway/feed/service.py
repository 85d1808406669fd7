"""The feed: follows, posts, hybrid fan-out, the timeline read, counters.

Posting (hybrid push and pull): the post is stored, the author's own timeline
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
The push-or-pull decision and the merge are ``core.timeline`` (pure); the
fan-out itself is ``gateway.feed.fanout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core import timeline
from core.errors import Unavailable
from core.ids import mid_time_ms
from core.paging import seek_page
from core.seek_cursor import BadCursor, decode_cursor, encode_cursor
from gateway import frames
from gateway.auth import check_user_id
from gateway.chat.service import IdSource
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.feed.fanout import TimelineFanout
from store.ports import CounterStore, FeedCache, FollowStore, PostStore, TimelineStore

__all__ = ["FeedService", "feed_frame"]

log = logging.getLogger("gateway.feed.service")
HOUSEKEEP_S = 1.0  # counters to MongoDB and timeline trims: at most a round this often
HOUSEKEEP_IDLE_S = 4.0  # rounds that find nothing back off to one this often
FRIENDS_SCAN = 200  # following ids read per round of a friends page


def feed_frame(doc: dict[str, Any]) -> bytes:
    """The optional ``feed`` push of a post to followers online."""
    return frames.feed(doc["_id"], doc["author"], doc["ts"])


@dataclass(frozen=True, slots=True)
class FeedLimits:
    """``IM_FEED_FOLLOW_MAX``, ``IM_FEED_PUSH_MAX``, ``IM_FEED_TEXT_MAX``,
    ``IM_FEED_TIMELINE_MAX``."""

    follow_max: int
    push_max: int
    text_max: int
    timeline_max: int

    @classmethod
    def from_settings(cls, s: Settings) -> FeedLimits:
        return cls(s.feed_follow_max, s.feed_push_max, s.feed_text_max, s.feed_timeline_max)


class FeedService:
    def __init__(self, follows: FollowStore, posts: PostStore, timelines: TimelineStore,
                 cache: FeedCache, counters: CounterStore, fanout: TimelineFanout,
                 ids: IdSource, limits: FeedLimits,
                 followed: Callable[[str, str], Awaitable[None]] | None = None) -> None:
        # A follow or unfollow changes contacts: every node is told (gateway.contacts).
        self.followed = followed
        self.follows = follows
        self.posts = posts
        self.timelines = timelines
        self.cache = cache
        self.counters = counters
        self.fanout = fanout
        self.ids = ids
        self.limits = limits
        self._tasks: list[asyncio.Task[None]] = []
        self._work = asyncio.Event()  # a counter moved here: the next round is due

    def start(self) -> None:
        self.fanout.start()
        self._tasks.append(asyncio.create_task(self._housekeeping()))

    async def close(self) -> None:
        await self.fanout.close()
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
            await self._check_follow_cap(user, other)
            await self.follows.follow(user, other)
        else:  # always allowed, also past the cap
            await self.follows.unfollow(user, other)
        await self.cache.followed(user, other, yes)
        if self.followed is not None:
            await self.followed(user, other)

    async def _check_follow_cap(self, user: str, other: str) -> None:
        """``IM_FEED_FOLLOW_MAX`` (every timeline read merges what the reader
        follows). Following someone followed already stays a no-op at the cap.
        Concurrent follows of one user may pass it by the few in flight."""
        cap = self.limits.follow_max
        count = int((await self.follows.user(user)).get("following", 0))
        if count >= cap and other not in await self.cache.following(user):
            raise ProtocolError("forbidden", f"you follow {count} users; the limit is {cap} "
                                "(unfollow someone first)")

    async def profile(self, user: str) -> dict[str, Any]:
        doc = await self.follows.user(user)
        return {"user": user, "following": int(doc.get("following", 0)),
                "followers": int(doc.get("followers", 0))}

    async def follow_page(self, kind: str, user: str, cursor: str | None, limit: int
                          ) -> dict[str, Any]:
        ids = await self.follows.page_ids(kind, user, cursor, limit + 1)
        page, nxt = seek_page(ids, limit, lambda u: u)
        return {"users": page, "cursor": nxt}

    async def relation(self, user: str, other: str) -> dict[str, bool]:
        """Between ``user`` and ``other``: two point look-ups, one round trip."""
        found = await self.follows.existing([(user, other), (other, user)])
        following, followed_by = (user, other) in found, (other, user) in found
        return {"following": following, "followed_by": followed_by,
                "friends": following and followed_by}

    async def friends(self, user: str, cursor: str | None, limit: int) -> dict[str, Any]:
        """Mutual follows of ``user`` by id, seek-paginated on the following list.

        A page reads who ``user`` follows ``FRIENDS_SCAN`` ids at a time (the
        ``(a, b)`` index) and keeps those who follow back (one ``_id`` ``$in``
        look-up of the chunk's reverse edges) until ``limit + 1`` are found or
        the list ends: at most F // 200 + 1 rounds of two indexed queries, F
        the following count (at most ``IM_FEED_FOLLOW_MAX``), whatever the
        follower count. Past the cap (follows in flight) a page stops after
        that many entries and its cursor resumes the scan, so a page may then
        hold fewer than ``limit`` users with a cursor."""
        scope = f"friends:{user}"
        after = _seek_key(scope, cursor)
        found: list[str] = []
        for _ in range(self.limits.follow_max // FRIENDS_SCAN + 1):
            chunk = await self.follows.page_ids("following", user, after, FRIENDS_SCAN)
            back = await self.follows.existing([(x, user) for x in chunk])
            found += [x for x in chunk if (x, user) in back]
            if len(found) > limit:
                return {"users": found[:limit],
                        "cursor": encode_cursor(scope, found[limit - 1])}
            if len(chunk) < FRIENDS_SCAN:
                return {"users": found, "cursor": None}
            after = chunk[-1]
        return {"users": found, "cursor": encode_cursor(scope, after) if after else None}

    # -- posts -----------------------------------------------------------------------
    async def create(self, author: str, text: str, repost_of: int | None,
                     reply_to: int | None) -> dict[str, Any]:
        if not _is_unicode(text):
            raise ProtocolError("bad_request", "text must be valid Unicode (no lone surrogates)")
        if len(text) > self.limits.text_max:
            raise ProtocolError("too_large", f"text is {len(text)} characters; the limit is "
                                f"{self.limits.text_max}")
        if not text.strip() and repost_of is None:
            raise ProtocolError("bad_request", "text is required (a repost may have none)")
        if repost_of is not None and reply_to is not None:
            raise ProtocolError("bad_request", "a post is a repost or a comment, not both")
        ref = repost_of if repost_of is not None else reply_to
        if ref is not None:
            found = (await self.posts.get_posts([ref])).get(ref)
            if found is None or found.get("deleted"):
                raise ProtocolError("not_found", f"no such post {ref}")
        post = self.ids.next()
        comment = reply_to is not None
        followers = int((await self.follows.user(author)).get("followers", 0))
        pushed = timeline.should_push(followers, self.limits.push_max, comment)
        doc = {"_id": post, "author": author, "text": text, "ts": mid_time_ms(post),
               "repost_of": repost_of, "reply_to": reply_to, "deleted": False,
               "pushed": pushed, "fanout": "pending" if pushed else "none",
               "counts": {"reposts": 0, "comments": 0, "likes": 0}}
        if pushed:  # before the insert: from the moment it exists, readers merge it
            await self.cache.pending(author, post, True)
        try:
            await self.posts.insert_post(doc)
        except BaseException:
            if pushed:  # not stored: readers must not wait for its fan-out
                with contextlib.suppress(Unavailable):
                    await self.cache.pending(author, post, False)
            raise
        if not comment:
            await self.timelines.push(post, author, [author])  # the author sees it at once
            if not pushed:
                await self.cache.set_pull(author, post)
        if repost_of is not None:
            await self._bump(repost_of, "r")
        if reply_to is not None:
            await self._bump(reply_to, "c")
        if pushed:
            await self.fanout.enqueue(post)
        return (await self.shape([doc]))[0]

    async def _live(self, post: int) -> dict[str, Any]:
        """The post's document; not_found if it never existed or is deleted."""
        doc = (await self.posts.get_posts([post])).get(post)
        if doc is None or doc.get("deleted"):
            raise ProtocolError("not_found", "no such post")
        return doc

    async def delete(self, user: str, post: int) -> None:
        doc = await self._live(post)
        if doc["author"] != user:
            raise ProtocolError("forbidden", "only the author may delete a post")
        await self.posts.delete_post(post)

    async def like(self, user: str, post: int) -> None:
        """The count moves once per like however often the call is retried: a
        retry after ``unavailable`` may find its first try's row written (the
        reply lost, or the counter's move failed after it), and then finishes
        that like's +1 instead of skipping it. Each like row has a token and
        the counter marks the token's +1 and -1 (``CounterStore.like_once``)."""
        await self._live(post)
        for _ in range(3):
            row = await self.posts.like_row(post, user)
            if row is None:
                return
            moved = await self.counters.like_once(post, user, row.token, row.counted)
            if moved < 0:  # this row's unlike came first: finish it, then like anew
                await self.posts.drop_like(post, user, row.token)
                continue
            if not row.counted:
                await self.posts.like_counted(post, user, row.token)
            if moved:
                self._work.set()
            return
        # Undone each time by an unlike of the same user running at the same
        # time: as if this like came first and one of those unlikes after it.

    async def unlike(self, user: str, post: int) -> None:
        """The count drops once per like, and only for one it counted: the -1 is
        marked before the row goes, so a retry (or a concurrent unlike) that
        finds the row still there moves nothing again; a concurrent like of
        the same row sees the -1 and makes a new one. Concurrent calls of one
        user end at 1 if a row is there, else 0."""
        await self._live(post)
        row = await self.posts.like_of(post, user)
        if row is None:
            return
        if await self.counters.unlike_once(post, user, row.token, row.counted):
            self._work.set()
        await self.posts.drop_like(post, user, row.token)

    async def post(self, post: int) -> dict[str, Any]:
        """One live post in the timeline's shape (a repost carries ``original``)."""
        return (await self.shape([await self._live(post)]))[0]

    async def shape(self, docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The post shape, counts from Redis (one round trip for the page); a
        repost carries its original, or ``{"id", "deleted": true}``."""
        ref_ids = [d["repost_of"] for d in docs if d.get("repost_of") is not None]
        originals = await self.posts.get_posts(ref_ids) if ref_ids else {}
        live_refs = [o for o in originals.values() if not o.get("deleted")]
        counts = await self.counters.counts(docs + live_refs)

        def one(d: dict[str, Any]) -> dict[str, Any]:
            return {"id": d["_id"], "author": d["author"], "text": d["text"], "ts": d["ts"],
                    "repost_of": d.get("repost_of"), "reply_to": d.get("reply_to"),
                    # an unlike's -1 can land just before its like's +1: never shown
                    "counts": {k: max(0, n) for k, n in counts[d["_id"]].items()}}

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
        raw = await self.timelines.page(user, floor, cursor, 2 * want)
        window = {p for p, a in raw if a in authors}
        bound = timeline.window_bound(len(raw), 2 * want, raw[-1][0] if raw else None)
        pulls = await self.cache.pull_max(authors)
        queries = [self.posts.by_author(a, cursor, want, top_level=True, unpushed=True)
                   for a in pulls]
        # Fan-outs under way (their entries may not be here yet): by id from Redis.
        in_flight = [p for a, p in await self.cache.pending_below(cursor, authors=authors)
                     if a in authors]
        if bound is None:
            queries.append(self.posts.by_authors(sorted(authors), cursor, want))
        docs = {d["_id"]: d for page in await asyncio.gather(*queries) for d in page}
        page = timeline.merge_page(window, set(docs), in_flight, bound, limit)
        missing = [i for i in page.ids if i not in docs]
        if missing:
            docs.update(await self.posts.get_posts(missing))
        shown = [docs[i] for i in page.ids if i in docs and not docs[i].get("deleted")
                 and docs[i]["author"] in authors]
        return {"posts": await self.shape(shown), "cursor": page.cursor}

    async def _page(self, docs: list[dict[str, Any]], limit: int) -> dict[str, Any]:
        page, cursor = seek_page(docs, limit, lambda d: d["_id"])
        return {"posts": await self.shape(page), "cursor": cursor}

    async def user_posts(self, user: str, cursor: int | None, limit: int) -> dict[str, Any]:
        return await self._page(
            await self.posts.by_author(user, cursor, limit + 1, top_level=True), limit)

    async def comments(self, post: int, cursor: int | None, limit: int) -> dict[str, Any]:
        if post not in await self.posts.get_posts([post]):
            raise ProtocolError("not_found", "no such post")
        return await self._page(await self.posts.comments_of(post, cursor, limit + 1), limit)

    # -- housekeeping ------------------------------------------------------------------
    async def _bump(self, post: int, field: str, by: int = 1) -> None:
        await self.counters.bump(post, field, by)
        self._work.set()

    async def _housekeeping(self) -> None:
        """A round a second while rounds find work; rounds that find none back
        off to one every ``HOUSEKEEP_IDLE_S`` (a node with no feed traffic polls
        Redis less), and a counter moved on this node ends the wait."""
        extra = 0.0  # the idle backoff beyond HOUSEKEEP_S
        while True:
            await asyncio.sleep(HOUSEKEEP_S)
            if extra:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(extra):
                        await self._work.wait()
            self._work.clear()
            found = 1
            try:
                found = await self._flush_counts() + await self._trim()
            except Unavailable as exc:
                log.warning("feed housekeeping paused: %s", exc)
            except Exception:
                log.exception("feed housekeeping failed")
            extra = 0.0 if found else min(HOUSEKEEP_IDLE_S - HOUSEKEEP_S,
                                          max(HOUSEKEEP_S, extra * 2))

    async def _flush_counts(self) -> int:
        """Counters changed in Redis go to MongoDB, 500 posts a round; how many."""
        counts, unmerged = await self.counters.dirty(500)
        if unmerged:  # merge MongoDB's flushed values first, then flush the sum
            docs = await self.posts.get_posts(unmerged)
            counts.update(await self.counters.counts(list(docs.values())))
        if counts:
            try:
                await self.posts.flush_counts(counts)
            except Unavailable:
                await self.counters.redirty(counts)
                raise
        return len(counts) + len(unmerged)

    async def _trim(self) -> int:
        """Timelines due for a trim (50 a round); how many."""
        keep = self.limits.timeline_max
        due = await self.cache.due_trims(50)
        for user in due:
            floor = await self.timelines.trim(user, keep)
            if floor is not None:
                await self.cache.set_floor(user, floor)
            await self.cache.trimmed(user, keep)
        return len(due)


def _seek_key(scope: str, cursor: str | None) -> str | None:
    """The user id a friends cursor resumes after; bad_request unless this list
    handed it out."""
    if cursor is None:
        return None
    try:
        key = decode_cursor(scope, cursor)
    except BadCursor as exc:
        raise ProtocolError("bad_request", "cursor: not a cursor of this list") from exc
    if check_user_id(key) is not None:
        raise ProtocolError("bad_request", "cursor: not a cursor of this list")
    return key


def _is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (JSON can escape one; no store
    can encode it)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
