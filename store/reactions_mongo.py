"""Who reacted to a message with what, in MongoDB: the truth the counts in
Redis (``store/reactions_redis.py``) are built from.

``reactions``: one small document per (message, user, emoji), ``_id`` =
``mid|user|emoji`` (a user id never holds ``|``), so adding the same reaction
twice writes nothing and removing it is a delete by ``_id``. One index,
(``m``, ``e``, ``u``): the users of one emoji in id order (the paged list)
and every reaction of one message (a rebuild of its counts).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import DuplicateKeyError

from store.mongo_client import Index, ensure_indexes, mongo_guard

__all__ = ["REACTION_INDEXES", "ReactionsMongo"]

REACTION_INDEXES: list[Index] = [
    ("reactions", [("m", ASCENDING), ("e", ASCENDING), ("u", ASCENDING)],
     {"name": "mid_emoji_user"}),
]


def reaction_id(mid: int, user: str, emoji: str) -> str:
    return f"{mid}|{user}|{emoji}"


class ReactionsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.db = db
        self.reactions = db["reactions"]

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.db, REACTION_INDEXES)

    async def set(self, mid: int, user: str, emoji: str, on: bool, at_ms: int) -> bool:
        """Add (``on``) or remove one reaction; whether that changed anything."""
        async with mongo_guard():
            if not on:
                gone = await self.reactions.delete_one({"_id": reaction_id(mid, user, emoji)})
                return gone.deleted_count > 0
            try:
                await self.reactions.insert_one({"_id": reaction_id(mid, user, emoji), "m": mid,
                                                 "u": user, "e": emoji, "ts": at_ms})
            except DuplicateKeyError:
                return False
        return True

    async def of_message(self, mid: int) -> list[tuple[str, str]]:
        """Every (user, emoji) of message ``mid``."""
        async with mongo_guard():
            return [(str(d["u"]), str(d["e"])) async for d in self.reactions.find(
                {"m": mid}, {"u": 1, "e": 1, "_id": 0})]

    async def users(self, mid: int, emoji: str, after: str | None, limit: int) -> list[str]:
        """Who reacted to ``mid`` with ``emoji``, in id order, after ``after``."""
        query: dict[str, Any] = {"m": mid, "e": emoji}
        if after is not None:
            query["u"] = {"$gt": after}
        async with mongo_guard():
            return [str(d["u"]) async for d in self.reactions.find(query, {"u": 1, "_id": 0})
                    .sort("u", ASCENDING).limit(limit)]

    async def count_of(self, mids: Sequence[int]) -> int:
        """How many reactions the messages have (tests and benchmarks)."""
        async with mongo_guard():
            return await self.reactions.count_documents({"m": {"$in": list(mids)}})
