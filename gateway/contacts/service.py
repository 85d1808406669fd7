"""Who may reach whom: contacts, privacy settings and blocks, checked on the
hot path from what this node remembers (``TtlCache``, a few seconds), so an
established conversation costs no store read per frame.

- ``contacts(U)``: whom U follows, and whom U has sent a 1:1 message to.
- Privacy: ``dm`` (``everyone`` | ``contacts``): who may send U a 1:1 message;
  ``presence`` (``everyone`` | ``contacts`` | ``nobody``): who sees U online;
  ``group_add`` (``everyone`` | ``contacts``): who may put U in a group.
  A user's own changes over the node's defaults (``IM_PRIVACY_*``).
- Blocks: when B blocked A, A's sends to B are ``forbidden``, A's typing and
  receipts never reach B, B's presence is hidden from A, A cannot add B to a
  group.
- New conversations: a user starts at most ``IM_MAX_NEW_CONVS_PER_DAY`` 1:1
  conversations a day with users who never wrote to it (a Redis quota
  shared by the nodes).

A change (settings, a block, a follow) is told to every node
(``RelationChange``), each of which forgets what it held of those users
before answering anything published after it; what a node read expires
after ``CACHE_S`` anyway. A first message (which makes a contact) is not
told: it only allows more, and another node that remembered the pair as no
contacts (a check of it failed there in the last ``CACHE_S``) refuses until
then.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace

from core.ratelimit import KeyedBuckets
from core.ttl_cache import TtlCache
from gateway.errors import ProtocolError
from store.ports import QuotaStore, RelationStore

__all__ = ["CACHE_S", "Privacy", "Relations", "RelationLimits"]

CACHE_S = 10.0  # how long a node trusts what it read of settings, blocks, contacts
SENT_CACHE_S = 3600.0  # a pair noted as "has sent to" (never undone) is not written again
CHOICES: dict[str, tuple[str, ...]] = {"dm": ("everyone", "contacts"),
                                       "presence": ("everyone", "contacts", "nobody"),
                                       "group_add": ("everyone", "contacts")}


@dataclass(frozen=True, slots=True)
class Privacy:
    dm: str = "everyone"
    presence: str = "contacts"
    group_add: str = "everyone"


@dataclass(frozen=True, slots=True)
class RelationLimits:
    defaults: Privacy = Privacy()
    new_convs_per_day: int = 500
    # Users a user may have looked up (privacy, blocks, contacts: MongoDB reads
    # when the node does not remember them) for typing, receipts and presence,
    # per second per node and saved up at most; 0: no limit.
    lookup_rate: float = 20.0
    lookup_burst: int = 1000


def check_changes(changes: Mapping[str, str]) -> None:
    for name, value in changes.items():
        if name not in CHOICES:
            raise ProtocolError("bad_request", f"no privacy setting {name!r}")
        if value not in CHOICES[name]:
            raise ProtocolError("bad_request", f"{name}: one of {', '.join(CHOICES[name])}")


class Relations:
    def __init__(self, store: RelationStore, quotas: QuotaStore, limits: RelationLimits,
                 refused: Callable[[str], None] = lambda _cap: None,
                 clock: Callable[[], float] = time.monotonic,
                 tell_all: Callable[[list[str]], Awaitable[None]] | None = None) -> None:
        self.store = store
        # Tells every node (this one included) that these users' relations
        # changed (``RelationChange``): each forgets what it remembers of them.
        self.tell_all = tell_all
        self._changed: TtlCache[str, float] = TtlCache()  # user -> when it changed
        self.quotas = quotas
        self.limits = limits
        self.refused = refused
        self.clock = clock
        self._privacy: TtlCache[str, tuple[Privacy, float]] = TtlCache()
        self._blocks: TtlCache[tuple[str, str], tuple[bool, float]] = TtlCache()
        self._contacts: TtlCache[tuple[str, str], tuple[bool, float]] = TtlCache()
        self._sent: TtlCache[tuple[str, str], bool] = TtlCache()
        self._lookups = KeyedBuckets(limits.lookup_rate, limits.lookup_burst)

    # -- settings ------------------------------------------------------------------
    async def privacy(self, users: Sequence[str]) -> dict[str, Privacy]:
        now = self.clock()
        out: dict[str, Privacy] = {}
        missing: list[str] = []
        for u in dict.fromkeys(users):
            found, item = self._privacy.get(u, now)
            if found and item is not None and self._fresh((u,), item[1], now):
                out[u] = item[0]
            else:
                missing.append(u)
        if missing:
            stored = await self.store.privacy_of(missing)
            for u in missing:
                p = replace(self.limits.defaults, **_known(stored.get(u, {})))
                self._privacy.set(u, (p, now), now + CACHE_S)
                out[u] = p
        return out

    def _fresh(self, users: Sequence[str], read_at: float, now: float) -> bool:
        """Whether what was read at ``read_at`` is newer than any change told
        of these users since."""
        for u in users:
            found, at = self._changed.get(u, now)
            if found and at is not None and at >= read_at:
                return False
        return True

    def forget(self, users: Sequence[str]) -> None:
        """What this node remembers of ``users`` is stale (a ``RelationChange``)."""
        now = self.clock()
        for u in users:
            self._changed.set(u, now, now + CACHE_S)

    def apply_control(self, users: list[str], _ctl: object) -> None:
        self.forget(users)

    async def changed(self, *users: str) -> None:
        """These users' relations changed: every node forgets what it holds of them."""
        if self.tell_all is not None:
            await self.tell_all(list(users))
        else:
            self.forget(users)

    async def settings(self, user: str) -> dict[str, str]:
        """``user``'s settings as in force (its own over the node's defaults)."""
        return asdict((await self.privacy([user]))[user])

    async def set_privacy(self, user: str, changes: Mapping[str, str]) -> dict[str, str]:
        check_changes(changes)
        if changes:
            await self.store.set_privacy(user, changes)
            await self.changed(user)
            self._privacy.drop(user)
        return await self.settings(user)

    # -- blocks ---------------------------------------------------------------------
    async def block(self, a: str, b: str) -> None:
        if a == b:
            raise ProtocolError("bad_request", "a user cannot block itself")
        await self.store.block(a, b)
        await self.changed(a, b)

    async def unblock(self, a: str, b: str) -> None:
        await self.store.unblock(a, b)
        await self.changed(a, b)

    async def blocks_page(self, a: str, after: str | None, limit: int) -> list[str]:
        return await self.store.blocks_page(a, after, limit)

    async def _blocking(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return await self._cached(self._blocks, pairs, self.store.blocking)

    async def _are_contacts(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return await self._cached(self._contacts, pairs, self.store.contacts)

    async def _cached(self, cache: TtlCache[tuple[str, str], tuple[bool, float]],
                      pairs: Sequence[tuple[str, str]],
                      read: Callable[[Sequence[tuple[str, str]]],
                                     Awaitable[set[tuple[str, str]]]]) -> set[tuple[str, str]]:
        now = self.clock()
        yes: set[tuple[str, str]] = set()
        missing: list[tuple[str, str]] = []
        for pair in dict.fromkeys(pairs):
            found, item = cache.get(pair, now)
            if not found or item is None or not self._fresh(pair, item[1], now):
                missing.append(pair)
            elif item[0]:
                yes.add(pair)
        if missing:
            got = await read(missing)
            for pair in missing:
                cache.set(pair, (pair in got, now), now + CACHE_S)
            yes |= got
        return yes

    # -- checks ---------------------------------------------------------------------
    async def check_send(self, sender: str, to: str) -> None:
        """Raise ``forbidden`` if ``sender`` may not send ``to`` a 1:1 message:
        blocked, ``to`` takes messages from contacts only, or a new
        conversation past the day's quota."""
        if await self._blocking([(to, sender)]):
            self.refused("blocked")
            raise ProtocolError("forbidden", "this user does not take your messages")
        privacy = (await self.privacy([to]))[to]
        known = await self._are_contacts([(to, sender), (sender, to)])
        if privacy.dm == "contacts" and (to, sender) not in known:
            self.refused("privacy_dm")
            raise ProtocolError("forbidden", "this user takes messages from contacts only")
        if not known and not await self.quotas.take(
                sender, "new_conv", self.limits.new_convs_per_day, 86_400):
            self.refused("new_convs_per_day")
            raise ProtocolError("forbidden", f"at most {self.limits.new_convs_per_day} new "
                                "conversations a day (IM_MAX_NEW_CONVS_PER_DAY)")

    async def sent(self, sender: str, to: str) -> None:
        """``to`` is now a contact of ``sender`` (written once per pair)."""
        now = self.clock()
        if self._sent.get((sender, to), now)[0]:
            return
        await self.store.note_sent([(sender, to)])
        self._sent.set((sender, to), True, now + SENT_CACHE_S)
        # Not told to the other nodes (a first message is frequent, and it only
        # allows more): one that remembered the pair as no contacts, because a
        # check of it failed there in the last CACHE_S, may refuse until then.
        self._contacts.set((sender, to), (True, now), now + CACHE_S)

    def afford(self, user: str, targets: Sequence[str]) -> bool:
        """Whether ``user`` may have ``targets`` looked up now: each the node does
        not remember costs a token of the user's lookup budget (a stranger's
        settings are MongoDB reads); typing, receipts and presence spend it."""
        now = self.clock()
        misses = sum(1 for t in dict.fromkeys(targets) if not self._privacy.get(t, now)[0])
        if misses == 0 or self._lookups.take(user, now, misses):
            return True
        self.refused("relation_lookups")
        return False

    async def may_reach(self, sender: str, to: str) -> bool:
        """Typing and receipts: only where a 1:1 send would be allowed (quota aside)."""
        if await self._blocking([(to, sender)]):
            return False
        if (await self.privacy([to]))[to].dm == "everyone":
            return True
        return bool(await self._are_contacts([(to, sender)]))

    async def visible(self, watcher: str, users: Sequence[str]) -> set[str]:
        """Those of ``users`` whose presence ``watcher`` may see."""
        settings = await self.privacy(users)
        blocked = {a for a, _ in await self._blocking([(u, watcher) for u in users
                                                       if u != watcher])}
        need = [u for u in users if u != watcher and u not in blocked
                and settings[u].presence == "contacts"]
        known = {a for a, _ in await self._are_contacts([(u, watcher) for u in need])}
        return {u for u in users if u == watcher or (
            u not in blocked and (settings[u].presence == "everyone" or u in known))}

    async def refused_adds(self, adder: str, users: Sequence[str]) -> set[str]:
        """Those of ``users`` ``adder`` may not put in a group."""
        others = [u for u in users if u != adder]
        blocked = {a for a, _ in await self._blocking([(u, adder) for u in others])}
        settings = await self.privacy(others)
        need = [u for u in others if u not in blocked and settings[u].group_add == "contacts"]
        known = {a for a, _ in await self._are_contacts([(u, adder) for u in need])}
        out = blocked | {u for u in need if u not in known}
        for _ in out:
            self.refused("privacy_group_add")
        return out


def _known(stored: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in stored.items() if k in CHOICES and v in CHOICES[k]}

