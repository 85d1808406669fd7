"""The feed in MongoDB: follows both ways, posts, timelines, likes, user counts.

- ``follows`` ``{_id: "a|b", a, b}``: a follows b; ``fans`` ``{_id: "b|a"}``:
  b is followed by a (seed 004's two row keys, the ``_id`` making each
  idempotent): each list pages by seek on its own index, (a, b) and (b, a).
- ``users`` ``{_id, following, followers, pull_max, tl_floor}``: counts (only
  moved by a follow that was new), the newest post id of the user that was
  not pushed to timelines, and the id below which the user's timeline was
  trimmed.
- ``posts`` ``{_id: id, author, text, ts, repost_of, reply_to, deleted,
  pushed, fanout, counts}``; ids are time-ordered 53-bit integers (the mid
  generator), so the id is the sort key.
- ``timelines`` ``{_id: "user|id16", u, p, a}``: ids and sort keys only.
- ``likes`` ``{_id: "post|user"}``: a like is once per user, whatever Redis
  knows.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, DESCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from store.mongo_client import insert_idempotent, mongo_guard

__all__ = ["FEED_INDEXES", "FeedStore", "tl_id"]

# Every read is an equality on the first key plus a range and sort on the
# second: SecantusDB answers ``_id`` ranges by scanning the collection (640 ms
# at 60,000 timeline entries, against 1.3 ms through (u, p)), mongod either way.
FEED_INDEXES: list[tuple[str, list[tuple[str, int]], dict[str, Any]]] = [
    ("follows", [("a", ASCENDING), ("b", ASCENDING)], {"name": "a_b"}),
    ("fans", [("b", ASCENDING), ("a", ASCENDING)], {"name": "b_a"}),
    ("posts", [("author", ASCENDING), ("_id", DESCENDING)], {"name": "author_id"}),
    ("posts", [("reply_to", ASCENDING), ("_id", DESCENDING)], {"name": "reply_id"}),
    ("posts", [("fanout", ASCENDING), ("_id", ASCENDING)], {"name": "fanout_id"}),
    ("timelines", [("u", ASCENDING), ("p", DESCENDING)], {"name": "user_post"}),
]


def tl_id(user: str, post: int) -> str:
    return f"{user}|{post:016d}"


class FeedStore:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.db = db
        self.follows, self.fans = db["follows"], db["fans"]
        self.users, self.posts = db["users"], db["posts"]
        self.timelines, self.likes = db["timelines"], db["likes"]

    async def ensure_indexes(self) -> None:
        async with mongo_guard():
            for collection, keys, options in FEED_INDEXES:
                await self.db[collection].create_index(keys, **options)

    # -- follows ---------------------------------------------------------------
    async def follow(self, a: str, b: str) -> bool:
        """True if new; counts move only then."""
        now = int(time.time() * 1000)
        async with mongo_guard():
            try:
                await self.follows.insert_one({"_id": f"{a}|{b}", "a": a, "b": b, "ts": now})
            except DuplicateKeyError:
                await self._upsert_fan(a, b, now)  # finish a half-done earlier follow
                return False
            await self._upsert_fan(a, b, now)
            await self.users.bulk_write([
                UpdateOne({"_id": a}, {"$inc": {"following": 1}}, upsert=True),
                UpdateOne({"_id": b}, {"$inc": {"followers": 1}}, upsert=True)], ordered=False)
        return True

    async def _upsert_fan(self, a: str, b: str, now: int) -> None:
        await self.fans.update_one({"_id": f"{b}|{a}"}, {"$setOnInsert": {"b": b, "a": a,
                                                                          "ts": now}},
                                   upsert=True)

    async def unfollow(self, a: str, b: str) -> bool:
        async with mongo_guard():
            gone = await self.follows.delete_one({"_id": f"{a}|{b}"})
            await self.fans.delete_one({"_id": f"{b}|{a}"})
            if gone.deleted_count:
                await self.users.bulk_write([
                    UpdateOne({"_id": a}, {"$inc": {"following": -1}}),
                    UpdateOne({"_id": b}, {"$inc": {"followers": -1}})], ordered=False)
        return bool(gone.deleted_count)

    async def page_ids(self, kind: str, user: str, after: str | None, limit: int) -> list[str]:
        """``following`` or ``followers`` of ``user``, by id, after ``after``."""
        coll, me, field = ((self.follows, "a", "b") if kind == "following"
                            else (self.fans, "b", "a"))
        query: dict[str, Any] = {me: user}
        if after:
            query[field] = {"$gt": after}
        async with mongo_guard():
            return [d[field] async for d in coll.find(query, {field: 1}).sort(field, ASCENDING)
                    .limit(limit)]

    async def all_following(self, user: str) -> list[str]:
        return await self.page_ids("following", user, None, 1_000_000)

    async def user(self, user: str) -> dict[str, Any]:
        async with mongo_guard():
            return await self.users.find_one({"_id": user}) or {"_id": user}

    async def pullers(self) -> dict[str, int]:
        """Authors with posts that were not pushed: author -> newest such id."""
        async with mongo_guard():
            return {d["_id"]: int(d["pull_max"]) async for d in
                    self.users.find({"pull_max": {"$gt": 0}}, {"pull_max": 1})}

    # -- posts -----------------------------------------------------------------------
    async def insert_post(self, doc: dict[str, Any]) -> None:
        async with mongo_guard():
            await self.posts.insert_one(doc)
            if not doc["pushed"]:
                await self.users.update_one({"_id": doc["author"]},
                                            {"$max": {"pull_max": doc["_id"]}}, upsert=True)

    async def get_posts(self, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        async with mongo_guard():
            return {d["_id"]: d async for d in self.posts.find({"_id": {"$in": list(ids)}})}

    async def delete_post(self, post: int) -> None:
        async with mongo_guard():
            await self.posts.update_one({"_id": post}, {"$set": {"deleted": True}})

    async def posts_page(self, query: dict[str, Any], before: int | None, limit: int,
                         after: int | None = None, where: dict[str, Any] | None = None
                         ) -> list[dict[str, Any]]:
        """Posts matching ``query`` (indexed fields only: ``author`` or ``reply_to``)
        with after < id < before, newest first, keeping those whose fields equal
        ``where``. ``where`` is applied here, not in the query: SecantusDB scans
        the collection when a filter names a field its index lacks."""
        out: list[dict[str, Any]] = []
        batch = limit * 2 + 8 if where else limit
        while len(out) < limit:
            q = dict(query)
            bounds: dict[str, int] = {}
            if before is not None:
                bounds["$lt"] = before
            if after is not None:
                bounds["$gt"] = after
            if bounds:
                q["_id"] = bounds
            async with mongo_guard():
                docs = [d async for d in self.posts.find(q).sort("_id", DESCENDING)
                        .limit(batch)]
            out += [d for d in docs if not where or all(d.get(k) == v for k, v in where.items())]
            if len(docs) < batch:
                break
            before = docs[-1]["_id"]
        return out[:limit]

    async def set_fanout(self, post: int, state: str) -> None:
        async with mongo_guard():
            await self.posts.update_one({"_id": post}, {"$set": {"fanout": state}})

    async def stuck_fanouts(self, older_than: int, limit: int = 100) -> list[dict[str, Any]]:
        async with mongo_guard():
            return [d async for d in self.posts.find(
                {"fanout": "pending", "_id": {"$lt": older_than}}).limit(limit)]

    async def flush_counts(self, counts: dict[int, dict[str, int]]) -> None:
        async with mongo_guard():
            await self.posts.bulk_write([UpdateOne({"_id": p}, {"$set": {"counts": c}})
                                         for p, c in counts.items()], ordered=False)

    async def like(self, post: int, user: str) -> bool:
        """True the first time ``user`` likes ``post``."""
        async with mongo_guard():
            try:
                await self.likes.insert_one({"_id": f"{post}|{user}"})
            except DuplicateKeyError:
                return False
        return True

    # -- timelines ---------------------------------------------------------------------
    async def fan_page(self, author: str, after: str | None, limit: int) -> list[str]:
        return await self.page_ids("followers", author, after, limit)

    async def push(self, post: int, author: str, users: Sequence[str]) -> None:
        """Timeline entries for ``users``: unordered, idempotent (``_id``)."""
        await insert_idempotent(self.timelines, [{"_id": tl_id(u, post), "u": u, "p": post,
                                                  "a": author} for u in users])

    async def timeline_page(self, user: str, floor: int, before: int | None, limit: int
                            ) -> list[tuple[int, str]]:
        """(post id, author) of ``user``'s timeline in (floor, before), newest first."""
        bounds: dict[str, int] = {"$gt": floor}
        if before is not None:
            bounds["$lt"] = before
        async with mongo_guard():
            return [(d["p"], d["a"]) async for d in self.timelines.find(
                {"u": user, "p": bounds}, {"p": 1, "a": 1}).sort("p", DESCENDING).limit(limit)]

    async def drop_author(self, user: str, author: str) -> None:
        async with mongo_guard():
            await self.timelines.delete_many({"u": user, "a": author})

    async def trim(self, user: str, keep: int) -> int | None:
        """Keep the newest ``keep`` entries; returns the new floor (or None)."""
        async with mongo_guard():
            edge = [d["p"] async for d in self.timelines.find({"u": user}, {"p": 1})
                    .sort("p", DESCENDING).skip(keep).limit(1)]
            if not edge:
                return None
            await self.timelines.delete_many({"u": user, "p": {"$lte": edge[0]}})
            await self.users.update_one({"_id": user}, {"$max": {"tl_floor": edge[0]}},
                                        upsert=True)
        return int(edge[0])
