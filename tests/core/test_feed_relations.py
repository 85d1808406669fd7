"""Relations, friends pages, unlike and one-post reads of ``FeedService`` over
fakes of its stores, and the opaque seek cursor (``core/seek_cursor.py``).
No servers."""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Sequence

import pytest

from core.errors import Unavailable
from core.seek_cursor import MAX_CURSOR, BadCursor, decode_cursor, encode_cursor
from gateway.config import Settings
from gateway.errors import ProtocolError
from gateway.feed.service import FRIENDS_SCAN
from tests.core.test_feed_service import Feed, build_feed


@pytest.fixture
def feed() -> Feed:
    return build_feed(Settings(feed_push_max=1))


class Counted:
    """Counts the follow store's reads (wraps the fake's methods)."""

    def __init__(self, feed: Feed) -> None:
        self.pages: list[tuple[str, str]] = []  # (kind, user)
        self.lookups: list[int] = []  # pairs per look-up
        page_ids, existing = feed.follows.page_ids, feed.follows.existing

        async def counted_page(kind: str, user: str, after: str | None, limit: int
                               ) -> list[str]:
            self.pages.append((kind, user))
            return await page_ids(kind, user, after, limit)

        async def counted_existing(pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
            self.lookups.append(len(pairs))
            return await existing(pairs)

        feed.follows.page_ids = counted_page  # type: ignore[method-assign]
        feed.follows.existing = counted_existing  # type: ignore[method-assign]


# -- the cursor ------------------------------------------------------------------------
def test_a_cursor_round_trips_and_is_opaque() -> None:
    c = encode_cursor("friends:u1", "bob")
    assert decode_cursor("friends:u1", c) == "bob"
    assert "bob" not in c and len(c) <= MAX_CURSOR
    assert len(encode_cursor("friends:" + "u" * 64, "v" * 64)) <= MAX_CURSOR


def test_every_altered_cursor_is_refused() -> None:
    c = encode_cursor("friends:u1", "bob")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i, ch in enumerate(c):
        for other in alphabet.replace(ch, "")[::7]:
            with pytest.raises(BadCursor):
                decode_cursor("friends:u1", c[:i] + other + c[i + 1:])
    for bad in (c[:-1], c + "A", c[1:], "", "!" * 10, c + "=", "A" * (MAX_CURSOR + 1)):
        with pytest.raises(BadCursor):
            decode_cursor("friends:u1", bad)


def test_a_cursor_of_another_list_or_forged_without_the_digest_is_refused() -> None:
    with pytest.raises(BadCursor):
        decode_cursor("friends:u2", encode_cursor("friends:u1", "bob"))
    plain = base64.urlsafe_b64encode(b"bob-and-some-more").rstrip(b"=").decode()
    with pytest.raises(BadCursor):
        decode_cursor("friends:u1", plain)


def test_a_non_canonical_spelling_is_refused() -> None:
    c = encode_cursor("s", "k")  # 9 bytes: 12 characters, no spare bits
    c2 = encode_cursor("s", "ke")  # 10 bytes: 14 characters, the last has 4 spare bits
    last = c2[-1]
    twin = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    same_bits = [x for x in twin if x != last and twin.index(x) >> 4 == twin.index(last) >> 4]
    assert decode_cursor("s", c) == "k" and decode_cursor("s", c2) == "ke"
    for x in same_bits:  # base64 would decode these to the same bytes
        with pytest.raises(BadCursor):
            decode_cursor("s", c2[:-1] + x)


# -- relations -------------------------------------------------------------------------
async def test_relation_in_all_four_combinations_is_one_look_up(feed: Feed) -> None:
    counted = Counted(feed)
    await feed.follow("a", "b")
    await feed.follow("c", "a")
    await feed.follow("a", "d")
    await feed.follow("d", "a")
    got = {u: await feed.service.relation("a", u) for u in ("b", "c", "d", "e")}
    assert got == {
        "b": {"following": True, "followed_by": False, "friends": False},
        "c": {"following": False, "followed_by": True, "friends": False},
        "d": {"following": True, "followed_by": True, "friends": True},
        "e": {"following": False, "followed_by": False, "friends": False}}
    assert counted.lookups == [2, 2, 2, 2] and counted.pages == []


async def friend_pages(feed: Feed, user: str, limit: int) -> list[list[str]]:
    pages: list[list[str]] = []
    cursor = None
    for _ in range(1000):
        page = await feed.service.friends(user, cursor, limit)
        pages.append(page["users"])
        cursor = page["cursor"]
        if cursor is None:
            return pages
    raise AssertionError("the friends cursor never reached the end")


async def test_friends_pages_hold_mutual_follows_only_in_id_order(feed: Feed) -> None:
    followed = [f"f{i:04d}" for i in range(450)]  # more than two scan chunks
    mutual = followed[::7]
    for f in followed:
        await feed.follow("u", f)
    for f in mutual:
        await feed.follow(f, "u")
    await feed.follow("fan", "u")  # follows u, not followed back
    for limit in (1, 2, 5, 64, 100):
        pages = await friend_pages(feed, "u", limit)
        assert [f for p in pages for f in p] == mutual
        assert all(len(p) == limit for p in pages[:-1]) and 0 < len(pages[-1]) <= limit


async def test_a_friends_page_never_reads_the_follower_list(feed: Feed) -> None:
    for i in range(1000):  # a big user: many followers, three follows, two mutual
        feed.follows.edges.add((f"fan{i:04d}", "big"))
    for f in ("x", "y", "z"):
        await feed.follow("big", f)
    feed.follows.edges.update({("x", "big"), ("z", "big")})
    counted = Counted(feed)
    assert await feed.service.friends("big", None, 50) == {"users": ["x", "z"], "cursor": None}
    assert counted.pages == [("following", "big")] and counted.lookups == [3]


async def test_a_page_past_the_follow_cap_stops_and_resumes_by_cursor() -> None:
    feed = build_feed(Settings(feed_follow_max=FRIENDS_SCAN))
    followed = [f"f{i:04d}" for i in range(5 * FRIENDS_SCAN)]  # past the cap (in flight)
    feed.follows.edges.update(("u", f) for f in followed)
    feed.follows.edges.add((followed[-1], "u"))  # the only friend: the last one
    counted = Counted(feed)
    first = await feed.service.friends("u", None, 10)
    assert first["users"] == [] and first["cursor"] is not None
    assert len(counted.pages) == 2  # the budget: cap // 200 + 1 rounds
    assert [f for p in await friend_pages(feed, "u", 10) for f in p] == [followed[-1]]


async def test_a_bad_or_foreign_friends_cursor_is_bad_request(feed: Feed) -> None:
    for f in ("a", "b", "c"):
        await feed.follow("u", f)
        await feed.follow(f, "u")
    page = await feed.service.friends("u", None, 1)
    assert page["users"] == ["a"]
    assert (await feed.service.friends("u", page["cursor"], 1))["users"] == ["b"]
    for bad in (page["cursor"][:-1], "a", encode_cursor("friends:v", "a"),
                encode_cursor("friends:u", "g:x"), encode_cursor("friends:u", "a b")):
        with pytest.raises(ProtocolError) as err:
            await feed.service.friends("u", bad, 1)
        assert err.value.code == "bad_request"


# -- likes and one post ------------------------------------------------------------------
async def test_unlike_moves_the_count_once_and_only_after_a_like(feed: Feed) -> None:
    post = await feed.post("a")

    async def likes() -> int:
        return int((await feed.service.post(post))["counts"]["likes"])

    await feed.service.unlike("u", post)  # never liked: nothing changes
    assert await likes() == 0
    await feed.service.like("u", post)
    await feed.service.like("u", post)
    await feed.service.like("v", post)
    assert await likes() == 2
    await feed.service.unlike("u", post)
    await feed.service.unlike("u", post)
    assert await likes() == 1 and set(feed.posts.likes) == {(post, "v")}
    await feed.service.like("u", post)
    assert await likes() == 2


async def _likes(feed: Feed, post: int) -> int:
    return int((await feed.service.post(post))["counts"]["likes"])


async def _retried(call: Callable[[], Awaitable[None]], feed: Feed) -> None:
    """``call`` answered ``unavailable`` (its answer lost, or a store down); then,
    the stores well again, the client's retry."""
    with pytest.raises(Unavailable):
        await call()
    feed.posts.heal()
    feed.counters.heal()
    await call()


@pytest.mark.parametrize("lost", ["like_row", "like_once", "like_counted"])
async def test_a_like_retried_after_unavailable_counts_once(feed: Feed, lost: str) -> None:
    # Each step of a like done, its answer lost: the retry finds the row (and
    # maybe its +1) there, and the count still ends at one, not zero or two.
    post = await feed.post("a")
    store = feed.counters if lost == "like_once" else feed.posts
    store.lose(lost)
    await _retried(lambda: feed.service.like("u", post), feed)
    assert await _likes(feed, post) == 1 and feed.posts.likes[(post, "u")].counted
    await feed.service.unlike("u", post)
    assert await _likes(feed, post) == 0 and not feed.posts.likes


@pytest.mark.parametrize("lost", ["unlike_once", "drop_like"])
async def test_an_unlike_retried_after_unavailable_counts_once(feed: Feed, lost: str) -> None:
    post = await feed.post("a")
    await feed.service.like("u", post)
    await feed.service.like("v", post)
    store = feed.counters if lost == "unlike_once" else feed.posts
    store.lose(lost)
    await _retried(lambda: feed.service.unlike("u", post), feed)
    assert await _likes(feed, post) == 1 and set(feed.posts.likes) == {(post, "v")}


async def test_a_like_after_a_half_done_unlike_counts_once(feed: Feed) -> None:
    # The unlike's -1 moved, then dropping the row failed: the row is there but
    # no longer counted. A like now finishes that unlike and makes a new row.
    post = await feed.post("a")
    await feed.service.like("u", post)
    feed.posts.fail("drop_like")
    with pytest.raises(Unavailable):
        await feed.service.unlike("u", post)
    assert await _likes(feed, post) == 0 and (post, "u") in feed.posts.likes
    feed.posts.heal()
    await feed.service.like("u", post)
    assert await _likes(feed, post) == 1 and feed.posts.likes[(post, "u")].counted
    await feed.service.unlike("u", post)
    assert await _likes(feed, post) == 0 and not feed.posts.likes


async def test_an_unlike_of_a_like_never_counted_moves_nothing(feed: Feed) -> None:
    # The like's row was written, its +1 never made (the counter was down) and
    # the user gave up; the unlike takes nothing back, and a later +1 of that
    # row is refused (-1): the like is being undone.
    post = await feed.post("a")
    await feed.service.like("v", post)
    feed.counters.fail("like_once")
    with pytest.raises(Unavailable):
        await feed.service.like("u", post)
    feed.counters.heal()
    token = feed.posts.likes[(post, "u")].token
    await feed.service.unlike("u", post)
    assert await _likes(feed, post) == 1 and set(feed.posts.likes) == {(post, "v")}
    assert await feed.counters.like_once(post, "u", token, False) == -1
    assert await _likes(feed, post) == 1


async def test_unlike_and_get_of_a_missing_or_deleted_post_are_not_found(feed: Feed) -> None:
    post = await feed.post("a")
    await feed.service.like("u", post)
    await feed.service.delete("a", post)
    for call in (feed.service.unlike("u", post), feed.service.post(post),
                 feed.service.unlike("u", 12345), feed.service.post(12345)):
        with pytest.raises(ProtocolError) as err:
            await call
        assert err.value.code == "not_found"


async def test_one_post_has_the_timeline_shape(feed: Feed) -> None:
    original = await feed.post("a", text="first")
    repost = await feed.post("b", text="", repost_of=original)
    comment = await feed.post("c", text="nice", reply_to=original)
    got = await feed.service.post(repost)
    assert got["original"]["id"] == original and got["original"]["counts"] == {
        "reposts": 1, "comments": 1, "likes": 0}
    timeline = (await feed.service.user_posts("b", None, 10))["posts"]
    assert timeline == [got]
    assert (await feed.service.post(comment))["reply_to"] == original
    await feed.service.delete("a", original)
    assert (await feed.service.post(repost))["original"] == {"id": original, "deleted": True}
