"""Group administration: membership, name, owner, leave, dissolve, the caller's
groups, member pages and who read a message. (Sending is ``gateway.groups.service``.)

Every change is in force on every node before it is answered: MongoDB (the
truth), then the Redis caches the send path reads, then a control to the
nodes holding the users' devices (``gadd`` / ``gdel``, each confirmed by the
broker). Changes of one group run one at a time under its administration
lease in MongoDB, so no two of them interleave (an owner handing the group
to a member who is leaving at that moment, members added while it is
dissolved).

``group_event`` pushes (encoded once) go through the group's broker binding,
one envelope per node holding members, plus the added or removed users' own
devices, whose nodes may not be bound to the group:

- added: the event first (the new members' devices are not bound yet, so
  they get it once, directly), then ``gadd``;
- removed / left: ``gdel`` first, then the event (the group's devices no
  longer include theirs: again once, directly);
- dissolved: the flag first (``GroupStore.allocate`` refuses the group from
  then on, in the same atomic update that would take a seq: a send started
  after the answer is never acked), then the event to the group's nodes
  (confirmed), then the members become former members (history stays
  readable) and leave every cache and every node's group map.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from core.errors import Unavailable
from core.group_reads import read_status
from core.paging import seek_page
from core.seek_cursor import BadCursor, decode_cursor, encode_cursor
from core.ttl_cache import TtlCache
from gateway import frames
from gateway.auth import check_user_id
from gateway.config import Settings
from gateway.errors import ProtocolError
from router.controls import Control, GroupAdd, GroupDel
from router.errors import BrokerUnavailable
from store.ports import GroupCache, GroupNews, GroupStore, QuotaStore

__all__ = ["ControlSender", "GroupAdmin", "GroupNotifier"]

log = logging.getLogger("gateway.groups.admin")

LEASE_MS = 30_000  # a node that dies holding it blocks the group's changes this long
LEASE_WAIT_S = 5.0  # then the caller hears `unavailable` and retries
TELL_CHUNK = 1000  # users per control when a whole group is told
# A group list reads its page's documents from MongoDB; the node keeps each while
# the group's change count in Redis (``GroupCache.info_versions``) is the one it
# was read with, this long at most (a Redis that lost the count cannot hide a
# change for longer), so listing one's groups again and again costs the store
# nothing more, and a change through any node shows at once.
DOC_CACHE_S = 30.0
DOC_CACHE_MAX = 50_000
# The sorted ids of a user in this many groups or more are kept LIST_S on the
# node (dropped by a change of its groups made here): its list asked for page
# after page, or again and again, costs a page each time.
LIST_MIN_GROUPS = 200
LIST_S = 2.0


class ControlSender(Protocol):
    """Applies a membership change to the users' devices on every node
    (``router.Router.tell``) and returns once it has taken effect."""

    async def tell(self, users: list[str], ctl: Control) -> None: ...


class GroupNotifier(ControlSender, Protocol):
    """``router.Router`` as administration uses it: controls and pushes."""

    async def publish_group_confirmed(self, group: str, frame: bytes) -> None: ...

    async def push_users(self, users: Sequence[str], frame: bytes) -> None: ...


def _info(doc: dict[str, Any]) -> dict[str, Any]:
    return {"group": doc["_id"], "name": doc["name"], "owner": doc["owner"],
            "members": int(doc.get("size", 0))}


@dataclass(frozen=True, slots=True)
class AdminLimits:
    """``IM_GROUP_MAX_MEMBERS``, ``IM_GROUP_WRITE_DIFFUSION_MAX`` and the caps
    that keep one user from putting others in unbounded numbers of groups."""

    max_members: int
    write_diffusion_max: int
    max_owned: int = 200  # IM_MAX_GROUPS_OWNED
    max_joined: int = 2000  # IM_MAX_GROUPS_JOINED
    creates_per_min: int = 10  # IM_GROUP_CREATES_PER_MIN

    @classmethod
    def from_settings(cls, s: Settings) -> AdminLimits:
        return cls(s.group_max_members, s.group_write_diffusion_max, s.max_groups_owned,
                   s.max_groups_joined, s.group_creates_per_min)


class GroupAdmin:
    """Group administration for one node; knows nothing of sockets."""

    def __init__(self, store: GroupStore, cache: GroupCache, notifier: GroupNotifier,
                 limits: AdminLimits, quotas: QuotaStore | None = None,
                 refused: Callable[[str], None] = lambda _cap: None,
                 may_not_add: Callable[[str, Sequence[str]], Awaitable[set[str]]] | None = None,
                 news: GroupNews | None = None) -> None:
        self.store = store
        self.cache = cache
        self.notifier = notifier
        self.limits = limits
        self.max_members = limits.max_members
        self.wd_max = limits.write_diffusion_max
        self.quotas = quotas
        self.refused = refused  # counts each refusal by the cap's name (a metric)
        # Those an adder may not put in a group (their privacy settings, blocks).
        self.may_not_add = may_not_add
        self.news = news  # new members hear of the group's news (GroupService syncs)
        # (user, n): the call read n groups of the user (its list reads every one
        # of its groups): charged to its HTTP budget (``Conversations.charge``).
        self.read_groups: Callable[[str, int], None] = lambda _user, _n: None
        self._docs: TtlCache[str, tuple[int, dict[str, Any]]] = TtlCache(DOC_CACHE_MAX)
        self._lists: TtlCache[str, list[str]] = TtlCache(10_000)

    # -- membership ------------------------------------------------------------
    async def create(self, owner: str, name: str, members: list[str]
                     ) -> tuple[str, list[str]]:
        """A new group owned by ``owner``: (its id, the members left out because
        they are in ``IM_MAX_GROUPS_JOINED`` groups already)."""
        users = list(dict.fromkeys([owner, *members]))
        self._check_size(len(users))
        lim = self.limits
        if self.quotas is not None and not await self.quotas.take(
                owner, "group_create", lim.creates_per_min, 60):
            self.refused("group_creates_per_min")
            raise ProtocolError("rate_limited", f"at most {lim.creates_per_min} groups created "
                                "per minute (IM_GROUP_CREATES_PER_MIN)")
        if await self.store.count_owned(owner) >= lim.max_owned:
            self.refused("max_groups_owned")
            raise ProtocolError("forbidden", f"a user owns at most {lim.max_owned} groups "
                                "(IM_MAX_GROUPS_OWNED)")
        full = await self._full(users) | await self._not_allowed(owner, users)
        if owner in full:  # counted by _full
            raise ProtocolError("forbidden", f"a user is in at most {lim.max_joined} groups "
                                "(IM_MAX_GROUPS_JOINED)")
        refused = [u for u in users if u in full]
        users = [u for u in users if u not in full]
        group = secrets.token_hex(8)
        await self.store.create(group, name, owner, users)
        await self.cache.added(group, users, 0, complete=True)
        for u in users:
            self._lists.drop(u)
        await self.cache.created(group)
        await self._announce(group, "added", users[1:], owner, direct=users, bound=False)
        await self.notifier.tell(users, GroupAdd(group))
        return group, refused

    async def add(self, caller: str, group: str, users: list[str]) -> list[str]:
        """Add ``users`` (owner only); returns those left out for being in
        ``IM_MAX_GROUPS_JOINED`` groups already."""
        async with self._lease(group):
            doc = await self._owned(caller, group)
            wanted = list(dict.fromkeys(users))
            self._check_size(int(doc.get("size", 0)) + len(wanted))
            full = await self._full(wanted) | await self._not_allowed(caller, wanted)
            refused = [u for u in wanted if u in full]
            wanted = [u for u in wanted if u not in full]
            if not wanted:
                return refused
            added, seq = await self.store.add_members(group, wanted)
            if added:
                await self.cache.added(group, added, seq)
                for u in added:
                    self._lists.drop(u)
                if self.news is not None:
                    await self.news.joined(group, added, int(time.time() * 1000))
                await self._announce(group, "added", added, caller, direct=added)
                await self.notifier.tell(added, GroupAdd(group))
            return refused

    async def _not_allowed(self, adder: str, users: Sequence[str]) -> set[str]:
        if self.may_not_add is None:
            return set()
        return await self.may_not_add(adder, [u for u in users if u != adder])

    async def _full(self, users: Sequence[str]) -> set[str]:
        """Those of ``users`` already in ``IM_MAX_GROUPS_JOINED`` groups (one
        cache round trip for all of them). Two adds at once may each pass a
        user one short of the cap: it is exceeded by at most the adds in flight."""
        cap = self.limits.max_joined
        counts = await self.cache.groups_of(list(users))
        full = {u for u, groups in zip(users, counts, strict=True) if len(groups) >= cap}
        for _ in full:
            self.refused("max_groups_joined")
        return full

    async def remove(self, caller: str, group: str, user: str) -> None:
        async with self._lease(group):
            doc = await self._owned(caller, group)
            if user == doc["owner"]:
                raise ProtocolError("bad_request", "the owner cannot be removed")
            await self._drop(group, user, "removed", caller)

    async def leave(self, user: str, group: str) -> None:
        async with self._lease(group):
            doc = await self._live(group)
            if doc["owner"] == user:
                raise ProtocolError("bad_request",
                                    "the owner must hand the group over before leaving")
            if not await self._drop(group, user, "left", user):
                raise ProtocolError("forbidden", "not a member of this group")

    async def _drop(self, group: str, user: str, event: str, by: str) -> bool:
        if not await self.store.remove_member(group, user):
            return False
        await self.cache.removed(group, user)
        self._lists.drop(user)
        await self.notifier.tell([user], GroupDel(group))
        await self._announce(group, event, [user], by, direct=[user])
        return True

    # -- name, owner, dissolve -------------------------------------------------------
    async def update(self, caller: str, group: str, *, name: str | None = None,
                     owner: str | None = None) -> None:
        """Rename and/or hand the group to another current member (owner only)."""
        async with self._lease(group):
            doc = await self._owned(caller, group)
            name = None if name == doc["name"] else name
            owner = None if owner == doc["owner"] else owner
            if owner is not None and owner not in await self.store.memberships(group, [owner]):
                raise ProtocolError("bad_request", "the new owner must be a member")
            if owner is not None and await self.store.count_owned(owner) >= self.limits.max_owned:
                self.refused("max_groups_owned")
                raise ProtocolError("forbidden", f"the new owner owns {self.limits.max_owned} "
                                    "groups already (IM_MAX_GROUPS_OWNED)")
            await self.store.set_info(group, name=name, owner=owner)
            if name is not None:
                await self._announce(group, "renamed", [], caller)
            if owner is not None:
                await self._announce(group, "owner", [owner], caller)

    async def dissolve(self, caller: str, group: str) -> None:
        """Owner only. Answered again (``ok``) to the owner's retry, which
        finishes what an interrupted dissolve left undone."""
        async with self._lease(group):
            doc = await self.store.get(group)
            if doc is None or (doc.get("dissolved") and doc["owner"] != caller):
                raise ProtocolError("not_found", "no such group")
            if doc["owner"] != caller:
                raise ProtocolError("forbidden", "only the group's owner may dissolve it")
            if not doc.get("dissolved"):
                await self.store.dissolve(group)
                await self._announce(group, "dissolved", [], caller)
            users = await self.store.retire_members(group)
            await self.cache.dissolved(group, users)
            for i in range(0, len(users), TELL_CHUNK):
                await self.notifier.tell(users[i:i + TELL_CHUNK], GroupDel(group))

    # -- reading -----------------------------------------------------------------------
    async def list_groups(self, user: str, cursor: str | None = None, limit: int = 100
                          ) -> dict[str, Any]:
        """The caller's groups in id order, ``limit`` a page (a dissolved one
        never shows); ``cursor`` is opaque. Only the page's documents are read."""
        scope = f"groups:{user}"
        after = ""
        if cursor is not None:
            try:
                after = decode_cursor(scope, cursor)
            except BadCursor:
                raise ProtocolError("bad_request", "cursor: not a cursor of this list") from None
        ids = await self._sorted_groups(user)
        start = bisect.bisect_right(ids, after)
        page, last = seek_page(ids[start:start + limit + 1], limit, lambda g: g)
        docs = await self._documents(page)
        return {"groups": [_info(docs[g]) for g in page if g in docs
                           and not docs[g].get("dissolved")],
                "cursor": encode_cursor(scope, last) if last else None}

    async def _sorted_groups(self, user: str) -> list[str]:
        now = time.monotonic()
        found, ids = self._lists.get(user, now)
        if found and ids is not None:
            return ids
        mine = await self.cache.user_groups(user)
        self.read_groups(user, len(mine))
        ids = sorted(mine)
        if len(ids) >= LIST_MIN_GROUPS:
            self._lists.set(user, ids, now + LIST_S)
        return ids

    async def _documents(self, groups: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The groups' documents: the node's copy of each whose change count is
        the same as when it was read, MongoDB's of the others."""
        try:
            versions: dict[str, int] | None = await self.cache.info_versions(groups)
        except Unavailable:
            versions = None  # no copy can be vouched for: all from MongoDB, none kept
        now = time.monotonic()
        out: dict[str, dict[str, Any]] = {}
        missing: list[str] = []
        for g in groups:
            found, kept = self._docs.get(g, now)
            if versions is not None and found and kept is not None and kept[0] == versions[g]:
                out[g] = kept[1]
            else:
                missing.append(g)
        if missing:
            got = await self.store.get_many(missing)
            if versions is not None:  # read before the documents: a later change shows
                for g, doc in got.items():
                    self._docs.set(g, (versions[g], doc), now + DOC_CACHE_S)
            out.update(got)
        return out

    async def info(self, user: str, group: str) -> dict[str, Any]:
        doc = await self._live(group)
        await self._member(user, group)
        return _info(doc)

    async def members_page(self, user: str, group: str, cursor: str | None, limit: int
                           ) -> dict[str, Any]:
        """Members in id order, ``limit`` a page; ``cursor`` is opaque."""
        scope = f"members:{group}"
        after = None
        if cursor is not None:
            try:
                after = decode_cursor(scope, cursor)
            except BadCursor:
                raise ProtocolError("bad_request", "cursor: not a cursor of this list") from None
            if check_user_id(after) is not None:
                raise ProtocolError("bad_request", "cursor: not a cursor of this list")
        await self._live(group)
        await self._member(user, group)
        users, last = seek_page(await self.store.page_members(group, after, limit + 1), limit,
                                lambda u: u)
        return {"users": users, "cursor": encode_cursor(scope, last) if last else None}

    async def reads(self, user: str, group: str, mid: int) -> dict[str, Any]:
        """Who of the members who could see message ``mid`` has read it (the
        sender left out), from the members' read seqs: O(members) now, nothing
        counted when it was sent. ``users`` only for groups of up to
        ``IM_GROUP_WRITE_DIFFUSION_MAX`` members."""
        await self._live(group)
        mine = await self._member(user, group)
        msg = await self.store.message(group, mid)
        if msg is None or msg.seq <= mine:
            raise ProtocolError("not_found", "no such message in this group")
        members = (await self.cache.members([group]))[group]
        seqs = await self.cache.memberships(group, members)
        status = read_status(msg.seq, msg.sender,
                             ((u, m.from_seq, m.read_seq) for u, m in seqs.items()))
        out: dict[str, Any] = {"read": status.read, "unread": status.unread}
        if len(members) <= self.wd_max:
            out["users"] = status.readers
        return out

    # -- checks -----------------------------------------------------------------------
    def _check_size(self, n: int) -> None:
        if n > self.max_members:
            raise ProtocolError("bad_request", f"a group has at most {self.max_members} members")

    async def _live(self, group: str) -> dict[str, Any]:
        doc = await self.store.get(group)
        if doc is None or doc.get("dissolved"):
            raise ProtocolError("not_found", "no such group")
        return doc

    async def _owned(self, caller: str, group: str) -> dict[str, Any]:
        doc = await self._live(group)
        if doc["owner"] != caller:
            raise ProtocolError("forbidden", "only the group's owner may change it")
        return doc

    async def _member(self, user: str, group: str) -> int:
        """The seq the caller's membership starts after; 403 for a non-member."""
        mine = (await self.cache.user_groups(user)).get(group)
        if mine is None:
            raise ProtocolError("forbidden", "not a member of this group")
        return mine.from_seq

    # -- the lease and the pushes ----------------------------------------------------------
    @asynccontextmanager
    async def _lease(self, group: str) -> AsyncIterator[None]:
        """The group's administration lease for the block; ``not_found`` for no
        such group, ``Unavailable`` if another change holds it past the wait."""
        token = secrets.token_hex(8)
        deadline = time.monotonic() + LEASE_WAIT_S
        delay = 0.005
        while True:
            got = await self.store.lock(group, token, int(time.time() * 1000), LEASE_MS)
            if got is None:
                raise ProtocolError("not_found", "no such group")
            if got:
                break
            if time.monotonic() > deadline:
                raise Unavailable("mongo", f"group {group} busy")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.1)
        try:
            yield
        finally:
            try:
                await self.store.unlock(group, token)
            except Unavailable as exc:  # it runs out on its own
                log.warning("group %s lease not released: %s", group, exc)

    async def _announce(self, group: str, event: str, users: Sequence[str], by: str, *,
                        direct: Sequence[str] = (), bound: bool = True) -> None:
        """``group_event`` to the group's devices (confirmed by the broker; not
        for a new group, which has none yet) and to every device of ``direct``.
        Best effort: the change stands anyway."""
        try:  # every change is announced: the nodes' copies of the group go
            await self.cache.info_changed(group)
        except Unavailable as exc:  # they go after DOC_CACHE_S
            log.warning("group %s changed, its copies not told: %s", group, exc)
        frame = frames.group_event(group, event, users, by)
        if bound:
            with contextlib.suppress(BrokerUnavailable):
                await self.notifier.publish_group_confirmed(group, frame)
        if direct:
            try:
                await self.notifier.push_users(direct, frame)
            except Unavailable as exc:
                log.warning("group_event %s of %s not pushed: %s", event, group, exc)
