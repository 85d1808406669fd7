"""Timelines in MongoDB (``TimelineStore``): ``{_id: "user|id16", u, p, a}``,
ids and sort keys only. See ``feed_mongo.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from store.feed_mongo import tl_id
from store.mongo_client import insert_idempotent, mongo_guard

__all__ = ["TimelineMongo"]


class TimelineMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.timelines, self.users = db["timelines"], db["users"]

    async def push(self, post: int, author: str, users: Sequence[str]) -> None:
        """Timeline entries for ``users``: unordered, idempotent (``_id``)."""
        await insert_idempotent(self.timelines, [{"_id": tl_id(u, post), "u": u, "p": post,
                                                  "a": author} for u in users])

    async def page(self, user: str, floor: int, before: int | None, limit: int
                   ) -> list[tuple[int, str]]:
        """(post id, author) of ``user``'s timeline in (floor, before), newest first."""
        bounds: dict[str, int] = {"$gt": floor}
        if before is not None:
            bounds["$lt"] = before
        async with mongo_guard():
            return [(d["p"], d["a"]) async for d in self.timelines.find(
                {"u": user, "p": bounds}, {"p": 1, "a": 1}).sort("p", DESCENDING).limit(limit)]

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
