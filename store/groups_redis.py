"""Groups in Redis: caches of MongoDB's truth that the hot paths read.

- ``gs:{g:G}``: the group's seq, newest message and newest read-diffused mid
  (``group_state.lua``: every field only moves forward), and ``iv``: how
  often its name, owner or size changed (nodes' copies of its document). ``ok`` marks a hash
  filled from MongoDB; a hash without it (Redis lost the key, or only a
  send wrote to it since) is merged with MongoDB's values on first read.
- ``gn:{gn:N}``: a summary of groups' numbers (seq, last mid, newest
  read-diffused mid, recalled seqs) in ``GROUP_NUMBER_SHARDS`` hashes, so a
  list of a user's groups reads at most that many keys whatever their number
  (``group_numbers.lua``; an entry merged from a complete state is complete,
  one only a send wrote to is filled from ``gs`` on first read).
- ``grd:{g:G}``: the group's newest ``RD_KEPT`` read-diffused messages (seq
  by mid) and ``~`` at the floor above which it is complete: a sync learns
  which groups hold its next messages without asking MongoDB
  (``group_rd.lua``; without ``~`` it is rebuilt from MongoDB).
- ``grf:{g:G}``: the client frames of the group's newest ``RD_FRAMES``
  read-diffused messages of at most ``RD_FRAME_MAX`` bytes, by seq (a
  recalled one's tombstone once recalled): a sync of groups with news answers
  from them, and reads MongoDB only for a group missing one
  (``group_frames.lua``).
- ``gm:{g:G}``: the member set; ``ug:{user}``: the user's groups with the seq
  each membership starts after and the read seq. Both carry the marker
  ``~`` once complete; without it they are rebuilt from MongoDB.

Nothing here is the only copy of anything: a flushed Redis costs a rebuild,
never a wrong seq (seqs come from MongoDB) or a lost membership.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from store.errors import Unavailable
from store.keys import Keys
from store.ports import GroupStore
from store.records import GroupMessage, GroupState, Membership
from store.redis_client import Batch, Lua, RedisClient, redis_guard

__all__ = ["GroupCacheRedis"]

MARK = "~"  # not a valid id: marks a set or hash as complete
MARK_B = MARK.encode()
# Every key here is a cache of MongoDB (complete only with its MARK or 'ok'):
# each expires this long after its last write and is rebuilt when next read.
CACHE_TTL_S = 7 * 86_400
CHUNK = 1000  # users per pipeline when a call touches every member
# A state's fields but ``last`` (the newest message, up to a preview's size):
# what a list of many groups reads.
NUMBERS = ("seq", "lastmid", "rdmid", "rc", "ok")
NUMBERS_B = tuple(f.encode() for f in NUMBERS)
RECALLED_KEPT = 1000  # recalled seqs a group's state keeps (older ones count as unread again)
INFO_VERSION = "iv"  # a state's count of changes of the group's name, owner or size
RD_KEPT = 1000  # read-diffused messages a group's index keeps (a sync from further
# back reads that group from MongoDB)
# A group's newest read-diffused messages kept as frames for syncs (a bigger
# frame, an older one, or one past the TTL is read from MongoDB): a sync of a
# user in many busy groups then costs Redis reads, not a MongoDB query per group.
RD_FRAMES = 100
RD_FRAME_MAX = 2048  # bytes
FRAMES_TTL_S = 86_400


class GroupCacheRedis:
    """Redis side of groups (``GroupCache``), rebuilt from ``GroupStore`` when incomplete.

    ``encode_last`` turns the newest message into the bytes kept as the
    group's ``last`` (the client frame: the gateway's, handed in).
    """

    def __init__(self, redis: RedisClient, keys: Keys, store: GroupStore,
                 encode_last: Callable[[GroupMessage], bytes]) -> None:
        self.redis = redis
        self.keys = keys
        self.store = store
        self.encode_last = encode_last
        self._state = Lua("group_state.lua")
        self._recall = Lua("group_recall.lua")
        self._read = Lua("read_seq.lua")
        self._numbers = Lua("group_numbers.lua")
        self._rd = Lua("group_rd.lua")
        self._rd_after = Lua("group_rd_after.lua")
        self._frames = Lua("group_frames.lua")
        self._edit = Lua("group_edit.lua")

    # -- members ---------------------------------------------------------------
    async def is_member(self, group: str, user: str) -> bool:
        key = self.keys.group_members(group)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.sismember(key, user)
            pipe.sismember(key, MARK)
            member, complete = await pipe.execute()
        if complete:
            return bool(member)
        return user in await self._rebuild_members(group)

    async def members(self, groups: Iterable[str]) -> dict[str, list[str]]:
        groups = list(groups)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in groups:
                pipe.smembers(self.keys.group_members(g))
            raw = await pipe.execute()
        out: dict[str, list[str]] = {}
        for g, members in zip(groups, raw, strict=True):
            names = {m.decode() for m in members}
            out[g] = sorted(names - {MARK}) if MARK in names else await self._rebuild_members(g)
        return out

    async def sizes(self, groups: Iterable[str]) -> dict[str, int]:
        groups = list(groups)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in groups:
                pipe.scard(self.keys.group_members(g))
                pipe.sismember(self.keys.group_members(g), MARK)
            raw = await pipe.execute()
        out: dict[str, int] = {}
        for i, g in enumerate(groups):
            n, complete = raw[2 * i], raw[2 * i + 1]
            out[g] = n - 1 if complete else len(await self._rebuild_members(g))
        return out

    async def _rebuild_members(self, group: str) -> list[str]:
        members = await self.store.member_ids(group)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.group_members(group), MARK, *members)
            pipe.expire(self.keys.group_members(group), CACHE_TTL_S)
            await pipe.execute()
        return members

    async def added(self, group: str, users: Sequence[str], from_seq: int,
                    complete: bool = False) -> None:
        """MongoDB took new members: mirror it (a partial key is rebuilt on read).
        ``complete``: ``users`` are all the members (a new group)."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.group_members(group), *users, *([MARK] if complete else []))
            pipe.expire(self.keys.group_members(group), CACHE_TTL_S)
            for u in users:
                pipe.hset(self.keys.user_groups(u), mapping={group: from_seq,
                                                             f"r:{group}": from_seq})
                pipe.expire(self.keys.user_groups(u), CACHE_TTL_S)
            await pipe.execute()

    async def removed(self, group: str, user: str) -> None:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.srem(self.keys.group_members(group), user)
            pipe.hdel(self.keys.user_groups(user), group, f"r:{group}")
            await pipe.execute()

    async def dissolved(self, group: str, users: Sequence[str]) -> None:
        """The group is gone: its member set is complete and empty, and it leaves
        each user's groups (conversations, connect-time loads), ``CHUNK`` users a
        round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.delete(self.keys.group_members(group))
            pipe.sadd(self.keys.group_members(group), MARK)
            pipe.expire(self.keys.group_members(group), CACHE_TTL_S)
            await pipe.execute()
            for i in range(0, len(users), CHUNK):
                pipe = self.redis.pipeline(transaction=False)
                for u in users[i:i + CHUNK]:
                    pipe.hdel(self.keys.user_groups(u), group, f"r:{group}")
                await pipe.execute()

    async def memberships(self, group: str, users: Sequence[str]
                          ) -> dict[str, Membership]:
        """Each user's membership of ``group`` (from seq, read seq), those not
        members left out; ``CHUNK`` users a round trip. A user whose groups
        hash is incomplete is read from MongoDB (one look-up for all of them)."""
        out: dict[str, Membership] = {}
        missing: list[str] = []
        fields = (group, f"r:{group}", MARK)
        for i in range(0, len(users), CHUNK):
            part = users[i:i + CHUNK]
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                for u in part:
                    pipe.hmget(self.keys.user_groups(u), fields)
                raw: list[list[bytes | None]] = await pipe.execute()
            for u, (joined, read, complete) in zip(part, raw, strict=True):
                if complete is None:
                    missing.append(u)
                elif joined is not None:
                    out[u] = Membership(int(joined), int(read or joined))
        if missing:
            out.update(await self.store.memberships(group, missing))
        return out

    # -- a user's groups ---------------------------------------------------------
    async def user_groups(self, user: str) -> dict[str, Membership]:
        """The user's groups; from MongoDB alone while Redis is down."""
        try:
            return await self._user_groups(user)
        except Unavailable:
            return await self.store.user_groups(user)

    async def _user_groups(self, user: str) -> dict[str, Membership]:
        key = self.keys.user_groups(user)
        async with redis_guard():
            got: dict[bytes, bytes] = await self.redis.hgetall(key)  # type: ignore[assignment]
        raw = {k.decode(): int(v) for k, v in got.items()}
        if MARK not in raw:
            docs = await self.store.user_groups(user)
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                self._fill_user(pipe, key, docs)
                pipe.hgetall(key)
                raw = {k.decode(): int(v) for k, v in (await pipe.execute())[-1].items()}
        return {g: Membership(v, raw.get(f"r:{g}", v)) for g, v in raw.items()
                if g != MARK and not g.startswith("r:")}

    async def user_groups_among(self, user: str, groups: Sequence[str]
                                ) -> dict[str, Membership]:
        """Those of ``groups`` the user is in: one hash read of their fields."""
        if not groups:
            return {}
        fields = [MARK, *groups, *(f"r:{g}" for g in groups)]
        async with redis_guard():
            got = await self.redis.hmget(self.keys.user_groups(user), fields)  # type: ignore[misc]
        if got[0] is None:  # not complete: all of them (rebuilt)
            mine = await self.user_groups(user)
            return {g: mine[g] for g in groups if g in mine}
        n = len(groups)
        return {g: Membership(int(v), int(got[1 + n + i] or v))
                for i, (g, v) in enumerate(zip(groups, got[1:1 + n], strict=True))
                if v is not None}

    async def groups_of(self, users: Sequence[str]) -> list[list[str]]:
        """The group ids of each user, one Redis round trip for all of them (a
        connect storm); users whose hash is incomplete are rebuilt from MongoDB
        (one indexed find for all of them) in one more round trip."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for u in users:
                pipe.hgetall(self.keys.user_groups(u))
            raw: list[dict[bytes, bytes]] = await pipe.execute()
        out: list[list[str]] = []
        missing: list[int] = []
        for i, h in enumerate(raw):
            if MARK.encode() not in h:
                missing.append(i)
            out.append([k.decode() for k in h if k != MARK.encode() and not k.startswith(b"r:")])
        if missing:
            many = await self.store.user_groups_many([users[i] for i in missing])
            async with redis_guard():
                pipe = self.redis.pipeline(transaction=False)
                for i in missing:
                    docs = many[users[i]]
                    self._fill_user(pipe, self.keys.user_groups(users[i]), docs)
                    out[i] = sorted(set(out[i]) | set(docs))
                await pipe.execute()
        return out

    @staticmethod
    def _fill_user(pipe: Any, key: str,
                   docs: dict[str, Membership]) -> None:
        """Queue a rebuild of one user's groups hash from MongoDB's memberships."""
        for g, m in docs.items():  # HSETNX: a newer read seq already here stays
            pipe.hsetnx(key, g, m.from_seq)
            pipe.hsetnx(key, f"r:{g}", m.read_seq)
        pipe.hset(key, MARK, 1)
        pipe.expire(key, CACHE_TTL_S)

    async def set_read(self, user: str, group: str, seq: int) -> int | None:
        """Move the read seq forward; None if ``user`` is not a member."""
        await self.user_groups(user)  # make sure the hash is complete
        async with redis_guard():
            value = await self._read(self.redis, [self.keys.user_groups(user)],
                                     [group, seq, CACHE_TTL_S])
        return None if value is None or value is False else int(value)

    # -- group state --------------------------------------------------------------
    async def states(self, groups: Iterable[str], *, last: bool = True
                     ) -> dict[str, GroupState]:
        """Each group's state; from MongoDB alone while Redis is down.
        ``last=False``: without the newest message (``last`` None), the
        numbers only."""
        groups = list(groups)
        try:
            return await (self._states(groups, True) if last else self._numbers_of(groups))
        except Unavailable:
            out: dict[str, GroupState] = {}
            for g in groups:
                doc = await self.store.get(g) or {}
                newest = (await self.store.last(g, int(doc.get("lastmid", 0)))
                          if last else None)
                out[g] = GroupState(int(doc.get("seq", 0)), int(doc.get("lastmid", 0)),
                                    self.encode_last(newest) if newest else None,
                                    int(doc.get("rdmid", 0)))
            return out

    async def rd_after(self, groups: Mapping[str, int], since: int, count: int
                       ) -> dict[str, list[tuple[int, int]] | None]:
        async with redis_guard():
            batch = Batch(self.redis)
            for g, from_seq in groups.items():
                batch.script(self._rd_after, keys=[self.keys.group_rd(g)],
                             args=[since, from_seq, count])
            got = await batch.execute()
        return {g: None if raw is None else [(int(float(raw[i])), int(raw[i + 1]))
                                             for i in range(0, len(raw), 2)]
                for g, raw in zip(groups, got, strict=True)}

    async def rd_frames(self, wanted: Mapping[str, Sequence[int]]
                        ) -> dict[str, list[bytes] | None]:
        """Per group, the kept frames of these seqs in their order; None for a
        group missing any of them (MongoDB must be asked)."""
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g, seqs in wanted.items():
                pipe.hmget(self.keys.group_frames(g), list(seqs))
            got = await pipe.execute()
        return {g: None if any(f is None for f in frames) else list(frames)
                for g, frames in zip(wanted, got, strict=True)}

    async def rebuild_rd(self, group: str) -> None:
        entries, floor = await self.store.rd_index(group, RD_KEPT)
        pairs = [x for mid, seq in entries for x in (mid, seq)]
        async with redis_guard():
            await self._rd(self.redis, keys=[self.keys.group_rd(group)],
                           args=[CACHE_TTL_S, RD_KEPT, floor, *pairs])

    async def info_versions(self, groups: Sequence[str]) -> dict[str, int]:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in groups:
                pipe.hget(self.keys.group_state(g), INFO_VERSION)
            got = await pipe.execute()
        return {g: int(v or 0) for g, v in zip(groups, got, strict=True)}

    async def info_changed(self, group: str) -> None:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            pipe.hincrby(self.keys.group_state(group), INFO_VERSION, 1)
            pipe.expire(self.keys.group_state(group), CACHE_TTL_S)
            await pipe.execute()

    async def _numbers_of(self, groups: list[str]) -> dict[str, GroupState]:
        """Numbers from the summary's shards (one hash read per shard, whatever
        the number of groups); a group missing there, or not known complete, is
        read from its state (rebuilt from MongoDB if need be) and merged in."""
        by_shard: dict[str, list[str]] = {}
        for g in dict.fromkeys(groups):
            by_shard.setdefault(self.keys.group_numbers(g), []).append(g)
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for key, members in by_shard.items():
                pipe.hmget(key, members)
            got = await pipe.execute()
        out: dict[str, GroupState] = {}
        missing: list[str] = []
        for members, values in zip(by_shard.values(), got, strict=True):
            for g, v in zip(members, values, strict=True):
                st = _numbers(v)
                if st is None:
                    missing.append(g)
                else:
                    out[g] = st
        if missing:
            full = await self._states(missing, False)
            await self._merge_numbers([(g, "1", st) for g, st in full.items()])
            out.update(full)
        return {g: out[g] for g in groups}

    async def _merge_numbers(self, entries: Sequence[tuple[str, str, GroupState]]) -> None:
        """Merge (group, ok, numbers) into the summary, one script call per shard."""
        by_shard: dict[str, list[Any]] = {}
        for g, ok, st in entries:
            by_shard.setdefault(self.keys.group_numbers(g), []).extend(_number_args(g, ok, st))
        async with redis_guard():
            batch = Batch(self.redis)
            for key, args in by_shard.items():
                batch.script(self._numbers, keys=[key], args=[CACHE_TTL_S, RECALLED_KEPT, *args])
            await batch.execute()

    async def _states(self, groups: list[str], last: bool) -> dict[str, GroupState]:
        async with redis_guard():
            pipe = self.redis.pipeline(transaction=False)
            for g in groups:
                if last:
                    pipe.hgetall(self.keys.group_state(g))
                else:
                    pipe.hmget(self.keys.group_state(g), NUMBERS)
            got = await pipe.execute()
        raw = got if last else [{f: v for f, v in zip(NUMBERS_B, values, strict=True)
                                 if v is not None} for values in got]
        missing = [g for g, h in zip(groups, raw, strict=True) if b"ok" not in h]
        rebuilt = dict(zip(missing, await asyncio.gather(*(self._rebuild_state(g)
                                                           for g in missing)), strict=True))
        out: dict[str, GroupState] = {}
        for g, h in zip(groups, raw, strict=True):
            h = rebuilt.get(g, h)
            out[g] = GroupState(int(h.get(b"seq", 0)), int(h.get(b"lastmid", 0)),
                                h.get(b"last") if last else None, int(h.get(b"rdmid", 0)),
                                tuple(int(x) for x in h.get(b"rc", b"").split(b",") if x))
        return out

    async def recalled(self, group: str, seq: int, mid: int, tombstone: bytes) -> None:
        """``seq`` leaves members' unread; the state's last message, if it was it,
        becomes ``tombstone``."""
        async with redis_guard():
            await self._recall(self.redis, [self.keys.group_state(group)],
                               [seq, mid, tombstone, RECALLED_KEPT])
            await self._frames(self.redis, [self.keys.group_frames(group)],
                               [FRAMES_TTL_S, RD_FRAMES, "recall", seq, tombstone])
        await self._merge_numbers([(group, "0", GroupState(0, 0, None, 0, (seq,)))])

    async def edited(self, group: str, seq: int, mid: int, frame: bytes, at_ms: int) -> None:
        """``seq``'s kept frame goes (read from MongoDB again); the state's last
        message, if it is this one, becomes ``frame`` (``group_edit.lua``)."""
        async with redis_guard():
            await self._edit(self.redis, [self.keys.group_state(group),
                                          self.keys.group_frames(group)],
                             [seq, mid, frame, at_ms])

    async def _rebuild_state(self, group: str) -> dict[bytes, bytes]:
        doc = await self.store.get(group) or {}
        last = await self.store.last(group, int(doc.get("lastmid", 0)))
        recalled = await self.store.recalled_seqs(group, RECALLED_KEPT)
        async with redis_guard():
            await self._state(self.redis, keys=[self.keys.group_state(group)], args=[
                doc.get("seq", 0), doc.get("lastmid", 0),
                self.encode_last(last) if last else "", doc.get("rdmid", 0), "1",
                CACHE_TTL_S])
            if recalled:
                await self.redis.hsetnx(self.keys.group_state(group), "rc",  # type: ignore[misc]
                                        ",".join(str(q) for q in sorted(recalled)))
            raw: dict[bytes, bytes] = await self.redis.hgetall(  # type: ignore[assignment]
                self.keys.group_state(group))
        return raw

    async def created(self, group: str) -> None:
        """A new group's state is known in full: seq 0, no message."""
        async with redis_guard():
            await self._state(self.redis, [self.keys.group_state(group)],
                              [0, 0, "", 0, "1", CACHE_TTL_S])
            await self._rd(self.redis, keys=[self.keys.group_rd(group)],
                           args=[CACHE_TTL_S, RD_KEPT, 0])  # none yet: complete
        await self._merge_numbers([(group, "1", GroupState(0, 0, None, 0))])

    async def record(self, updates: Sequence[tuple[str, int, int, bytes, int]],
                     senders: Sequence[tuple[str, str, int]] = (),
                     rd: Sequence[tuple[str, int, int, bytes]] = ()) -> None:
        """After a batch: (group, seq, lastmid, encoded newest message, rdmid) per
        group, (user, group, seq) per sender (its own messages are read), and
        (group, mid, seq, frame) per read-diffused message (the group's index
        and its kept frames)."""
        async with redis_guard():
            batch = Batch(self.redis)
            index: dict[str, list[int]] = {}
            frames: dict[str, list[int | bytes]] = {}
            for g, mid, seq, frame in rd:
                index.setdefault(g, []).extend((mid, seq))
                if len(frame) <= RD_FRAME_MAX:
                    frames.setdefault(g, []).extend((seq, frame))
            for g, pairs in index.items():
                batch.script(self._rd, keys=[self.keys.group_rd(g)],
                             args=[CACHE_TTL_S, RD_KEPT, "", *pairs])
            for g, kept in frames.items():
                batch.script(self._frames, keys=[self.keys.group_frames(g)],
                             args=[FRAMES_TTL_S, RD_FRAMES, "add", *kept])
            numbers: dict[str, list[Any]] = {}
            for g, seq, lastmid, last, rdmid in updates:
                batch.script(self._state, keys=[self.keys.group_state(g)],
                             args=[seq, lastmid, last, rdmid, "0", CACHE_TTL_S])
                numbers.setdefault(self.keys.group_numbers(g), []).extend(
                    _number_args(g, "0", GroupState(seq, lastmid, None, rdmid)))
            for key, args in numbers.items():
                batch.script(self._numbers, keys=[key], args=[CACHE_TTL_S, RECALLED_KEPT, *args])
            for user, g, seq in senders:
                batch.script(self._read, keys=[self.keys.user_groups(user)],
                             args=[g, seq, CACHE_TTL_S])
            await batch.execute()


def _number_args(group: str, ok: str, st: GroupState) -> list[Any]:
    return [group, ok, st.seq, st.lastmid, st.rdmid, ".".join(str(q) for q in st.recalled)]


def _numbers(value: bytes | None) -> GroupState | None:
    """A summary entry's numbers, if it is there and complete."""
    if value is None:
        return None
    ok, seq, lastmid, rdmid, rc = value.split(b",", 4)
    if ok != b"1":
        return None
    return GroupState(int(seq), int(lastmid), None, int(rdmid),
                      tuple(int(x) for x in rc.split(b".") if x))
