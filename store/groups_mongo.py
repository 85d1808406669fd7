"""Groups in MongoDB: the durable truth (Redis holds caches of it, store/groups_redis.py).

- ``groups``: ``_id`` = group id; ``name``, ``owner``, ``size``, and ``seq``,
  the group's message counter: a batch of n messages to one group takes
  seqs (seq, seq + n] with one atomic ``$inc`` (journaled), so two nodes can
  never hand out the same seq, whatever happened to Redis. ``lastmid`` and
  ``rdmid`` (the newest read-diffused message) move with ``$max`` in the
  same update. ``dissolved``: set once, by the owner; the ``$inc`` filters
  on it, so no seq is handed out after it (no check-then-act window).
  ``lk`` / ``lkt``: the administration lease (until, token): membership,
  name, owner and dissolve changes of one group run one at a time.
- ``group_members``: ``_id`` = ``group|user``, indexes on ``g``, ``u`` and
  (``g``, ``u``) (member pages); ``from_seq``: the member sees messages
  after it (the group's seq when it joined); ``read_seq``: read up to here;
  ``gone``: the group was dissolved (a former member: history only).
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

from store.errors import GroupGone, Unavailable
from store.mongo_client import Index, ensure_indexes, insert_each, insert_idempotent, mongo_guard
from store.records import GroupMessage, Membership

__all__ = ["GROUP_INDEXES", "GroupsMongo", "group_message", "msg_id"]

GROUP_INDEXES: list[Index] = [
    ("group_members", [("u", ASCENDING)], {"name": "user"}),
    ("groups", [("owner", ASCENDING)], {"name": "owner"}),
    ("group_members", [("g", ASCENDING)], {"name": "group"}),
    ("group_members", [("g", ASCENDING), ("u", ASCENDING)], {"name": "group_user"}),
    ("group_msgs", [("g", ASCENDING), ("mid", ASCENDING)], {"name": "group_mid"}),
    ("group_msgs", [("mid", ASCENDING)], {"name": "mid"}),
    # Only the recalled messages (what a lost group state is rebuilt with).
    ("group_msgs", [("g", ASCENDING), ("seq", ASCENDING)],
     {"name": "group_recalled", "partialFilterExpression": {"recalled": True}}),
    ("group_msgs", [("g", ASCENDING), ("from", ASCENDING), ("cmid", ASCENDING)],
     {"unique": True, "name": "group_sender_cmid"}),
]


def msg_id(group: str, seq: int) -> str:
    return f"{group}|{seq:012d}"


def _membership(d: dict[str, Any]) -> Membership:
    return Membership(d["from_seq"], d.get("read_seq", d["from_seq"]))


def group_message(d: dict[str, Any]) -> GroupMessage:
    """A stored ``group_msgs`` document (not a seq-filling tombstone) as a record."""
    recalled = bool(d.get("recalled"))
    return GroupMessage(d["g"], d["seq"], d["mid"], d["from"], d["cmid"],
                        None if recalled else d.get("body"), bool(d.get("wd", False)), recalled,
                        int(d.get("rt", 0)), int(d.get("ed", 0)), bool(d.get("rx")))


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

    async def count_owned(self, owner: str) -> int:
        """(``dissolved`` is checked on the documents, as ``user_groups`` does.)"""
        async with mongo_guard():
            return sum([1 async for d in self.groups.find({"owner": owner}, {"dissolved": 1})
                        if not d.get("dissolved")])

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
            return [d["u"] async for d in self.members.find({"g": group}, {"u": 1, "gone": 1})
                    if not d.get("gone")]

    async def user_groups(self, user: str) -> dict[str, Membership]:
        """Every membership of ``user``: group -> (from seq, read seq).

        (``gone`` is checked on the documents: SecantusDB scans the collection
        for a filter on a field its index lacks.)"""
        async with mongo_guard():
            return {d["g"]: _membership(d) async for d in self.members.find({"u": user})
                    if not d.get("gone")}

    async def user_groups_many(self, users: Sequence[str]) -> dict[str, dict[str, Membership]]:
        """``user_groups`` of many users in one query (``u $in``: a connect storm
        of users whose Redis hash is not there costs one find per batch)."""
        out: dict[str, dict[str, Membership]] = {u: {} for u in users}
        async with mongo_guard():
            async for d in self.members.find({"u": {"$in": list(users)}}):
                if not d.get("gone"):
                    out[d["u"]][d["g"]] = _membership(d)
        return out

    async def memberships(self, group: str, users: Sequence[str]) -> dict[str, Membership]:
        """The current memberships of these users in ``group`` (point look-ups)."""
        if not users:
            return {}
        async with mongo_guard():
            return {d["u"]: _membership(d) async for d in self.members.find(
                {"_id": {"$in": [f"{group}|{u}" for u in users]}}) if not d.get("gone")}

    async def page_members(self, group: str, after: str | None, limit: int) -> list[str]:
        """Member ids in id order after ``after`` (index (g, u))."""
        query: dict[str, Any] = {"g": group}
        if after is not None:
            query["u"] = {"$gt": after}
        async with mongo_guard():
            return [d["u"] async for d in self.members.find(query, {"u": 1}).sort(
                "u", ASCENDING).limit(limit)]

    async def former(self, group: str, user: str) -> Membership | None:
        """The membership ``user`` held when ``group`` was dissolved, if any."""
        async with mongo_guard():
            d = await self.members.find_one({"_id": f"{group}|{user}"})
        return _membership(d) if d is not None and d.get("gone") else None

    # -- administration ------------------------------------------------------
    async def get_many(self, groups: Sequence[str]) -> dict[str, dict[str, Any]]:
        if not groups:
            return {}
        async with mongo_guard():
            return {d["_id"]: d async for d in self.groups.find({"_id": {"$in": list(groups)}},
                                                                 {"seq": 0})}

    async def lock(self, group: str, token: str, now_ms: int, ttl_ms: int) -> bool | None:
        """Take the group's administration lease: True if taken, False if another
        holder's has not run out, None if there is no such group."""
        async with mongo_guard():
            got = await self.groups.update_one(
                {"_id": group, "lk": {"$not": {"$gt": now_ms}}},
                {"$set": {"lk": now_ms + ttl_ms, "lkt": token}})
            if got.matched_count:
                return True
            return None if await self.groups.find_one({"_id": group}, {"_id": 1}) is None \
                else False

    async def unlock(self, group: str, token: str) -> None:
        async with mongo_guard():
            await self.groups.update_one({"_id": group, "lkt": token},
                                         {"$set": {"lk": 0, "lkt": ""}})

    async def set_info(self, group: str, *, name: str | None = None,
                       owner: str | None = None) -> None:
        changes = {k: v for k, v in (("name", name), ("owner", owner)) if v is not None}
        if changes:
            async with mongo_guard():
                await self.groups.update_one({"_id": group}, {"$set": changes})

    async def dissolve(self, group: str) -> None:
        """From now on ``allocate`` refuses the group (``GroupGone``)."""
        async with mongo_guard():
            await self.groups.update_one({"_id": group}, {"$set": {
                "dissolved": True, "dissolved_at": int(time.time() * 1000)}})

    async def retire_members(self, group: str) -> list[str]:
        """Every member of a dissolved group becomes a former member (its
        history stays readable); returns them all, former ones included, so a
        retried dissolve clears what an interrupted one left."""
        async with mongo_guard():
            users = [d["u"] async for d in self.members.find({"g": group}, {"u": 1})]
            await self.members.update_many({"g": group}, {"$set": {"gone": True}})
        return users

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
        """Take ``n`` seqs; returns the last one (the group's new seq).
        ``GroupGone`` for a dissolved (or unknown) group: the filter refuses it
        in the same atomic update, so a dissolve answered before this began
        always wins."""
        async with mongo_guard():
            doc = await self.groups.find_one_and_update(
                {"_id": group, "dissolved": {"$ne": True}},
                {"$inc": {"seq": n}, "$max": {"lastmid": lastmid, "rdmid": rdmid}},
                projection={"seq": 1}, return_document=ReturnDocument.AFTER)
        if doc is None:
            raise GroupGone(group)
        return int(doc["seq"])

    async def recall(self, mid: int, sender: str) -> GroupMessage | None:
        """Mark ``sender``'s group message recalled, body dropped (by the ``mid``
        index); None if ``sender`` sent no group message ``mid``."""
        async with mongo_guard():
            d = await self.msgs.find_one_and_update(
                {"mid": mid, "from": sender, "dead": {"$ne": True}},
                {"$set": {"recalled": True}, "$unset": {"body": ""}})
        return None if d is None else group_message({**d, "recalled": True})

    async def by_mids(self, mids: Sequence[int]) -> dict[int, GroupMessage]:
        """The group messages among ``mids`` (the ``mid`` index)."""
        async with mongo_guard():
            return {int(d["mid"]): group_message(d) async for d in self.msgs.find(
                {"mid": {"$in": list(mids)}, "dead": {"$ne": True}})}

    async def by_mid(self, mid: int) -> GroupMessage | None:
        """The group message ``mid`` (the ``mid`` index), whatever its group."""
        async with mongo_guard():
            d = await self.msgs.find_one({"mid": mid, "dead": {"$ne": True}})
        return None if d is None else group_message(d)

    async def edit(self, group: str, seq: int, sender: str, body: bytes, at_ms: int) -> bool:
        """As ``MessagesMongo.edit``, by the message's ``_id``."""
        async with mongo_guard():
            done = await self.msgs.update_one(
                {"_id": msg_id(group, seq), "from": sender, "recalled": {"$ne": True},
                 "$or": [{"ed": {"$exists": False}}, {"ed": {"$lt": at_ms}}]},
                {"$set": {"body": body, "ed": at_ms}})
        return done.matched_count > 0

    async def mark_reacted(self, group: str, seq: int) -> None:
        async with mongo_guard():
            await self.msgs.update_one({"_id": msg_id(group, seq)}, {"$set": {"rx": True}})

    async def reacted_among(self, mids: Sequence[int]) -> set[int]:
        """Those of ``mids`` that have had reactions (the ``mid`` index)."""
        async with mongo_guard():
            return {int(d["mid"]) async for d in self.msgs.find(
                {"mid": {"$in": list(mids)}, "rx": True}, {"mid": 1, "_id": 0})}

    async def sender_of(self, mid: int) -> str | None:
        async with mongo_guard():
            d = await self.msgs.find_one({"mid": mid, "dead": {"$ne": True}}, {"from": 1})
        return None if d is None else str(d["from"])

    async def recalled_seqs(self, group: str, limit: int) -> list[int]:
        """The group's newest recalled seqs (the truth a lost Redis state is rebuilt from)."""
        async with mongo_guard():
            return [int(d["seq"]) async for d in self.msgs.find(
                {"g": group, "recalled": True}, {"seq": 1}).sort("seq", -1).limit(limit)]

    async def insert(self, msgs: Sequence[GroupMessage]
                     ) -> list[GroupMessage | BaseException]:
        """Write the messages; a resend of a stored (group, sender, cmid) gets the
        stored message back (its own seq is then filled with a tombstone)."""
        docs = [{"_id": msg_id(m.group, m.seq), "g": m.group, "seq": m.seq, "mid": m.mid,
                 "from": m.sender, "cmid": m.cmid, "body": m.body, "wd": m.wd,
                 **({"rt": m.reply_to} if m.reply_to else {})} for m in msgs]
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

    async def message(self, group: str, mid: int) -> GroupMessage | None:
        async with mongo_guard():
            d = await self.msgs.find_one({"g": group, "mid": mid})
        return group_message(d) if d is not None else None

    async def between(self, low: int, high: int, limit: int) -> list[GroupMessage]:
        """The ``mid`` index, a range of a few seconds (what a dead node may have
        stored without recording it); tombstones left out."""
        async with mongo_guard():
            return [group_message(d) async for d in self.msgs.find(
                {"mid": {"$gte": low, "$lte": high}, "dead": {"$ne": True}})
                .sort("mid", ASCENDING).limit(limit)]

    async def seq_of(self, group: str, mid: int) -> int | None:
        async with mongo_guard():
            d = await self.msgs.find_one({"g": group, "mid": mid}, {"seq": 1})
        return int(d["seq"]) if d else None

    async def last(self, group: str, lastmid: int = 0) -> GroupMessage | None:
        """A point read of ``lastmid`` when it is stored (the usual case);
        otherwise the newest by mid (a store without index-ordered reads, such
        as SecantusDB, reads the whole group for that)."""
        if lastmid > 0:
            async with mongo_guard():
                d = await self.msgs.find_one({"g": group, "mid": lastmid})
            if d is not None and not d.get("dead"):
                return group_message(d)
        async with mongo_guard():
            async for d in self.msgs.find({"g": group, "mid": {"$gte": 0}}).sort(
                    "mid", DESCENDING).limit(1):
                return group_message(d)
        return None

    async def rd_index(self, group: str, scan: int) -> tuple[list[tuple[int, int]], int]:
        async with mongo_guard():
            docs = [d async for d in self.msgs.find(
                {"g": group, "mid": {"$gte": 0}}, {"mid": 1, "seq": 1, "wd": 1}).sort(
                    "mid", DESCENDING).limit(scan)]
        floor = int(docs[-1]["mid"]) - 1 if len(docs) == scan else 0
        return [(int(d["mid"]), int(d["seq"])) for d in docs if not d.get("wd")], floor
