"""Follows both ways and follow counts in MongoDB (``FollowStore``).

``follows`` ``{_id: "a|b", a, b}`` and ``fans`` ``{_id: "b|a"}``; ``users``
keeps the counts, moved only by a follow that was new. See ``feed_mongo.py``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from store.mongo_client import mongo_guard

__all__ = ["FollowsMongo"]


class FollowsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.follows, self.fans, self.users = db["follows"], db["fans"], db["users"]

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

    async def existing(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (a follows b) edges exist: one ``_id`` ``$in`` look-up,
        a point read per pair (SecantusDB: ~0.12 ms a pair, whatever the
        collection's size)."""
        if not pairs:
            return set()
        async with mongo_guard():
            return {(d["a"], d["b"]) async for d in self.follows.find(
                {"_id": {"$in": [f"{a}|{b}" for a, b in pairs]}}, {"a": 1, "b": 1})}

    async def all_following(self, user: str) -> list[str]:
        return await self.page_ids("following", user, None, 1_000_000)

    async def user(self, user: str) -> dict[str, Any]:
        async with mongo_guard():
            return await self.users.find_one({"_id": user}) or {"_id": user}

