"""Message bodies and per-user boxes in MongoDB.

``messages``: one document per message, ``_id`` = mid, unique on
(``from``, ``cmid``) so a resend is recognised even when Redis has lost its
dedup keys. ``boxes``: one small index entry per side (an inbox
and an outbox entry), ``_id`` = ``owner|mid`` with the mid zero-padded to 16
digits, so one user's box is a contiguous, mid-ordered range of the ``_id``
index (``|`` never occurs in an id, so no owner is a prefix of another's
range) and sync needs no secondary index; rewriting an entry is idempotent.
History uses the one secondary index (owner, conv, mid).

``reads``: per (user, conversation) the highest mid read, ``_id`` =
``user|conv``: what unread counts are rebuilt from once Redis let them
expire (``store/offline_redis.py``), read by ``_id`` only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, DESCENDING, AsyncMongoClient, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from core.ids import node_of
from store.errors import Unavailable
from store.groups_mongo import group_message
from store.mongo_client import (
    Index,
    ensure_indexes,
    insert_each,
    insert_idempotent,
    mongo_guard,
)
from store.records import ChatMessage, GroupMessage, StoredMessage

__all__ = ["INDEXES", "MessagesMongo", "body_doc", "box_docs", "box_id", "chat_message"]

CHUNK = 1000  # mids per $in query

# (collection, keys, options): every index the chat collections carry.
INDEXES: list[Index] = [
    ("messages", [("from", ASCENDING), ("cmid", ASCENDING)],
     {"unique": True, "name": "sender_cmid"}),
    # What a node stored in a span of mids (``between``, after the node died).
    ("messages", [("n", ASCENDING), ("_id", ASCENDING)], {"name": "node_mid"}),
    # The recalled messages to a user (the inbox rebuild leaves them out of
    # unread): recalled messages only, so it costs other writes nothing.
    ("messages", [("to", ASCENDING), ("_id", ASCENDING)],
     {"name": "to_recalled", "partialFilterExpression": {"recalled": True}}),
    ("boxes", [("owner", ASCENDING), ("conv", ASCENDING), ("mid", ASCENDING)],
     {"name": "owner_conv_mid"}),
    # A user's box in mid order (sync): without it a sync sorts the user's
    # whole box in memory.
    ("boxes", [("owner", ASCENDING), ("mid", ASCENDING)], {"name": "owner_mid"}),
    # A user's 1:1 entries in mid order (``d`` 1; a group's write-diffused
    # entries have ``d`` 0), what the inbox rebuild reads: a box holds many
    # more group entries, which the rebuild leaves out.
    ("boxes", [("owner", ASCENDING), ("d", ASCENDING), ("mid", ASCENDING)],
     {"name": "owner_d_mid"}),
]


def box_id(owner: str, mid: int) -> str:
    return f"{owner}|{mid:016d}"


def body_doc(m: ChatMessage) -> dict[str, Any]:
    """``n``: the node that issued the mid (its node bits), for ``between``."""
    doc = {"_id": m.mid, "n": node_of(m.mid), "from": m.sender, "to": m.to, "cmid": m.cmid,
           "body": m.body}
    if m.reply_to:
        doc["rt"] = m.reply_to
    return doc


def chat_message(d: dict[str, Any]) -> ChatMessage:
    """``rt``: the mid it replies to; ``ed``: when it was last edited (unix ms);
    ``rx``: it has had reactions."""
    recalled = bool(d.get("recalled"))
    return ChatMessage(d["_id"], d["from"], d["to"], d["cmid"],
                       None if recalled else d.get("body"), recalled, int(d.get("rt", 0)),
                       int(d.get("ed", 0)), bool(d.get("rx")))


def box_docs(m: ChatMessage, mid: int) -> list[dict[str, Any]]:
    """The sender's and the receiver's box entries for a message stored as ``mid``
    (``d`` 1: a direct message, see ``INDEXES``)."""
    return [
        {"_id": box_id(m.sender, mid), "owner": m.sender, "conv": m.to, "mid": mid, "out": True,
         "d": 1},
        {"_id": box_id(m.to, mid), "owner": m.to, "conv": m.sender, "mid": mid, "out": False,
         "d": 1},
    ]


class MessagesMongo:
    """MongoDB side of 1:1 chat for one namespace (``MessageStore``)."""

    def __init__(self, client: AsyncMongoClient[dict[str, Any]], db_name: str) -> None:
        self.client = client
        self.db: AsyncDatabase[dict[str, Any]] = client[db_name]
        self.messages = self.db["messages"]
        self.boxes = self.db["boxes"]
        self.group_msgs = self.db["group_msgs"]
        self.reads = self.db["reads"]

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.db, INDEXES)

    async def ping(self) -> None:
        async with mongo_guard():
            await self.db.command("ping")

    async def store_batch(self, msgs: Sequence[ChatMessage]) -> list[int | BaseException]:
        """Write bodies, then box entries, in two bulk round trips.

        Returns per message the authoritative mid: its own, or the original
        one when (sender, cmid) was already stored under another mid.
        """
        resolved = await self._insert_bodies(msgs)
        boxes: list[dict[str, Any]] = []
        for m, mid in zip(msgs, resolved, strict=True):
            if isinstance(mid, int):
                boxes += box_docs(m, mid)
        if boxes:
            await insert_idempotent(self.boxes, boxes)
        return resolved

    async def _insert_bodies(self, msgs: Sequence[ChatMessage]) -> list[int | BaseException]:
        out: list[int | BaseException] = [m.mid for m in msgs]
        dup, failed = await insert_each(self.messages, [body_doc(m) for m in msgs])
        for i, code in failed.items():
            out[i] = Unavailable("mongo", f"write error {code}")
        if dup:
            async with mongo_guard():
                found = await self._find_originals([msgs[i] for i in dup])
            for i in dup:
                mid = found.get((msgs[i].sender, msgs[i].cmid))
                out[i] = mid if mid is not None else Unavailable("mongo", "duplicate race")
        return out

    async def _find_originals(self, msgs: Sequence[ChatMessage]) -> dict[tuple[str, str], int]:
        """Mids already stored for these (sender, cmid) pairs.

        One query per sender, ``from`` equality and ``cmid $in``, so the
        unique index answers it; an ``$or`` of pairs made SecantusDB scan
        (5 s for 100 pairs after a node's death sent many resends at once).
        """
        by_sender: dict[str, list[str]] = {}
        for m in msgs:
            by_sender.setdefault(m.sender, []).append(m.cmid)
        found: dict[tuple[str, str], int] = {}
        for sender, cmids in by_sender.items():
            cursor = self.messages.find({"from": sender, "cmid": {"$in": cmids}},
                                        {"from": 1, "cmid": 1})
            async for d in cursor:
                found[(d["from"], d["cmid"])] = d["_id"]
        return found

    async def box_page(
        self, owner: str, *, conv: str | None = None, after: int | None = None,
        before: int | None = None, limit: int = 50,
    ) -> list[StoredMessage]:
        """Messages in ``owner``'s box (1:1, and write-diffused group messages).

        ``after``: ascending from there (sync); ``before``: descending (history).
        """
        # Equality on owner (the (owner, conv, mid) index) and a range on mid: an
        # _id range would need no index on mongod, but SecantusDB answers _id
        # ranges by scanning the collection (647 ms against 1.9 ms at 60,000 boxes).
        query: dict[str, Any] = {"owner": owner}
        sort_key = "mid"
        if conv is not None:
            query["conv"] = conv
        if after is not None:
            query["mid"] = {"$gt": after}
            order = ASCENDING
        else:
            if before is not None:
                query["mid"] = {"$lt": before}
            order = DESCENDING
        async with mongo_guard():
            mids = [b["mid"] async for b in
                    self.boxes.find(query, {"mid": 1, "_id": 0}).sort(sort_key, order)
                    .limit(limit)]
            if not mids:
                return []
            bodies: dict[int, StoredMessage] = {
                d["_id"]: chat_message(d) async for d in self.messages.find({"_id": {"$in": mids}})}
            missing = [m for m in mids if m not in bodies]
            if missing:  # entries of write-diffused group messages
                bodies.update({d["mid"]: group_message(d) async for d in
                               self.group_msgs.find({"mid": {"$in": missing}})})
        return [f for mid in mids if (f := bodies.get(mid)) is not None]

    async def recall(self, mid: int, sender: str) -> ChatMessage | None:
        """Mark ``sender``'s message recalled and drop its body (the truth sync and
        history read once Redis lost it); None if ``sender`` sent no such message."""
        async with mongo_guard():
            d = await self.messages.find_one_and_update(
                {"_id": mid, "from": sender}, {"$set": {"recalled": True}, "$unset": {"body": ""}})
        return None if d is None else chat_message({**d, "recalled": True})

    async def edit(self, mid: int, sender: str, body: bytes, at_ms: int) -> bool:
        """``sender``'s message ``mid`` gets ``body``, edited at ``at_ms``: not a
        recalled one, nor over an edit made later. False: nothing changed."""
        async with mongo_guard():
            done = await self.messages.update_one(
                {"_id": mid, "from": sender, "recalled": {"$ne": True},
                 "$or": [{"ed": {"$exists": False}}, {"ed": {"$lt": at_ms}}]},
                {"$set": {"body": body, "ed": at_ms}})
        return done.matched_count > 0

    async def mark_reacted(self, mid: int) -> None:
        async with mongo_guard():
            await self.messages.update_one({"_id": mid}, {"$set": {"rx": True}})

    async def in_box(self, owner: str, mids: Sequence[int]) -> set[int]:
        """Those of ``mids`` still in ``owner``'s box (not deleted for it), by ``_id``."""
        async with mongo_guard():
            return {int(d["mid"]) async for d in self.boxes.find(
                {"_id": {"$in": [box_id(owner, m) for m in mids]}}, {"mid": 1, "_id": 0})}

    async def reacted_among(self, mids: Sequence[int]) -> set[int]:
        """Those of ``mids`` that have had reactions (by ``_id``)."""
        async with mongo_guard():
            return {int(d["_id"]) async for d in self.messages.find(
                {"_id": {"$in": list(mids)}, "rx": True}, {"_id": 1})}

    async def sender_of(self, mid: int) -> str | None:
        async with mongo_guard():
            d = await self.messages.find_one({"_id": mid}, {"from": 1})
        return None if d is None else str(d["from"])

    async def get(self, mid: int) -> ChatMessage | None:
        async with mongo_guard():
            d = await self.messages.find_one({"_id": mid})
        return None if d is None else chat_message(d)

    async def between(self, node: int, low: int, high: int, limit: int) -> list[ChatMessage]:
        """Equality on the node, a range on the mid (the ``node_mid`` index): an
        ``_id`` range alone would scan the whole collection on SecantusDB, from
        every page of every redelivery. Bodies stored before the field existed
        have no ``n`` and are not found."""
        async with mongo_guard():
            return [chat_message(d) async for d in self.messages.find(
                {"n": node, "_id": {"$gte": low, "$lte": high}}).sort("_id", ASCENDING)
                .limit(limit)]

    async def add_missing_boxes(self, msgs: Sequence[ChatMessage]) -> int:
        """One read of the box ids, one insert of those missing (``MessageStore``)."""
        if not msgs:
            return 0
        ids = [box_id(u, m.mid) for m in msgs for u in (m.sender, m.to)]
        async with mongo_guard():
            there = {d["_id"] async for d in self.boxes.find({"_id": {"$in": ids}},
                                                             {"_id": 1})}
        bare = [m for m in msgs
                if box_id(m.sender, m.mid) not in there and box_id(m.to, m.mid) not in there]
        docs = [d for m in bare for d in box_docs(m, m.mid)]
        if docs:
            await insert_idempotent(self.boxes, docs)
        return len(bare)

    async def forget(self, owner: str, mid: int) -> str | None:
        """Remove ``mid`` from ``owner``'s box only; its conversation, or None if
        it was not there."""
        async with mongo_guard():
            d = await self.boxes.find_one_and_delete({"_id": box_id(owner, mid)})
        return None if d is None else str(d["conv"])

    async def add_group_boxes(self, entries: Sequence[tuple[GroupMessage, Sequence[str]]]
                              ) -> None:
        """A box entry per (message, member) of write-diffused groups; idempotent."""
        docs = [{"_id": box_id(u, m.mid), "owner": u, "conv": f"g:{m.group}", "mid": m.mid,
                 "out": u == m.sender, "d": 0} for m, members in entries for u in members]
        if docs:
            await insert_idempotent(self.boxes, docs)

    # -- read marks, and what a user's inbox is rebuilt from (``InboxSource``) ----
    async def set_read_marks(self, marks: Sequence[tuple[str, str, int]]) -> None:
        """Upsert each (user, conv) mark with ``$max``: it never moves back."""
        top: dict[tuple[str, str], int] = {}
        for user, conv, mid in marks:
            top[(user, conv)] = max(mid, top.get((user, conv), mid))
        ops = [UpdateOne({"_id": f"{u}|{c}"}, {"$max": {"mid": mid}}, upsert=True)
               for (u, c), mid in top.items()]
        if ops:
            async with mongo_guard():
                await self.reads.bulk_write(ops, ordered=False)

    async def peer_read_marks(self, user: str, peers: Sequence[str]) -> dict[str, int]:
        if not peers:
            return {}
        async with mongo_guard():
            return {str(d["_id"]).split("|", 1)[0]: int(d["mid"]) async for d in self.reads.find(
                {"_id": {"$in": [f"{p}|{user}" for p in peers[:CHUNK]]}})}

    async def read_marks(self, user: str, convs: Sequence[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for i in range(0, len(convs), CHUNK):
            ids = [f"{user}|{c}" for c in convs[i:i + CHUNK]]
            async with mongo_guard():
                async for d in self.reads.find({"_id": {"$in": ids}}):
                    out[str(d["_id"])[len(user) + 1:]] = int(d["mid"])
        return out

    async def inbox_entries(self, owner: str, limit: int) -> list[tuple[int, str, bool]]:
        """The owner's newest 1:1 box entries (``d`` 1, or no ``d``: written
        before the field existed), newest first, at most ``limit``: the
        ``owner_d_mid`` index, so the box's group entries are not read."""
        async with mongo_guard():
            return [(int(b["mid"]), str(b["conv"]), bool(b.get("out")))
                    async for b in self.boxes.find({"owner": owner, "d": {"$in": [1, None]}},
                                                   {"mid": 1, "conv": 1, "out": 1, "_id": 0})
                    .sort("mid", DESCENDING).limit(limit)]

    async def recalled_among(self, to: str, mids: Sequence[int]) -> set[int]:
        """The recalled messages to ``to`` among ``mids``: the partial index
        ``to_recalled`` holds recalled messages only, so this reads the few a
        user got recalled, not each of its unread messages by ``_id``."""
        if not mids:
            return set()
        wanted = set(mids)
        async with mongo_guard():
            return {int(d["_id"]) async for d in self.messages.find(
                {"to": to, "recalled": True, "_id": {"$gte": min(wanted), "$lte": max(wanted)}},
                {"_id": 1}) if int(d["_id"]) in wanted}

    async def get_many(self, mids: Sequence[int]) -> dict[int, ChatMessage]:
        out: dict[int, ChatMessage] = {}
        for i in range(0, len(mids), CHUNK):
            async with mongo_guard():
                async for d in self.messages.find({"_id": {"$in": list(mids[i:i + CHUNK])}}):
                    out[int(d["_id"])] = chat_message(d)
        return out
