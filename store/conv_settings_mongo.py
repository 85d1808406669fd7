"""Each user's settings of its conversations (muted, pinned, archived) in
MongoDB: the truth ``store/conv_settings_redis.py`` keeps a copy of.

``conv_settings``: one document per (user, conversation) with a setting on,
``_id`` = ``user|conv``, fields ``u``, ``c`` and ``m`` / ``p`` / ``a``; a
conversation back to all off is deleted. Indexes: ``u`` (a user's
settings), and ``c`` over muted documents only (who muted a group: its
``offline.group`` event names them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import ASCENDING
from pymongo.asynchronous.database import AsyncDatabase

from store.mongo_client import Index, ensure_indexes, mongo_guard
from store.records import ConvSettings

__all__ = ["CONV_SETTINGS_INDEXES", "ConvSettingsMongo"]

CONV_SETTINGS_INDEXES: list[Index] = [
    ("conv_settings", [("u", ASCENDING)], {"name": "user"}),
    ("conv_settings", [("c", ASCENDING)],
     {"name": "muted_conv", "partialFilterExpression": {"m": True}}),
]
LETTERS = {"muted": "m", "pinned": "p", "archived": "a"}


def settings_of(d: Mapping[str, Any]) -> ConvSettings:
    return ConvSettings(bool(d.get("m")), bool(d.get("p")), bool(d.get("a")))


class ConvSettingsMongo:
    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.db = db
        self.settings = db["conv_settings"]

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.db, CONV_SETTINGS_INDEXES)

    async def put(self, user: str, conv: str, value: ConvSettings) -> None:
        _id = f"{user}|{conv}"
        async with mongo_guard():
            if value == ConvSettings():
                await self.settings.delete_one({"_id": _id})
            else:
                await self.settings.replace_one(
                    {"_id": _id}, {"_id": _id, "u": user, "c": conv, "m": value.muted,
                                   "p": value.pinned, "a": value.archived}, upsert=True)

    async def of_user(self, user: str) -> dict[str, ConvSettings]:
        async with mongo_guard():
            return {str(d["c"]): settings_of(d) async for d in self.settings.find({"u": user})}

    async def muted_by(self, conv: str, limit: int) -> list[str]:
        """Who muted ``conv`` (a group's ``g:G``), at most ``limit``."""
        async with mongo_guard():
            return [str(d["u"]) async for d in self.settings.find(
                {"c": conv, "m": True}, {"u": 1, "_id": 0}).limit(limit)]
