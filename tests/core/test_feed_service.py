"""FeedService's timeline (gateway/feed/service.py) over fakes of its stores, with the
fan-out (gateway/feed/fanout.py) run by hand: each source of a page
(the pushed window, pulled authors, fan-outs under way), what is hidden
(deleted posts, authors no longer followed), and seek paging. No servers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from core.errors import Unavailable
from core.ids import MidGenerator
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.feed.fanout import TimelineFanout
from gateway.feed.service import FeedLimits, FeedService, feed_frame
from tests.core.fakes_feed import (
    FakeCounters,
    FakeFeedCache,
    FakeFollows,
    FakePosts,
    FakePusher,
    FakeTimelines,
)


@dataclass
class Feed:
    follows: FakeFollows
    posts: FakePosts
    timelines: FakeTimelines
    cache: FakeFeedCache
    counters: FakeCounters
    pusher: FakePusher
    fanout: TimelineFanout
    service: FeedService

    async def follow(self, user: str, *others: str) -> None:
        for other in others:
            await self.service.follow(user, other, True)

    async def post(self, author: str, *, fan_out: bool = True, text: str = "x",
                   repost_of: int | None = None, reply_to: int | None = None) -> int:
        """A post; its fan-out (if it is pushed) runs now unless ``fan_out`` is False."""
        post = int((await self.service.create(author, text, repost_of, reply_to))["id"])
        if fan_out:
            await self.fanout.fan_out(post)  # a no-op for posts that are not pushed
        return post

    async def pages(self, user: str, limit: int) -> list[list[int]]:
        """Every page of ``user``'s timeline, following the cursor to its end."""
        out: list[list[int]] = []
        cursor: int | None = None
        for _ in range(200):
            page = await self.service.timeline(user, cursor, limit)
            out.append([p["id"] for p in page["posts"]])
            assert len(out[-1]) <= limit
            cursor = page["cursor"]
            if cursor is None:
                return out
        raise AssertionError("the timeline's cursor never reached the end")


def build_feed(settings: Settings) -> Feed:
    """As ``gateway.app.compose`` builds it (the fan-out's workers not started)."""
    s = settings
    follows, posts, timelines = FakeFollows(), FakePosts(), FakeTimelines()
    cache, counters, pusher = FakeFeedCache(follows, posts), FakeCounters(), FakePusher()
    fanout = TimelineFanout(posts, follows, timelines, cache, pusher, feed_frame,
                            timeline_max=s.feed_timeline_max, queue_max=s.feed_queue_max)
    service = FeedService(follows, posts, timelines, cache, counters, fanout,
                          MidGenerator(2), FeedLimits.from_settings(s))
    return Feed(follows, posts, timelines, cache, counters, pusher, fanout, service)


@pytest.fixture
def feed() -> Feed:
    # authors with at most 1 follower are pushed; "big" authors here have 2 and are pulled
    return build_feed(Settings(feed_push_max=1))


async def make_big(feed: Feed, author: str) -> None:
    await feed.follow("x1", author)
    await feed.follow("x2", author)


def flat(pages: list[list[int]]) -> Iterator[int]:
    return (p for page in pages for p in page)


async def test_a_pushed_post_is_in_flight_then_in_every_followers_window(feed: Feed) -> None:
    await feed.follow("r", "a")
    post = await feed.post("a", fan_out=False)
    assert feed.posts.docs[post]["pushed"] and feed.posts.docs[post]["fanout"] == "pending"
    assert feed.cache.in_flight == {("a", post)}
    assert feed.timelines.entries == {"a": {post: "a"}}  # the author's own, at once
    assert [p["id"] for p in (await feed.service.timeline("r", None, 10))["posts"]] == [post]

    await feed.fanout.fan_out(post)
    assert feed.timelines.entries["r"] == {post: "a"}
    assert feed.cache.in_flight == set() and feed.posts.docs[post]["fanout"] == "done"
    assert [p["id"] for p in (await feed.service.timeline("r", None, 10))["posts"]] == [post]
    assert feed.fanout.fanouts == 1


async def test_a_big_authors_post_is_pulled_not_pushed(feed: Feed) -> None:
    await make_big(feed, "b")
    await feed.follow("r", "b")
    post = await feed.post("b")
    doc = feed.posts.docs[post]
    assert not doc["pushed"] and doc["fanout"] == "none"
    assert feed.cache.in_flight == set() and "r" not in feed.timelines.entries
    assert await feed.cache.pull_max(["b"]) == {"b": post}
    assert [p["id"] for p in (await feed.service.timeline("r", None, 10))["posts"]] == [post]


async def test_each_source_reaches_a_page_alone_below_a_full_window(feed: Feed) -> None:
    await make_big(feed, "b")
    await feed.follow("r", "a", "b")
    a = [await feed.post("a") for _ in range(4)]  # r's window: 4 entries, full at limit 1
    b1 = await feed.post("b")  # pulled
    a5 = await feed.post("a", fan_out=False)  # its fan-out under way

    first = await feed.service.timeline("r", None, 1)
    assert [p["id"] for p in first["posts"]] == [a5] and first["cursor"] == a5
    assert a5 not in feed.timelines.entries["r"]  # not from the window: in flight
    second = await feed.service.timeline("r", a5, 1)
    assert [p["id"] for p in second["posts"]] == [b1] and b1 not in feed.timelines.entries["r"]
    third = await feed.service.timeline("r", b1, 1)
    assert [p["id"] for p in third["posts"]] == [a[3]]  # from the window
    assert not [q for q in feed.posts.queries if q[0] == "by_authors"]  # the window vouched

    assert await feed.pages("r", 1) == [[a5], [b1], *[[p] for p in reversed(a)]]


