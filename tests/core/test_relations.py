"""``gateway.contacts.service.Relations`` over a fake store, with a clock the
test moves: the checks, what the node remembers, and forgetting on a change."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from core.ttl_cache import TtlCache
from gateway.contacts.service import CACHE_S, Privacy, RelationLimits, Relations
from gateway.errors import ProtocolError
from tests.core.fakes import FakeQuotas


class FakeRelationStore:
    """``RelationStore`` in memory, counting its reads."""

    def __init__(self) -> None:
        self.settings: dict[str, dict[str, str]] = {}
        self.blocks: set[tuple[str, str]] = set()
        self.sent: set[tuple[str, str]] = set()
        self.follows: set[tuple[str, str]] = set()
        self.reads = 0

    async def privacy_of(self, users: Sequence[str]) -> dict[str, dict[str, str]]:
        self.reads += 1
        return {u: dict(self.settings[u]) for u in users if u in self.settings}

    async def set_privacy(self, user: str, changes: Mapping[str, str]) -> dict[str, str]:
        self.settings.setdefault(user, {}).update(changes)
        return dict(self.settings[user])

    async def block(self, a: str, b: str) -> None:
        self.blocks.add((a, b))

    async def unblock(self, a: str, b: str) -> None:
        self.blocks.discard((a, b))

    async def blocks_page(self, a: str, after: str | None, limit: int) -> list[str]:
        return sorted(b for x, b in self.blocks if x == a and (after is None or b > after))[:limit]

    async def blocking(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        self.reads += 1
        return {p for p in pairs if p in self.blocks}

    async def note_sent(self, pairs: Sequence[tuple[str, str]]) -> None:
        self.sent.update(pairs)

    async def contacts(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        self.reads += 1
        return {p for p in pairs if p in self.sent or p in self.follows}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def build(**limits: object) -> tuple[Relations, FakeRelationStore, Clock, list[str]]:
    store, clock = FakeRelationStore(), Clock()
    refused: list[str] = []
    rel = Relations(store, FakeQuotas(), RelationLimits(**limits),  # type: ignore[arg-type]
                    refused.append, clock)
    return rel, store, clock, refused


async def code_of(work: object) -> str:
    try:
        await work  # type: ignore[misc]
    except ProtocolError as err:
        return err.code
    return "ok"


async def test_a_block_refuses_sends_typing_presence_and_adds() -> None:
    rel, store, _, refused = build()
    await rel.block("bob", "mal")
    assert await code_of(rel.check_send("mal", "bob")) == "forbidden"
    assert await rel.may_reach("mal", "bob") is False
    assert await rel.visible("mal", ["bob"]) == set()
    assert await rel.refused_adds("mal", ["bob", "carol"]) == {"bob"}
    assert await code_of(rel.check_send("bob", "mal")) == "ok"  # one way
    await rel.unblock("bob", "mal")
    assert await code_of(rel.check_send("mal", "bob")) == "ok"
    assert refused == ["blocked", "privacy_group_add"]
    assert await code_of(rel.block("bob", "bob")) == "bad_request"


async def test_dm_contacts_only_lets_contacts_through() -> None:
    rel, store, _, _ = build()
    await rel.set_privacy("bob", {"dm": "contacts"})
    assert await code_of(rel.check_send("ann", "bob")) == "forbidden"
    assert await rel.may_reach("ann", "bob") is False
    await rel.sent("bob", "ann")  # bob wrote to ann: ann is bob's contact
    assert await code_of(rel.check_send("ann", "bob")) == "ok"
    assert await rel.may_reach("ann", "bob") is True
    assert store.sent == {("bob", "ann")}


async def test_presence_defaults_to_contacts_and_nobody_hides_it_from_them_too() -> None:
    rel, store, _, _ = build()
    assert await rel.visible("ann", ["bob", "ann"]) == {"ann"}  # one's own always
    store.follows.add(("bob", "ann"))  # bob follows ann
    await rel.changed("bob")
    assert await rel.visible("ann", ["bob"]) == {"bob"}
    await rel.set_privacy("bob", {"presence": "nobody"})
    assert await rel.visible("ann", ["bob"]) == set()
    everyone, _, _, _ = build(defaults=Privacy(presence="everyone"))
    assert await everyone.visible("ann", ["bob"]) == {"bob"}


async def test_new_conversations_are_capped_per_day() -> None:
    rel, _, _, refused = build(new_convs_per_day=2)
    for peer in ("p1", "p2"):
        await rel.check_send("ann", peer)
        await rel.sent("ann", peer)
    assert await code_of(rel.check_send("ann", "p3")) == "forbidden"
    assert await code_of(rel.check_send("ann", "p1")) == "ok"  # started already
    await rel.sent("w", "ann")  # w wrote first (through this node): not new for ann
    assert await code_of(rel.check_send("ann", "w")) == "ok"
    assert refused == ["new_convs_per_day"]


async def test_answers_are_remembered_for_a_while_and_forgotten_on_a_change() -> None:
    rel, store, clock, _ = build()
    await rel.may_reach("ann", "bob")
    reads = store.reads
    await rel.may_reach("ann", "bob")
    assert store.reads == reads  # remembered
    clock.now += CACHE_S + 1
    await rel.may_reach("ann", "bob")
    assert store.reads > reads  # expired: read again
    reads = store.reads
    store.blocks.add(("bob", "ann"))  # changed through another node ...
    assert await rel.may_reach("ann", "bob") is True  # ... not known here yet
    rel.apply_control(["bob"], None)  # ... until its RelationChange arrives
    assert await rel.may_reach("ann", "bob") is False
    assert store.reads > reads


def test_ttl_cache_expires_and_stays_bounded() -> None:
    cache: TtlCache[str, int] = TtlCache(max_items=2)
    cache.set("a", 1, until=10)
    assert cache.get("a", 5) == (True, 1)
    assert cache.get("a", 10) == (False, None)
    cache.set("a", 1, 10)
    cache.set("b", 2, 10)
    cache.set("c", 3, 10)
    assert len(cache) == 2 and cache.get("a", 0) == (False, None)


async def test_bad_settings_are_refused() -> None:
    rel, store, _, _ = build()
    for changes in ({"dm": "friends"}, {"colour": "red"}):
        with pytest.raises(ProtocolError):
            await rel.set_privacy("ann", changes)
    assert store.settings == {}
    assert await rel.settings("ann") == {"dm": "everyone", "presence": "contacts",
                                         "group_add": "everyone"}
    told: list[list[str]] = []

    async def tell_all(users: list[str]) -> None:
        told.append(users)

    rel.tell_all = tell_all
    await rel.settings("ann")  # a read tells no node anything
    await rel.set_privacy("ann", {"dm": "contacts"})
    assert told == [["ann"]]


async def test_lookups_of_users_the_node_does_not_remember_are_budgeted() -> None:
    rel, _, clock, refused = build(lookup_rate=10.0, lookup_burst=100)
    strangers = [f"s{i}" for i in range(100)]
    assert rel.afford("mallory", strangers)  # the burst: 100 lookups
    assert not rel.afford("mallory", ["s100"]) and refused == ["relation_lookups"]
    assert rel.afford("alice", ["s100"])  # another user's budget is its own
    await rel.visible("mallory", strangers[:5])  # now remembered: free
    assert rel.afford("mallory", strangers[:5])
    clock.now += 1.0  # ten more a second
    assert rel.afford("mallory", [f"t{i}" for i in range(10)])
    assert not rel.afford("mallory", ["t10"])
