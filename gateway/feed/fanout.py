"""A post's fan-out to its author's followers' timelines (the push side of the
hybrid).

Off the request path: a bounded queue of post ids, two workers writing one
timeline entry (ids only) per follower in unordered, idempotent bulk writes,
1,000 followers a chunk, then the optional ``feed`` push to those online. A
post's fan-out is marked done in MongoDB and leaves the Redis zset of
fan-outs under way (readers merge those meanwhile). A sweep resumes fan-outs
that a dead node or a store outage left pending.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from core.errors import Unavailable
from core.ids import mid_for_time_ms
from store.ports import FeedCache, FollowStore, PostStore, TimelineStore

__all__ = ["TimelineFanout", "UserPusher"]

log = logging.getLogger("gateway.feed.fanout")
FANOUT_CHUNK = 1000
SWEEP_EVERY_S = 10.0
STUCK_AFTER_S = 30.0


class UserPusher(Protocol):
    """``Router.push_users``: a frame to every device of some users, anywhere."""

    async def push_users(self, users: list[str], frame: bytes) -> None: ...


class TimelineFanout:
    def __init__(self, posts: PostStore, follows: FollowStore, timelines: TimelineStore,
                 cache: FeedCache, pusher: UserPusher,
                 feed_frame: Callable[[dict[str, Any]], bytes], *, timeline_max: int,
                 queue_max: int, workers: int = 2) -> None:
        self.posts = posts
        self.follows = follows
        self.timelines = timelines
        self.cache = cache
        self.pusher = pusher
        self.feed_frame = feed_frame  # the client's ``feed`` push of a post (the gateway's)
        self.timeline_max = timeline_max
        self.workers = workers
        self._queue: asyncio.Queue[int] = asyncio.Queue(maxsize=queue_max)
        self._queued: set[int] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._pushes: set[asyncio.Task[None]] = set()
        self.fanouts = 0  # posts fanned out by this node

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(self.workers)]
        self._tasks.append(asyncio.create_task(self._sweeper()))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def enqueue(self, post: int) -> None:
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
        doc = (await self.posts.get_posts([post])).get(post)
        if doc is None or doc.get("fanout") != "pending":
            return
        author, after = doc["author"], None
        frame = self.feed_frame(doc)
        while True:
            fans = await self.follows.page_ids("followers", author, after, FANOUT_CHUNK)
            if not fans:
                break
            await self.timelines.push(post, author, fans)
            await self.cache.grew(fans, self.timeline_max, self.timeline_max // 4)
            self._tell_online(fans, frame)
            after = fans[-1]
        await self.posts.set_fanout(post, "done")
        await self.cache.pending(author, post, False)
        self.fanouts += 1

    def _tell_online(self, users: list[str], frame: bytes) -> None:
        """The optional ``feed`` push to followers online anywhere (best effort)."""
        async def push() -> None:
            with contextlib.suppress(Unavailable):
                await self.pusher.push_users(users, frame)

        task = asyncio.create_task(push())
        self._pushes.add(task)
        task.add_done_callback(self._pushes.discard)

    async def _sweeper(self) -> None:
        while True:
            try:
                await self._sweep()
            except Unavailable as exc:
                log.warning("fan-out sweep paused: %s", exc)
            except Exception:
                log.exception("fan-out sweep failed")
            await asyncio.sleep(SWEEP_EVERY_S)

    async def _sweep(self) -> None:
        """Resume fan-outs a dead node (or a store outage) left pending."""
        older = mid_for_time_ms(int((time.time() - STUCK_AFTER_S) * 1000))
        for doc in await self.posts.stuck_fanouts(older):
            if self._queue.full():
                return
            with contextlib.suppress(asyncio.QueueFull):
                if doc["_id"] not in self._queued:
                    self._queued.add(doc["_id"])
                    self._queue.put_nowait(doc["_id"])
