"""Follow counts move once per edge when a follow or unfollow is retried after
``unavailable`` with part of it done: each half-done state such a call can
leave is written here as it would be left, then the retry (or the other call)
runs on a real MongoDB-compatible store."""

from __future__ import annotations

import asyncio
from typing import Any

from store.follows_mongo import FollowsMongo
from tests.conftest import uid


async def counts(store: FollowsMongo, a: str, b: str) -> tuple[int, int]:
    return (int((await store.user(a)).get("following", 0)),
            int((await store.user(b)).get("followers", 0)))


async def edge(mongo_db: Any, a: str, b: str) -> dict[str, Any] | None:
    doc: dict[str, Any] | None = await mongo_db.follows.find_one({"_id": f"{a}|{b}"})
    return doc


async def test_a_follow_whose_counts_never_moved_moves_them_when_retried(mongo_db):
    store, a, b = FollowsMongo(mongo_db), uid("a"), uid("b")
    # the first try wrote the edge, then failed before its counts moved
    await mongo_db.follows.insert_one({"_id": f"{a}|{b}", "a": a, "b": b, "ts": 1,
                                       "t": "t1", "c": False})
    assert await store.follow(a, b) is False
    assert await counts(store, a, b) == (1, 1)
    assert (await edge(mongo_db, a, b) or {}).get("c") is True
    assert await store.page_ids("followers", b, None, 10) == [a]
    assert await store.follow(a, b) is False and await counts(store, a, b) == (1, 1)


async def test_a_follow_whose_answer_was_lost_counts_once_when_retried(mongo_db):
    store, a, b = FollowsMongo(mongo_db), uid("a"), uid("b")
    assert await store.follow(a, b) is True
    # as if the answer to the last step was lost: the edge not yet marked counted
    await mongo_db.follows.update_one({"_id": f"{a}|{b}"}, {"$set": {"c": False}})
    assert await store.follow(a, b) is False
    assert await counts(store, a, b) == (1, 1)
    assert "mv" not in await store.user(a)  # the marks are not read with the profile


async def test_an_unfollow_retried_or_half_done_takes_the_counts_back_once(mongo_db):
    store, a, b, c = FollowsMongo(mongo_db), uid("a"), uid("b"), uid("c")
    await store.follow(a, b)
    await store.follow(c, b)
    doc = await edge(mongo_db, a, b)
    assert doc is not None
    # an unfollow whose -1s were made, then stopped: the edge is still there
    await mongo_db.follows.update_one({"_id": f"{a}|{b}"}, {"$set": {"g": True}})
    await store._move(a, b, doc["t"], -1)
    assert await counts(store, a, b) == (0, 1)
    assert await store.unfollow(a, b) is True  # the retry finishes it, moving nothing
    assert await counts(store, a, b) == (0, 1) and await edge(mongo_db, a, b) is None
    assert await store.page_ids("followers", b, None, 10) == [c]
    assert await store.unfollow(a, b) is False  # and again: nothing
    assert await counts(store, a, b) == (0, 1)


async def test_a_follow_after_a_half_done_unfollow_makes_a_new_edge(mongo_db):
    store, a, b = FollowsMongo(mongo_db), uid("a"), uid("b")
    await store.follow(a, b)
    doc = await edge(mongo_db, a, b)
    assert doc is not None
    await mongo_db.follows.update_one({"_id": f"{a}|{b}"}, {"$set": {"g": True}})
    await store._move(a, b, doc["t"], -1)
    assert await store.follow(a, b) is True
    again = await edge(mongo_db, a, b)
    assert again is not None and again["t"] != doc["t"] and again["c"] is True
    assert await counts(store, a, b) == (1, 1)
    assert await store.page_ids("following", a, None, 10) == [b]


async def test_an_unfollow_of_an_edge_never_counted_takes_nothing_back(mongo_db):
    store, a, b, c = FollowsMongo(mongo_db), uid("a"), uid("b"), uid("c")
    await store.follow(c, b)
    await mongo_db.follows.insert_one({"_id": f"{a}|{b}", "a": a, "b": b, "ts": 1,
                                       "t": "t1", "c": False})
    assert await store.unfollow(a, b) is True
    assert await counts(store, a, b) == (0, 1)


async def test_an_edge_from_before_tokens_is_unfollowed_once(mongo_db):
    store, a, b = FollowsMongo(mongo_db), uid("a"), uid("b")
    await mongo_db.follows.insert_one({"_id": f"{a}|{b}", "a": a, "b": b, "ts": 1})
    await mongo_db.fans.insert_one({"_id": f"{b}|{a}", "a": a, "b": b, "ts": 1})
    await mongo_db.users.insert_many([{"_id": a, "following": 1}, {"_id": b, "followers": 1}])
    assert await store.follow(a, b) is False and await counts(store, a, b) == (1, 1)
    # its removal stopped after the -1s: the retry takes nothing more
    await mongo_db.follows.update_one({"_id": f"{a}|{b}"}, {"$set": {"g": True}})
    await store._move(a, b, "", -1)
    assert await store.unfollow(a, b) is True
    assert await store.unfollow(a, b) is False
    assert await counts(store, a, b) == (0, 0)
    assert await store.page_ids("followers", b, None, 10) == []


async def test_concurrent_follows_and_unfollows_of_one_edge_end_consistent(mongo_db):
    store, a, b = FollowsMongo(mongo_db), uid("a"), uid("b")
    for rounds in range(4):
        calls = [store.follow(a, b) if (i + rounds) % 3 else store.unfollow(a, b)
                 for i in range(9)]
        await asyncio.gather(*calls)
        there = await edge(mongo_db, a, b) is not None
        assert await counts(store, a, b) == (int(there), int(there))
        fans = await store.page_ids("followers", b, None, 10)
        assert fans == ([a] if there else []), (there, fans)
