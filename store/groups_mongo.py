"""Groups in MongoDB: the durable truth (Redis holds caches of it, store/group_cache.py).

- ``groups``: ``_id`` = group id; ``name``, ``owner``, ``size``, and ``seq``,
  the group's message counter: a batch of n messages to one group takes
  seqs (seq, seq + n] with one atomic ``$inc`` (journaled), so two nodes can
  never hand out the same seq, whatever happened to Redis. ``lastmid`` and
  ``rdmid`` (the newest read-diffused message) move with ``$max`` in the
  same update.
- ``group_members``: ``_id`` = ``group|user``, indexes on ``g`` and ``u``;
  ``from_seq``: the member sees messages after it (the group's seq when it
  joined); ``read_seq``: read up to here.
- ``group_msgs``: one copy per message, ``_id`` = ``group|seq`` (12 digits),
  with ``mid``, ``from``, ``cmid``, ``body``, and ``wd`` (whether it was also
  written to the members' boxes). Unique (g, from, cmid) recognises a resend
  even when Redis lost its dedup keys. A seq whose message could not be
  written (the store failed after the seq was taken, or the seq was taken by
  a resend that turned out to be a duplicate) is filled with a tombstone
  (``dead``, no ``mid``), so the seqs stored are 1..seq with no gap; reads
  by mid never see tombstones.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pymongo import ASCENDING, DESCENDING, ReturnDocument, UpdateOne
from pymongo.asynchronous.database import AsyncDatabase

from store.errors import Unavailable
from store.mongo_client import Index, ensure_indexes, insert_each, insert_idempotent, mongo_guard
from store.records import GroupMessage, Membership

__all__ = ["GROUP_INDEXES", "GroupsMongo", "group_message", "msg_id"]

GROUP_INDEXES: list[Index] = [
    ("group_members", [("u", ASCENDING)], {"name": "user"}),
    ("group_members", [("g", ASCENDING)], {"name": "group"}),
    ("group_msgs", [("g", ASCENDING), ("mid", ASCENDING)], {"name": "group_mid"}),
    ("group_msgs", [("mid", ASCENDING)], {"name": "mid"}),
    ("group_msgs", [("g", ASCENDING), ("from", ASCENDING), ("cmid", ASCENDING)],
     {"unique": True, "name": "group_sender_cmid"}),
]


def msg_id(group: str, seq: int) -> str:
    return f"{group}|{seq:012d}"


def group_message(d: dict[str, Any]) -> GroupMessage:
    """A stored ``group_msgs`` document (not a tombstone) as a record."""
    return GroupMessage(d["g"], d["seq"], d["mid"], d["from"], d["cmid"], d["body"],
                        bool(d.get("wd", False)))


class GroupsMongo:
    """MongoDB side of groups for one namespace (``GroupStore``)."""

    def __init__(self, db: AsyncDatabase[dict[str, Any]]) -> None:
        self.db = db
        self.groups = db["groups"]
        self.members = db["group_members"]
        self.msgs = db["group_msgs"]

    async def ensure_indexes(self) -> None:
        await ensure_indexes(self.db, GROUP_INDEXES)

    # -- groups and members --------------------------------------------------
    async def create(self, group: str, name: str, owner: str, members: Sequence[str]) -> None:
        async with mongo_guard():
            await self.groups.insert_one({"_id": group, "name": name, "owner": owner,
                                          "size": len(members), "seq": 0, "lastmid": 0,
                                          "rdmid": 0, "created": int(time.time() * 1000)})
            await self.members.insert_many([self._member(group, u, 0) for u in members],
                                           ordered=False)

    @staticmethod
    def _member(group: str, user: str, seq: int) -> dict[str, Any]:
        return {"_id": f"{group}|{user}", "g": group, "u": user, "from_seq": seq,
                "read_seq": seq}

    async def get(self, group: str) -> dict[str, Any] | None:
        async with mongo_guard():
            return await self.groups.find_one({"_id": group})

    async def add_members(self, group: str, users: Sequence[str]) -> tuple[list[str], int]:
        """Add ``users`` (those already members stay as they are); they see
        messages from the group's current seq on. Returns (added, that seq)."""
        async with mongo_guard():
            doc = await self.groups.find_one({"_id": group}, {"seq": 1})
        seq = int(doc["seq"]) if doc else 0
        dup, failed = await insert_each(self.members,
                                        [self._member(group, u, seq) for u in users])
        if failed:
            raise Unavailable("mongo", "member write failed")
        added = [u for i, u in enumerate(users) if i not in dup]
        async with mongo_guard():
            if added:
                await self.groups.update_one({"_id": group}, {"$inc": {"size": len(added)}})
        return added, seq

    async def remove_member(self, group: str, user: str) -> bool:
        async with mongo_guard():
            gone = await self.members.delete_one({"_id": f"{group}|{user}"})
            if gone.deleted_count:
                await self.groups.update_one({"_id": group}, {"$inc": {"size": -1}})
        return bool(gone.deleted_count)

    async def member_ids(self, group: str) -> list[str]:
        async with mongo_guard():
            return [d["u"] async for d in self.members.find({"g": group}, {"u": 1})]

    async def user_groups(self, user: str) -> dict[str, Membership]:
        """Every membership of ``user``: group -> (from seq, read seq)."""
        async with mongo_guard():
            return {d["g"]: Membership(d["from_seq"], d.get("read_seq", d["from_seq"]))
                    async for d in self.members.find({"u": user})}

    async def set_reads(self, reads: Sequence[tuple[str, str, int]]) -> None:
        """(user, group, seq): read seqs only move forward; one round trip."""
        if not reads:
            return
        async with mongo_guard():
            await self.members.bulk_write(
                [UpdateOne({"_id": f"{g}|{u}"}, {"$max": {"read_seq": seq}})
                 for u, g, seq in reads], ordered=False)

    # -- messages ------------------------------------------------------------
    async def allocate(self, group: str, n: int, lastmid: int, rdmid: int) -> int:
        """Take ``n`` seqs; returns the last one (the group's new seq)."""
        async with mongo_guard():
            doc = await self.groups.find_one_and_update(
                {"_id": group}, {"$inc": {"seq": n}, "$max": {"lastmid": lastmid,
                                                              "rdmid": rdmid}},
                projection={"seq": 1}, return_document=ReturnDocument.AFTER)
        if doc is None:
            raise Unavailable("mongo", "group vanished")
        return int(doc["seq"])

    async def insert(self, msgs: Sequence[GroupMessage]
                     ) -> list[GroupMessage | BaseException]:
        """Write the messages; a resend of a stored (group, sender, cmid) gets the
        stored message back (its own seq is then filled with a tombstone)."""
        docs = [{"_id": msg_id(m.group, m.seq), "g": m.group, "seq": m.seq, "mid": m.mid,
                 "from": m.sender, "cmid": m.cmid, "body": m.body, "wd": m.wd} for m in msgs]
        out: list[GroupMessage | BaseException] = list(msgs)
        dup, failed = await insert_each(self.msgs, docs)
        burned = [msgs[i] for i in sorted(dup | set(failed))]
        for i, code in failed.items():
            out[i] = Unavailable("mongo", f"write error {code}")
        for i in dup:
            m = msgs[i]
            async with mongo_guard():
                original = await self.msgs.find_one({"g": m.group, "from": m.sender,
                                                     "cmid": m.cmid})
            if original is not None and original.get("mid") is not None:
                out[i] = group_message(original)
            else:
                out[i] = Unavailable("mongo", "write error duplicate seq")
        if burned:
            await self.fill(burned)
        return out

    async def fill(self, msgs: Sequence[GroupMessage]) -> None:
        """Tombstones for seqs that hold no message (idempotent)."""
        await insert_idempotent(self.msgs, [
            {"_id": msg_id(m.group, m.seq), "g": m.group, "seq": m.seq, "dead": True,
             "from": "~", "cmid": f"~{m.seq}"} for m in msgs])

    async def page(self, group: str, *, from_seq: int, after: int | None = None,
                   before: int | None = None, limit: int = 50, only_rd: bool = False
                   ) -> list[GroupMessage]:
        """A member's view of the group's messages by mid (seq > ``from_seq``):
        ascending after ``after`` (sync) or descending before ``before``.

        The query names only (g, mid), its index; seq and ``wd`` are checked on
        the documents (SecantusDB scans the collection for a filter on a field
        its index lacks)."""
        out: list[GroupMessage] = []
        batch = limit + 16
        while len(out) < limit:
            bounds: dict[str, int] = {}
            if after is not None:
                bounds["$gt"] = after
            elif before is not None:
                bounds["$lt"] = before
            else:
                bounds["$gte"] = 0
            order = ASCENDING if after is not None else DESCENDING
            async with mongo_guard():
                docs = [d async for d in self.msgs.find({"g": group, "mid": bounds})
                        .sort("mid", order).limit(batch)]
            out += [group_message(d) for d in docs
                    if d["seq"] > from_seq and not (only_rd and d.get("wd"))]
            if len(docs) < batch:
                break
            if after is None and all(d["seq"] <= from_seq for d in docs):
                break  # going back in time, and past the member's joining
            if after is not None:
                after = docs[-1]["mid"]
            else:
                before = docs[-1]["mid"]
        return out[:limit]

    async def seq_of(self, group: str, mid: int) -> int | None:
        async with mongo_guard():
            d = await self.msgs.find_one({"g": group, "mid": mid}, {"seq": 1})
        return int(d["seq"]) if d else None

    async def last(self, group: str) -> GroupMessage | None:
        async with mongo_guard():
            async for d in self.msgs.find({"g": group, "mid": {"$gte": 0}}).sort(
                    "mid", DESCENDING).limit(1):
                return group_message(d)
        return None