async def test_deleted_posts_and_unfollowed_authors_are_hidden(feed: Feed) -> None:
    await make_big(feed, "b")
    await feed.follow("r", "a", "b", "d")
    a1 = await feed.post("a")
    d = [await feed.post("d") for _ in range(4)]  # fill r's window with d's entries
    b1 = await feed.post("b")
    a2 = await feed.post("a", fan_out=False)
    await feed.post("d", fan_out=False)
    a3 = await feed.post("a")
    await feed.service.delete("a", a1)
    await feed.service.delete("a", a2)  # deleted while its fan-out is under way
    await feed.service.follow("r", "d", False)
    await feed.service.follow("r", "b", False)
    assert set(d) | {a1} <= set(feed.timelines.entries["r"])  # the entries stay

    for limit in (1, 2, 10):
        assert list(flat(await feed.pages("r", limit))) == [a3], limit
    shown = (await feed.service.timeline("x1", None, 10))["posts"]
    assert [p["id"] for p in shown] == [b1]  # still there for b's other followers
    with pytest.raises(ProtocolError) as err:
        await feed.service.delete("r", a3)
    assert err.value.code == "forbidden"
    with pytest.raises(ProtocolError) as err:
        await feed.service.delete("a", a1)
    assert err.value.code == "not_found"


async def test_paging_yields_every_visible_post_once_newest_first(feed: Feed) -> None:
    await make_big(feed, "b")
    await feed.follow("r", "a", "b", "d")
    visible = [await feed.post("a"), await feed.post("r"), await feed.post("b")]
    visible += [await feed.post("a"), await feed.post("b"), await feed.post("r")]
    gone = [await feed.post("d"), await feed.post("a"), await feed.post("b")]
    visible += [await feed.post("a", fan_out=False)]
    visible += [await feed.post("a", text="", repost_of=visible[2])]  # a repost of b's
    await feed.post("a", text="a comment", reply_to=visible[0])  # comments stay out
    visible += [await feed.post("r", fan_out=False), await feed.post("b")]
    for post in gone[1:]:
        await feed.service.delete(feed.posts.docs[post]["author"], post)
    await feed.service.follow("r", "d", False)

    want = sorted(visible, reverse=True)
    for limit in (1, 2, 3, 5, 50):
        assert list(flat(await feed.pages("r", limit))) == want, limit


async def test_an_author_crossing_the_threshold_loses_nothing(feed: Feed) -> None:
    await feed.follow("r", "a")
    pushed = await feed.post("a")
    await make_big(feed, "a")  # now pulled
    pulled = await feed.post("a")
    await feed.service.follow("x1", "a", False)
    await feed.service.follow("x2", "a", False)  # pushed again
    again = await feed.post("a")
    assert [feed.posts.docs[p]["pushed"] for p in (pushed, pulled, again)] == [
        True, False, True]
    for limit in (1, 2, 10):
        assert list(flat(await feed.pages("r", limit))) == [again, pulled, pushed]


@pytest.mark.xfail(strict=True, reason=(
    "bug: a post pushed before the reader followed its author is in no source while "
    "the reader's window is full (source C is read only once the window is exhausted, "
    "by then the cursor is below the post), so it is never shown"))
async def test_posts_of_an_author_followed_later_are_shown(feed: Feed) -> None:
    await feed.follow("r", "a")
    a = [await feed.post("a") for _ in range(6)]
    await feed.follow("y", "c")
    c1 = await feed.post("c")  # pushed to y; r does not follow c yet
    await feed.follow("r", "c")
    assert list(flat(await feed.pages("r", 1))) == [c1, *reversed(a)]


async def test_a_post_that_failed_to_store_leaves_no_trace(feed: Feed) -> None:
    await feed.follow("r", "a")
    a = [await feed.post("a") for _ in range(3)]
    feed.posts.fail("insert_post")
    with pytest.raises(Unavailable):
        await feed.post("a")
    feed.posts.heal()
    assert await feed.pages("r", 1) == [[p] for p in reversed(a)]
    assert feed.cache.in_flight == set()


async def test_posts_shape_counts_reposts_and_comments(feed: Feed) -> None:
    await feed.follow("r", "a")
    a1 = await feed.post("a", text="hello")
    repost = await feed.post("r", text="", repost_of=a1)
    await feed.post("r", text="nice", reply_to=a1)
    await feed.service.like("r", a1)
    await feed.service.like("r", a1)  # once per user
    page = (await feed.service.timeline("r", None, 10))["posts"]
    assert [p["id"] for p in page] == [repost, a1]
    assert page[0]["original"]["id"] == a1
    assert page[1]["counts"] == {"reposts": 1, "comments": 1, "likes": 1}
    await feed.service.delete("a", a1)
    page = (await feed.service.timeline("r", None, 10))["posts"]
    assert [p["id"] for p in page] == [repost]
    assert page[0]["original"] == {"id": a1, "deleted": True}
    with pytest.raises(ProtocolError):
        await feed.post("r", text="", repost_of=a1)  # of a deleted post
