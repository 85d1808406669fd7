"""Follows both ways and follow counts in MongoDB (``FollowStore``).

``follows`` ``{_id: "a|b", a, b, t, c, g}`` and ``fans`` ``{_id: "b|a", t}``;
``users`` keeps the counts. See ``feed_mongo.py``.

A call answered ``unavailable`` may have done part of its work (the edge
written, its counts not moved; or the answer lost), and the client retries.
So each edge has a token ``t``; its +1s and -1s are made by updates that also
record them in the user's ``mv`` (its last ``MOVES_KEPT`` moves) and only
where not recorded yet: once however often tried. ``c``: the +1s are known
made. ``g``: the edge is being removed (its -1s come next): a follow that
finds such an edge finishes the removal and makes a new edge, and a removal
that finds ``c`` unset makes the +1s first (once), so the -1s never take back
what was never counted.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, DuplicateKeyError

from store.mongo_client import DUPLICATE_KEY, mongo_guard

__all__ = ["FollowsMongo"]

# A user's last count moves kept, each by edge and token: a retry within that
# many of the user's moves finds its own.
MOVES_KEPT = 256


class FollowsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.follows, self.fans, self.users = db["follows"], db["fans"], db["users"]

    async def follow(self, a: str, b: str) -> bool:
        """True if this call made the edge; the counts move once per edge."""
        now = int(time.time() * 1000)
        key = f"{a}|{b}"
        async with mongo_guard():
            for _ in range(3):  # found being removed (or gone) each time: again
                token = secrets.token_hex(8)
                doc: dict[str, Any] | None = {"t": token}
                try:
                    await self.follows.insert_one({"_id": key, "a": a, "b": b, "ts": now,
                                                   "t": token, "c": False})
                    made = True
                except DuplicateKeyError:
                    doc, made = await self.follows.find_one({"_id": key}), False
                if doc is None:
                    continue
                if doc.get("g"):  # an unfollow half done: finish it, then follow anew
                    await self._remove(a, b, doc)
                    continue
                await self._upsert_fan(a, b, now, doc.get("t"))  # again, if a try stopped
                if "t" in doc and not doc.get("c"):
                    await self._move(a, b, doc["t"], 1)
                    await self.follows.update_one({"_id": key, "t": doc["t"]},
                                                  {"$set": {"c": True}})
                return made
        # Removed each time by an unfollow of the same edge running at the same
        # time: as if this follow came first and one of those after it.
        return False

    async def _upsert_fan(self, a: str, b: str, now: int, token: str | None) -> None:
        """The fan row of edge ``token``: a removal of an older edge (whose fan row
        had its token) leaves it alone."""
        update: dict[str, Any] = {"$setOnInsert": {"b": b, "a": a, "ts": now}}
        if token is not None:
            update["$set"] = {"t": token}
        await self.fans.update_one({"_id": f"{b}|{a}"}, update, upsert=True)

    async def unfollow(self, a: str, b: str) -> bool:
        """True if the edge was there (and is gone now)."""
        async with mongo_guard():
            doc = await self.follows.find_one({"_id": f"{a}|{b}"})
            if doc is None:
                return False
            if not doc.get("g"):
                await self.follows.update_one(_edge(a, b, doc.get("t")), {"$set": {"g": True}})
            await self._remove(a, b, doc)
        return True

    async def _remove(self, a: str, b: str, doc: dict[str, Any]) -> None:
        """The -1s of an edge marked going (the +1s first if not known made),
        then its fan row and itself."""
        token = doc.get("t")
        if token is not None and not doc.get("c"):
            await self._move(a, b, token, 1)
        await self._move(a, b, token or "", -1)  # an edge from before tokens: ""
        await self.fans.delete_one(_edge(b, a, token))
        await self.follows.delete_one(_edge(a, b, token))

    async def _move(self, a: str, b: str, token: str, delta: int) -> None:
        """``a``'s following and ``b``'s followers by ``delta``, each at most once
        for this edge's token and sign."""
        sign = "+" if delta > 0 else "-"
        ops = [UpdateOne({"_id": user, "mv": {"$ne": mark}},
                         {"$inc": {field: delta},
                          "$push": {"mv": {"$each": [mark], "$slice": -MOVES_KEPT}}},
                         upsert=delta > 0)
               for user, field, mark in ((a, "following", f"f{sign}{b}|{token}"),
                                         (b, "followers", f"r{sign}{a}|{token}"))]
        try:
            await self.users.bulk_write(ops, ordered=False)
        except BulkWriteError as exc:  # made before: the upsert found the user's doc
            if any(e.get("code") != DUPLICATE_KEY for e in exc.details.get("writeErrors", [])):
                raise

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
            return await self.users.find_one({"_id": user}, {"mv": 0}) or {"_id": user}


def _edge(a: str, b: str, token: str | None) -> dict[str, Any]:
    """The row ``a|b`` (an edge, or a fan row) of that edge, and not one of a
    newer edge of the same two users (by ``_id``, the index)."""
    return {"_id": f"{a}|{b}", "t": token if token is not None else {"$exists": False}}
