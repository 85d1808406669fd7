"""In-memory fakes of the group store Protocols (``GroupStore``, ``GroupCache``)
and of the membership-change sender (``gateway.groups.admin.GroupNotifier``);
see ``fakes.py`` for what the fakes promise."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from router.controls import Control
from store.errors import GroupGone
from store.groups_redis import RD_FRAME_MAX, RECALLED_KEPT
from store.records import GroupMessage, GroupState, Membership
from tests.core.fakes import Faulty

__all__ = ["NO_STATE", "FakeControl", "FakeGroupCache", "FakeGroupStore"]

NO_STATE = GroupState(0, 0, None, 0)


class FakeGroupStore(Faulty):
    """``GroupStore``: groups with a seq counter, members, one copy per message
    by seq (None: a tombstone), unique on (group, sender, cmid)."""

    dependency = "mongo"

    def __init__(self) -> None:
        super().__init__()
        self.groups: dict[str, dict[str, Any]] = {}
        self.members: dict[str, dict[str, Membership]] = {}
        self.formers: dict[str, dict[str, Membership]] = {}  # of dissolved groups
        self.msgs: dict[str, dict[int, GroupMessage | None]] = {}
        self.allocations: list[tuple[str, int]] = []
        self.inserts: list[list[GroupMessage]] = []
        self.filled: list[GroupMessage] = []

    async def create(self, group: str, name: str, owner: str, members: Sequence[str]
                     ) -> None:
        self._up("create")
        self.groups[group] = {"_id": group, "name": name, "owner": owner,
                              "size": len(members), "seq": 0, "lastmid": 0, "rdmid": 0}
        self.members[group] = {u: Membership(0, 0) for u in members}
        self.msgs[group] = {}

    async def get(self, group: str) -> dict[str, Any] | None:
        self._up("get")
        doc = self.groups.get(group)
        return dict(doc) if doc is not None else None

    async def count_owned(self, owner: str) -> int:
        self._up("count_owned")
        return sum(1 for d in self.groups.values()
                   if d["owner"] == owner and not d.get("dissolved"))

    async def add_members(self, group: str, users: Sequence[str]) -> tuple[list[str], int]:
        self._up("add_members")
        seq = int(self.groups.get(group, {}).get("seq", 0))
        mine = self.members.setdefault(group, {})
        added = [u for u in dict.fromkeys(users) if u not in mine]
        for u in added:
            mine[u] = Membership(seq, seq)
        if added and group in self.groups:
            self.groups[group]["size"] += len(added)
        return added, seq

    async def remove_member(self, group: str, user: str) -> bool:
        self._up("remove_member")
        gone = self.members.get(group, {}).pop(user, None) is not None
        if gone and group in self.groups:
            self.groups[group]["size"] -= 1
        return gone

    async def member_ids(self, group: str) -> list[str]:
        self._up("member_ids")
        return list(self.members.get(group, {}))

    async def user_groups(self, user: str) -> dict[str, Membership]:
        self._up("user_groups")
        return {g: ms[user] for g, ms in self.members.items() if user in ms}

    async def user_groups_many(self, users: Sequence[str]) -> dict[str, dict[str, Membership]]:
        self._up("user_groups_many")
        return {u: {g: ms[u] for g, ms in self.members.items() if u in ms} for u in users}

    async def memberships(self, group: str, users: Sequence[str]) -> dict[str, Membership]:
        self._up("memberships")
        mine = self.members.get(group, {})
        return {u: mine[u] for u in users if u in mine}

    async def page_members(self, group: str, after: str | None, limit: int) -> list[str]:
        self._up("page_members")
        return sorted(u for u in self.members.get(group, {}) if after is None or u > after
                      )[:limit]

    async def former(self, group: str, user: str) -> Membership | None:
        self._up("former")
        return self.formers.get(group, {}).get(user)

    async def get_many(self, groups: Sequence[str]) -> dict[str, dict[str, Any]]:
        self._up("get_many")
        return {g: dict(self.groups[g]) for g in groups if g in self.groups}

    async def lock(self, group: str, token: str, now_ms: int, ttl_ms: int) -> bool | None:
        self._up("lock")
        doc = self.groups.get(group)
        if doc is None:
            return None
        if doc.get("lk", 0) > now_ms:
            return False
        doc.update(lk=now_ms + ttl_ms, lkt=token)
        return True

    async def unlock(self, group: str, token: str) -> None:
        self._up("unlock")
        doc = self.groups.get(group)
        if doc is not None and doc.get("lkt") == token:
            doc.update(lk=0, lkt="")

    async def set_info(self, group: str, *, name: str | None = None,
                       owner: str | None = None) -> None:
        self._up("set_info")
        doc = self.groups[group]
        doc.update({k: v for k, v in (("name", name), ("owner", owner)) if v is not None})

    async def dissolve(self, group: str) -> None:
        self._up("dissolve")
        self.groups[group]["dissolved"] = True

    async def retire_members(self, group: str) -> list[str]:
        self._up("retire_members")
        gone = self.formers.setdefault(group, {})
        gone.update(self.members.pop(group, {}))
        return sorted(gone)

    async def set_reads(self, reads: Sequence[tuple[str, str, int]]) -> None:
        self._up("set_reads")
        for user, group, seq in reads:
            m = self.members.get(group, {}).get(user)
            if m is not None:
                self.members[group][user] = Membership(m.from_seq, max(m.read_seq, seq))

    async def recall(self, mid: int, sender: str) -> GroupMessage | None:
        """Recalled, body dropped; None if ``sender`` sent no group message ``mid``."""
        self._up("recall")
        for slot in self.msgs.values():
            for seq, m in slot.items():
                if m is not None and m.mid == mid and m.sender == sender:
                    slot[seq] = m = GroupMessage(m.group, m.seq, m.mid, m.sender, m.cmid,
                                                 None, m.wd, recalled=True)
                    return m
        return None

    async def by_mids(self, mids: Sequence[int]) -> dict[int, GroupMessage]:
        self._up("by_mids")
        return {m.mid: m for slot in self.msgs.values() for m in slot.values()
                if m is not None and m.mid in mids}

    async def by_mid(self, mid: int) -> GroupMessage | None:
        self._up("by_mid")
        return next((m for slot in self.msgs.values() for m in slot.values()
                     if m is not None and m.mid == mid), None)

    async def edit(self, group: str, seq: int, sender: str, body: bytes, at_ms: int) -> bool:
        self._up("edit")
        m = self.msgs.get(group, {}).get(seq)
        if m is None or m.sender != sender or m.recalled or m.edited >= at_ms:
            return False
        self.msgs[group][seq] = replace(m, body=body, edited=at_ms)
        return True

    async def mark_reacted(self, group: str, seq: int) -> None:
        self._up("mark_reacted")
        m = self.msgs.get(group, {}).get(seq)
        if m is not None:
            self.msgs[group][seq] = replace(m, reacted=True)

    async def reacted_among(self, mids: Sequence[int]) -> set[int]:
        self._up("reacted_among")
        return {m.mid for slot in self.msgs.values() for m in slot.values()
                if m is not None and m.reacted and m.mid in mids}

    async def sender_of(self, mid: int) -> str | None:
        self._up("sender_of")
        return next((m.sender for slot in self.msgs.values() for m in slot.values()
                     if m is not None and m.mid == mid), None)

    async def recalled_seqs(self, group: str, limit: int) -> list[int]:
        """The group's newest recalled seqs, newest first."""
        self._up("recalled_seqs")
        return sorted((m.seq for m in self._live(group) if m.recalled), reverse=True)[:limit]

    async def allocate(self, group: str, n: int, lastmid: int, rdmid: int) -> int:
        self._up("allocate")
        doc = self.groups.get(group)
        if doc is None or doc.get("dissolved"):
            raise GroupGone(group)
        doc["seq"] += n
        doc["lastmid"] = max(doc["lastmid"], lastmid)
        doc["rdmid"] = max(doc["rdmid"], rdmid)
        self.allocations.append((group, n))
        return int(doc["seq"])

    async def insert(self, msgs: Sequence[GroupMessage]
                     ) -> list[GroupMessage | BaseException]:
        self._up("insert")
        self.inserts.append(list(msgs))
        out: list[GroupMessage | BaseException] = []
        burned: list[GroupMessage] = []
        for m in msgs:
            slot = self.msgs.setdefault(m.group, {})
            original = next((o for o in slot.values() if o is not None
                             and (o.sender, o.cmid) == (m.sender, m.cmid)), None)
            if original is None:
                slot[m.seq] = m
                out.append(m)
            else:  # a resend: the stored message back, its own seq a tombstone
                out.append(original)
                burned.append(m)
        if burned:
            await self.fill(burned)
        return out

    async def fill(self, msgs: Sequence[GroupMessage]) -> None:
        self._up("fill")
        for m in msgs:
            self.filled.append(m)
            self.msgs.setdefault(m.group, {}).setdefault(m.seq, None)

    def _live(self, group: str) -> list[GroupMessage]:
        return [m for m in self.msgs.get(group, {}).values() if m is not None]

    async def page(self, group: str, *, from_seq: int, after: int | None = None,
                   before: int | None = None, limit: int = 50, only_rd: bool = False
                   ) -> list[GroupMessage]:
        self._up("page")
        seen = [m for m in self._live(group) if m.seq > from_seq and not (only_rd and m.wd)]
        if after is not None:
            return sorted((m for m in seen if m.mid > after), key=lambda m: m.mid)[:limit]
        return sorted((m for m in seen if before is None or m.mid < before),
                      key=lambda m: m.mid, reverse=True)[:limit]

    async def message(self, group: str, mid: int) -> GroupMessage | None:
        self._up("message")
        return next((m for m in self._live(group) if m.mid == mid), None)

    async def between(self, low: int, high: int, limit: int) -> list[GroupMessage]:
        self._up("between")
        return sorted((m for g in self.msgs for m in self._live(g) if low <= m.mid <= high),
                      key=lambda m: m.mid)[:limit]

    async def seq_of(self, group: str, mid: int) -> int | None:
        self._up("seq_of")
        return next((m.seq for m in self._live(group) if m.mid == mid), None)

    async def last(self, group: str, lastmid: int = 0) -> GroupMessage | None:
        self._up("last")
        return max(self._live(group), key=lambda m: m.mid, default=None)

    async def rd_index(self, group: str, scan: int) -> tuple[list[tuple[int, int]], int]:
        self._up("rd_index")
        newest = sorted(self._live(group), key=lambda m: m.mid, reverse=True)[:scan]
        floor = newest[-1].mid - 1 if len(newest) == scan else 0
        return [(m.mid, m.seq) for m in newest if not m.wd], floor


