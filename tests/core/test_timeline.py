"""The feed's push-or-pull decision and the timeline page merge, pure.

The property tests page through simulated sources the way gateway/feed/service.py
reads them (window of pushed entries, pulled unpushed posts, the followed
authors' own posts once the window is not full, fan-outs under way) and
check that the pages together are every visible post exactly once, newest
first, whatever the page size.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass, field

import pytest

from core.timeline import TimelinePage, merge_page, should_push, window_bound


def test_should_push():
    assert should_push(0, 5000, False)
    assert should_push(5000, 5000, False)  # at the limit: still pushed
    assert not should_push(5001, 5000, False)
    assert not should_push(0, 5000, True)  # comments are never pushed


def test_window_bound():
    assert window_bound(10, 10, 42) == 42  # full: vouches down to its last id only
    assert window_bound(9, 10, 42) is None  # short: it holds everything below the cursor
    assert window_bound(0, 10, None) is None


def test_merge_page_without_bound():
    page = merge_page({9, 7, 3}, {8, 2}, [6], None, 3)
    assert page == TimelinePage([9, 8, 7], True, 7)
    assert merge_page({9, 7}, {8}, [], None, 3) == TimelinePage([9, 8, 7], False, None)
    assert merge_page(set(), set(), [], None, 3) == TimelinePage([], False, None)


def test_merge_page_cut_at_the_bound():
    # the window was full down to 7: ids below 7 wait for the next page
    page = merge_page({9, 7}, {8, 5, 1}, [6], 7, 10)
    assert page == TimelinePage([9, 8, 7], True, 7)


def test_merge_page_with_a_bound_is_always_more():
    # a full window vouches for nothing below it: "more" even if ids fit the limit
    assert merge_page({9}, set(), [], 9, 5) == TimelinePage([9], True, 9)


def test_merge_page_empty_above_the_bound_continues_from_the_bound():
    # every raw window entry was filtered out (unfollowed authors): page empty, cursor = bound
    assert merge_page(set(), {3}, [], 7, 5) == TimelinePage([], True, 7)


def test_merge_page_in_flight_cut_to_the_newest_limit_plus_one_first():
    page = merge_page(set(), set(), [1, 5, 3, 4, 2], None, 2)
    assert page == TimelinePage([5, 4], True, 4)
    # duplicates across sources count once
    assert merge_page({5}, {5}, [5, 5], None, 2) == TimelinePage([5], False, None)


def test_merge_page_in_flight_cut_keeps_the_head_exact():
    # in flight is cut at limit+1 before the union, as today; the head stays exact
    page = merge_page({100}, set(), list(range(1, 50)), None, 3)
    assert page.ids == [100, 49, 48]
    assert page.more


# -- properties over simulated sources -------------------------------------------


@dataclass
class Feed:
    """Posts as the stores see them, for one reader."""

    author: dict[int, str] = field(default_factory=dict)
    pushed: set[int] = field(default_factory=set)
    entries: dict[int, str] = field(default_factory=dict)  # the reader's timeline rows
    in_flight: set[int] = field(default_factory=set)
    followed: set[str] = field(default_factory=set)
    floor: int = 0  # the trimmed window holds ids above it only

    def visible(self) -> list[int]:
        return sorted((p for p, a in self.author.items() if a in self.followed), reverse=True)


def make_feed(rng: random.Random) -> Feed:
    feed = Feed()
    authors = list("abcdef")
    feed.followed = set(rng.sample(authors, rng.randrange(1, len(authors) + 1)))
    for post in rng.sample(range(1, 100_000), rng.randrange(0, 120)):
        a = rng.choice(authors)
        feed.author[post] = a
        if rng.random() < 0.6:
            feed.pushed.add(post)
            if rng.random() < 0.1:
                feed.in_flight.add(post)  # its entries are not written yet
            else:  # entries of authors unfollowed since stay in the window
                feed.entries[post] = a
    if feed.entries and rng.random() < 0.5:
        feed.floor = rng.choice(sorted(feed.entries))
    return feed


def read_page(feed: Feed, cursor: int | None, limit: int) -> TimelinePage:
    """The sources as gateway/feed/service.py reads them, then the pure merge."""
    want = limit + 1

    def newest(ids: Iterable[int], n: int) -> list[int]:
        return sorted((i for i in ids if cursor is None or i < cursor), reverse=True)[:n]

    raw = [(p, feed.entries[p]) for p in newest(
        [p for p in feed.entries if p > feed.floor], 2 * want)]
    window = {p for p, a in raw if a in feed.followed}
    bound = window_bound(len(raw), 2 * want, raw[-1][0] if raw else None)
    pulled: set[int] = set()
    for a in feed.followed:  # B: unpushed posts of each followed author
        pulled |= set(newest([p for p, b in feed.author.items()
                              if b == a and p not in feed.pushed], want))
    if bound is None:  # C: the followed authors' own posts
        pulled |= set(newest([p for p, b in feed.author.items() if b in feed.followed], want))
    in_flight = [p for p in feed.in_flight
                 if (cursor is None or p < cursor) and feed.author[p] in feed.followed]
    return merge_page(window, pulled, in_flight, bound, limit)


def read_all(feed: Feed, limit: int) -> list[int]:
    cursor: int | None = None
    seen: list[int] = []
    for _ in range(10_000):
        page = read_page(feed, cursor, limit)
        check_page(page, cursor, limit)
        seen += page.ids
        if page.cursor is None:
            return seen
        cursor = page.cursor
    raise AssertionError("paging did not end")


def check_page(page: TimelinePage, cursor: int | None, limit: int) -> None:
    ids = page.ids
    assert len(ids) <= limit
    assert all(a > b for a, b in zip(ids, ids[1:], strict=False)), "not strictly descending"
    if cursor is not None:
        assert all(i < cursor for i in ids), "an id at or above the cursor"
    assert (page.cursor is None) == (not page.more)
    if page.cursor is not None:
        assert all(i >= page.cursor for i in ids)
        assert cursor is None or page.cursor < cursor, "the cursor did not move"
        if ids:
            assert page.cursor == ids[-1]


@pytest.mark.parametrize("seed", range(40))
def test_paging_yields_every_visible_post_once_newest_first(seed):
    rng = random.Random(4000 + seed)
    feed = make_feed(rng)
    for limit in (1, 2, 3, 5, 20):
        assert read_all(feed, limit) == feed.visible(), (seed, limit)


def test_random_merges_keep_the_page_invariants():
    rng = random.Random(41)
    for _ in range(2000):
        pool = rng.sample(range(1, 500), 60)
        window = set(rng.sample(pool, rng.randrange(0, 20)))
        pulled = set(rng.sample(pool, rng.randrange(0, 20)))
        in_flight = rng.sample(pool, rng.randrange(0, 10))
        limit = rng.randrange(1, 15)
        bound = rng.choice([None, *window]) if window else None
        page = merge_page(window, pulled, in_flight, bound, limit)
        check_page(page, None, limit)
        union = window | pulled | set(in_flight)
        assert set(page.ids) <= union
        if bound is not None:
            assert all(i >= bound for i in page.ids)
        else:
            head = sorted(window | pulled | set(sorted(in_flight)[-(limit + 1):]), reverse=True)
            assert page.ids == head[:limit]
            assert page.more == (len(head) > limit)
