"""Posts, likes and pull authors in MongoDB (``PostStore``). See ``feed_mongo.py``.

Reads name only indexed fields (``author`` or ``reply_to``) in the query;
the other conditions are checked on the documents here: SecantusDB scans
the collection when a filter names a field its index lacks.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any

from pymongo import DESCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from store.feed_ports import LikeRow
from store.mongo_client import mongo_guard

__all__ = ["PostsMongo"]

Doc = dict[str, Any]


class PostsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.posts, self.likes, self.users = db["posts"], db["likes"], db["users"]

    async def pullers(self) -> dict[str, int]:
        """Authors with posts that were not pushed: author -> newest such id."""
        async with mongo_guard():
            return {d["_id"]: int(d["pull_max"]) async for d in
                    self.users.find({"pull_max": {"$gt": 0}}, {"pull_max": 1})}

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

    async def by_author(self, author: str, before: int | None, limit: int, *,
                        top_level: bool = False, unpushed: bool = False) -> list[Doc]:
        """An author's live posts below ``before``, newest first (``top_level``:
        no comments; ``unpushed``: only posts readers pull)."""
        where: dict[str, Any] = {"deleted": False}
        if top_level:
            where["reply_to"] = None
        if unpushed:
            where["pushed"] = False
        return await self._page({"author": author}, before, limit, where=where)

    async def by_authors(self, authors: Sequence[str], before: int | None, limit: int
                         ) -> list[Doc]:
        """Live top-level posts of any of ``authors`` below ``before``, newest first."""
        return await self._page({"author": {"$in": sorted(authors)}}, before, limit,
                                where={"reply_to": None, "deleted": False})

    async def comments_of(self, post: int, before: int | None, limit: int) -> list[Doc]:
        return await self._page({"reply_to": post}, before, limit, where={"deleted": False})

    async def _page(self, query: dict[str, Any], before: int | None, limit: int,
                    after: int | None = None, where: dict[str, Any] | None = None
                    ) -> list[Doc]:
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

    # -- likes: {_id: "post|user", t: the like's token, c: its +1 is counted} ------
    async def like_row(self, post: int, user: str) -> LikeRow | None:
        key = f"{post}|{user}"
        async with mongo_guard():
            for _ in range(3):  # found gone between the insert and the read: again
                token = secrets.token_hex(8)
                try:
                    await self.likes.insert_one({"_id": key, "t": token, "c": False})
                    return LikeRow(token, False)
                except DuplicateKeyError:
                    doc = await self.likes.find_one({"_id": key})
                    if doc is not None:
                        return _like_row(doc)
        return None

    async def like_of(self, post: int, user: str) -> LikeRow | None:
        async with mongo_guard():
            doc = await self.likes.find_one({"_id": f"{post}|{user}"})
        return None if doc is None else _like_row(doc)

    async def like_counted(self, post: int, user: str, token: str) -> None:
        async with mongo_guard():
            await self.likes.update_one(_like_filter(post, user, token), {"$set": {"c": True}})

    async def drop_like(self, post: int, user: str, token: str) -> bool:
        async with mongo_guard():
            gone = await self.likes.delete_one(_like_filter(post, user, token))
        return bool(gone.deleted_count)


def _like_row(doc: Doc) -> LikeRow:
    token = doc.get("t")
    if token is None:  # stored before likes had tokens: it was counted when made
        return LikeRow("", True)
    return LikeRow(str(token), bool(doc.get("c")))


def _like_filter(post: int, user: str, token: str) -> Doc:
    """That row and no newer like of the same user (by ``_id``, the index)."""
    return {"_id": f"{post}|{user}", "t": token or {"$exists": False}}

