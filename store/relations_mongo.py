"""Who may reach whom, in MongoDB (``RelationStore``): privacy settings, blocks
and the "has sent to" half of a user's contacts (the other half is the
follows of ``follows_mongo.py``).

- ``privacy``: ``{_id: user, dm, presence, group_add}``, only the settings a
  user changed (the node's defaults fill in the rest).
- ``blocks``: ``{_id: "a|b", a, b, ts}``: ``a`` blocked ``b``. A user's blocks
  are the ``_id`` range ``a|`` .. (paged by ``_id``, no other index).
- ``sent``: ``{_id: "a|b"}``: ``a`` has sent ``b`` a 1:1 message (written once
  per pair; the node remembers the pairs it wrote).

Every check is a point read by ``_id`` (``$in`` for several), one round trip.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from store.mongo_client import mongo_guard
from store.ports import FollowStore

__all__ = ["RelationsMongo"]

SEP = "|"  # not a valid id character: "a|b" names one pair


def _ids(pairs: Sequence[tuple[str, str]]) -> list[str]:
    return [f"{a}{SEP}{b}" for a, b in pairs]


class RelationsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]], follows: FollowStore) -> None:
        self.privacy, self.blocks, self.sent = db["privacy"], db["blocks"], db["sent"]
        self.follows = follows

    # -- privacy ---------------------------------------------------------------
    async def privacy_of(self, users: Sequence[str]) -> dict[str, dict[str, str]]:
        """The settings each user changed (absent: none)."""
        async with mongo_guard():
            return {d["_id"]: {k: v for k, v in d.items() if k != "_id"}
                    async for d in self.privacy.find({"_id": {"$in": list(users)}})}

    async def set_privacy(self, user: str, changes: Mapping[str, str]) -> dict[str, str]:
        async with mongo_guard():
            doc = await self.privacy.find_one_and_update(
                {"_id": user}, {"$set": dict(changes)}, upsert=True, return_document=True)
        return {k: v for k, v in (doc or {}).items() if k != "_id"}

    # -- blocks ----------------------------------------------------------------
    async def block(self, a: str, b: str) -> None:
        async with mongo_guard():
            await self.blocks.update_one({"_id": f"{a}{SEP}{b}"},
                                         {"$setOnInsert": {"a": a, "b": b,
                                                           "ts": int(time.time() * 1000)}},
                                         upsert=True)

    async def unblock(self, a: str, b: str) -> None:
        async with mongo_guard():
            await self.blocks.delete_one({"_id": f"{a}{SEP}{b}"})

    async def blocks_page(self, a: str, after: str | None, limit: int) -> list[str]:
        """Whom ``a`` blocked, by id, after ``after``."""
        low = f"{a}{SEP}{after}" if after is not None else f"{a}{SEP}"
        query = {"_id": {"$gt": low, "$lt": f"{a}{SEP}\x7f"}}
        async with mongo_guard():
            return [d["b"] async for d in self.blocks.find(query, {"b": 1})
                    .sort("_id", 1).limit(limit)]

    async def blocking(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (a blocked b) pairs exist."""
        if not pairs:
            return set()
        async with mongo_guard():
            return {(d["a"], d["b"]) async for d in self.blocks.find(
                {"_id": {"$in": _ids(pairs)}}, {"a": 1, "b": 1})}

    # -- contacts ---------------------------------------------------------------
    async def note_sent(self, pairs: Sequence[tuple[str, str]]) -> None:
        """``a`` has sent ``b`` a 1:1 message, for each pair (idempotent)."""
        if not pairs:
            return
        async with mongo_guard():
            await self.sent.bulk_write([UpdateOne({"_id": i}, {"$setOnInsert": {}}, upsert=True)
                                        for i in _ids(pairs)], ordered=False)

    async def contacts(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (owner, other) pairs are contacts: ``owner`` follows
        ``other`` or has sent ``other`` a 1:1 message."""
        if not pairs:
            return set()
        async with mongo_guard():
            sent = {tuple(d["_id"].split(SEP, 1)) async for d in self.sent.find(
                {"_id": {"$in": _ids(pairs)}}, {"_id": 1})}
        found: set[tuple[str, str]] = {(a, b) for a, b in sent}
        rest = [p for p in pairs if p not in found]
        return found | await self.follows.existing(rest)