class FakeGroupCache(Faulty):
    """``GroupCache``: member sets, each user's memberships with read seqs, and
    group states whose fields only move forward (``group_state.lua``)."""

    dependency = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.member_sets: dict[str, set[str]] = {}
        self.by_user: dict[str, dict[str, Membership]] = {}  # user -> group -> it
        self.state: dict[str, GroupState] = {}
        self.records: list[tuple[str, int, int, bytes, int]] = []
        # group -> ({mid: seq} of read-diffused messages, floor or None: unknown)
        self.index: dict[str, tuple[dict[int, int], int | None]] = {}
        self.frames: dict[str, dict[int, bytes]] = {}  # group -> seq -> kept frame
        self.store: FakeGroupStore | None = None  # what rebuild_rd reads
        self.versions: dict[str, int] = {}  # info_changed's counts

    async def is_member(self, group: str, user: str) -> bool:
        self._up("is_member")
        return user in self.member_sets.get(group, set())

    async def members(self, groups: Iterable[str]) -> dict[str, list[str]]:
        self._up("members")
        return {g: sorted(self.member_sets.get(g, set())) for g in groups}

    async def sizes(self, groups: Iterable[str]) -> dict[str, int]:
        self._up("sizes")
        return {g: len(self.member_sets.get(g, set())) for g in groups}

    async def added(self, group: str, users: Sequence[str], from_seq: int,
                    complete: bool = False) -> None:
        self._up("added")
        self.member_sets.setdefault(group, set()).update(users)
        for u in users:
            self.by_user.setdefault(u, {})[group] = Membership(from_seq, from_seq)

    async def removed(self, group: str, user: str) -> None:
        self._up("removed")
        self.member_sets.get(group, set()).discard(user)
        self.by_user.get(user, {}).pop(group, None)

    async def dissolved(self, group: str, users: Sequence[str]) -> None:
        self._up("dissolved")
        self.member_sets[group] = set()
        for u in users:
            self.by_user.get(u, {}).pop(group, None)

    async def memberships(self, group: str, users: Sequence[str]) -> dict[str, Membership]:
        self._up("memberships")
        return {u: self.by_user[u][group] for u in users if group in self.by_user.get(u, {})}

    async def user_groups(self, user: str) -> dict[str, Membership]:
        self._up("user_groups")
        return dict(self.by_user.get(user, {}))

    async def groups_of(self, users: Sequence[str]) -> list[list[str]]:
        self._up("groups_of")
        return [sorted(self.by_user.get(u, {})) for u in users]

    async def set_read(self, user: str, group: str, seq: int) -> int | None:
        self._up("set_read")
        m = self.by_user.get(user, {}).get(group)
        if m is None:
            return None
        self.by_user[user][group] = Membership(m.from_seq, max(m.read_seq, seq))
        return max(m.read_seq, seq)

    async def states(self, groups: Iterable[str], *, last: bool = True
                     ) -> dict[str, GroupState]:
        self._up("states")
        found = {g: self.state.get(g, NO_STATE) for g in groups}
        return found if last else {g: replace(st, last=None) for g, st in found.items()}

    async def edited(self, group: str, seq: int, mid: int, frame: bytes, at_ms: int) -> None:
        """As ``group_edit.lua``: the kept frame goes; the last, if it is it and
        neither a tombstone nor a later edit, becomes ``frame``."""
        self._up("edited")
        self.frames.get(group, {}).pop(seq, None)
        old = self.state.get(group)
        if old is None or old.lastmid != mid:
            return
        shown = orjson.loads(old.last) if old.last else {}
        if shown.get("recalled") or int(shown.get("edited") or 0) >= at_ms:
            return
        self.state[group] = replace(old, last=frame)

    async def recalled(self, group: str, seq: int, mid: int, tombstone: bytes) -> None:
        """As ``group_recall.lua``: on a known state, ``seq`` joins the recalled
        seqs (newest last, at most ``RECALLED_KEPT``) and the last message, if it
        was this one, becomes ``tombstone``; an unknown state is left alone."""
        self._up("recalled")
        if seq in self.frames.get(group, {}):
            self.frames[group][seq] = tombstone
        old = self.state.get(group)
        if old is None or seq in old.recalled:
            return
        kept = (*old.recalled, seq)[-RECALLED_KEPT:]
        last = tombstone if old.lastmid == mid else old.last
        self.state[group] = GroupState(old.seq, old.lastmid, last, old.rdmid, kept)

    async def created(self, group: str) -> None:
        self._up("created")
        self.state[group] = NO_STATE
        self.index[group] = ({}, 0)

    async def rd_after(self, groups: Mapping[str, int], since: int, count: int
                       ) -> dict[str, list[tuple[int, int]] | None]:
        self._up("rd_after")
        out: dict[str, list[tuple[int, int]] | None] = {}
        for g, from_seq in groups.items():
            entries, floor = self.index.get(g, ({}, None))
            out[g] = None if floor is None or floor > since else sorted(
                (mid, seq) for mid, seq in entries.items()
                if mid > since and seq > from_seq)[:count]
        return out

    async def user_groups_among(self, user: str, groups: Sequence[str]
                                ) -> dict[str, Membership]:
        mine = await self.user_groups(user)
        return {g: mine[g] for g in groups if g in mine}

    async def info_versions(self, groups: Sequence[str]) -> dict[str, int]:
        self._up("info_versions")
        return {g: self.versions.get(g, 0) for g in groups}

    async def info_changed(self, group: str) -> None:
        self._up("info_changed")
        self.versions[group] = self.versions.get(group, 0) + 1

    async def rd_frames(self, wanted: Mapping[str, Sequence[int]]
                        ) -> dict[str, list[bytes] | None]:
        """As ``group_frames.lua`` without its trim: a group missing any: None."""
        self._up("rd_frames")
        out: dict[str, list[bytes] | None] = {}
        for g, seqs in wanted.items():
            kept = self.frames.get(g, {})
            out[g] = [kept[q] for q in seqs] if all(q in kept for q in seqs) else None
        return out

    async def rebuild_rd(self, group: str) -> None:
        self._up("rebuild_rd")
        assert self.store is not None
        found, floor = await self.store.rd_index(group, 1000)
        entries, _ = self.index.get(group, ({}, None))
        self.index[group] = ({**entries, **dict(found)}, floor)

    async def record(self, updates: Sequence[tuple[str, int, int, bytes, int]],
                     senders: Sequence[tuple[str, str, int]] = (),
                     rd: Sequence[tuple[str, int, int, bytes]] = ()) -> None:
        self._up("record")
        for g, mid, seq, frame in rd:
            entries, floor = self.index.setdefault(g, ({}, None))
            entries[mid] = seq
            if len(frame) <= RD_FRAME_MAX:
                self.frames.setdefault(g, {})[seq] = frame
        for g, seq, lastmid, last, rdmid in updates:
            self.records.append((g, seq, lastmid, last, rdmid))
            old = self.state.get(g, NO_STATE)
            newer = lastmid > old.lastmid and bool(last)
            self.state[g] = GroupState(max(old.seq, seq), max(old.lastmid, lastmid),
                                       last if newer else old.last, max(old.rdmid, rdmid),
                                       old.recalled)
        for user, g, seq in senders:
            await self.set_read(user, g, seq)


class FakeControl:
    """``gateway.groups.admin.GroupNotifier``: records each membership change
    told and each push, and all of them in order (``log``)."""

    def __init__(self) -> None:
        self.told: list[tuple[list[str], Control]] = []
        self.published: list[tuple[str, bytes]] = []  # (group, frame)
        self.pushed: list[tuple[list[str], bytes]] = []  # (users, frame)
        self.log: list[tuple[str, Any]] = []

    async def tell(self, users: list[str], ctl: Control) -> None:
        self.told.append((list(users), ctl))
        self.log.append(("tell", (list(users), ctl)))

    async def publish_group_confirmed(self, group: str, frame: bytes) -> None:
        self.published.append((group, frame))
        self.log.append(("group", (group, frame)))

    async def push_users(self, users: Sequence[str], frame: bytes) -> None:
        self.pushed.append((list(users), frame))
        self.log.append(("push", (list(users), frame)))


if TYPE_CHECKING:  # mypy proves each fake satisfies its Protocol
    from gateway.groups.admin import GroupNotifier
    from store.ports import GroupCache, GroupStore

    _gs: GroupStore = FakeGroupStore()
    _gc: GroupCache = FakeGroupCache()
    _c: GroupNotifier = FakeControl()
