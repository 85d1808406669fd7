"""Presence watches without servers: shard refcounts (a node binds a shard
once, unbinds it when its last watched user goes), the per-user pairs a node
holds, and ``PresenceSubs`` over the in-process broker and an in-memory count
shared by two nodes: the cap is per user across connections and nodes, a user
watched twice counts once, an unsubscribe or a close frees its slots, and the
broker bindings stay within the shard count whatever the number of watches."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pytest
from websockets.protocol import State

from core.watches import HeldWatches, ShardRefs
from gateway.bindings import Bindings
from gateway.errors import ProtocolError
from gateway.hub import Client, Hub
from gateway.metrics import NodeMetrics
from gateway.presence.subs import PresenceSubs
from router.broker_memory import MemoryBroker
from router.routing import PRESENCE_SHARDS, parse_key, presence_key, presence_shard
from tests.core.test_wire_and_hub import FakeTransport


def test_a_shard_is_bound_by_its_first_user_and_freed_by_its_last() -> None:
    refs = ShardRefs(lambda user: int(user[-1]) % 2)  # shard = last digit parity
    assert refs.add("a1") == 1  # first of shard 1: bind
    assert refs.add("b3") is None  # shard 1 again: already bound
    assert refs.add("c2") == 0
    assert refs.count(1) == 2 and len(refs) == 2 and set(refs) == {0, 1}
    assert refs.remove("a1") is None  # b3 still uses it
    assert refs.remove("b3") == 1 and 1 not in refs  # emptied: idle
    assert refs.remove("b3") is None  # not there: nothing
    assert refs.remove("c2") == 0 and len(refs) == 0


def test_pairs_are_held_once_per_watcher_whatever_the_connections() -> None:
    held = HeldWatches()
    assert held.missing("w", ["a", "b", "a"]) == ["a", "b"]
    held.hold("w", ["a", "b"])  # connection 1
    assert held.missing("w", ["a", "c"]) == ["c"]
    held.hold("w", ["a", "c"])  # connection 2
    assert len(held) == 3 and sorted(held.held("w")) == ["a", "b", "c"]
    assert held.release("w", ["a", "b"]) == ["b"]  # a still watched by connection 2
    assert held.release("w", ["a", "c", "zz"]) == ["a", "c"]
    assert held.watchers() == [] and len(held) == 0
    assert held.release("nobody", ["a"]) == []


class MemoryWatches:
    """``store.ports.WatchStore`` in memory, as ``presence_watch.lua`` counts."""

    lease_s = 600.0

    def __init__(self) -> None:
        self.pairs: dict[str, dict[str, set[str]]] = {}  # watcher -> user -> nodes
        self.calls = 0

    def count_now(self, watcher: str) -> int:
        return len(self.pairs.get(watcher, {}))

    async def add(self, watcher: str, node: str, users: Sequence[str], cap: int,
                  dead_nodes: Sequence[str]) -> tuple[bool, int]:
        self.calls += 1
        mine = self.pairs.setdefault(watcher, {})
        for user in list(mine):
            mine[user] -= set(dead_nodes)
            if not mine[user]:
                del mine[user]
        new = {u for u in users if u not in mine}
        if len(mine) + len(new) > cap:
            return False, len(mine)
        for u in users:
            mine.setdefault(u, set()).add(node)
        return True, len(mine)

    async def count(self, watcher: str, dead_nodes: Sequence[str]) -> int:
        return self.count_now(watcher)

    async def restore(self, watcher: str, node: str, users: Sequence[str]) -> None:
        for u in users:
            self.pairs.setdefault(watcher, {}).setdefault(u, set()).add(node)

    async def remove(self, watcher: str, node: str, users: Sequence[str]) -> int:
        self.calls += 1
        mine = self.pairs.get(watcher, {})
        for u in users:
            mine.get(u, set()).discard(node)
            if u in mine and not mine[u]:
                del mine[u]
        return len(mine)

    async def renew(self, node: str, watchers: Sequence[str]) -> list[str]:
        return [w for w in watchers if not any(node in n for n in self.pairs.get(w, {}).values())]


class Node:
    def __init__(self, name: str, store: MemoryWatches, broker: MemoryBroker, cap: int) -> None:
        self.metrics = NodeMetrics()
        self.hub = Hub(self.metrics, 1 << 20)
        self.broker = broker
        self.bindings = Bindings(broker, self.metrics, delay_s=0.0, window_ticks=6)
        self.refusals: list[str] = []
        self.subs = PresenceSubs(self.hub, self.bindings, store, name, cap,
                                 refused=self.refusals.append)

    def client(self, user: str) -> Client:
        ws = SimpleNamespace(protocol=SimpleNamespace(state=State.OPEN),
                             transport=FakeTransport())
        c = Client(user, ws)  # type: ignore[arg-type]
        self.hub.add(c)
        return c

    def close(self, c: Client) -> None:
        self.hub.remove(c)
        self.subs.disconnected(c)


async def two_nodes(cap: int) -> tuple[Node, Node, MemoryWatches]:
    store = MemoryWatches()
    b1, b2 = MemoryBroker(), MemoryBroker()
    await b1.start("n1", lambda _e: None)
    await b2.start("n2", lambda _e: None)
    return Node("n1", store, b1, cap), Node("n2", store, b2, cap), store


async def test_the_cap_is_per_user_across_connections_and_nodes() -> None:
    n1, n2, store = await two_nodes(cap=5)
    a, b = n1.client("w"), n2.client("w")
    await n1.subs.watch(a, ["u1", "u2", "u3"])
    await n2.subs.watch(b, ["u1", "u4", "u5"])  # u1 counts once
    assert store.count_now("w") == 5
    for node, c in ((n2, b), (n1, a)):
        with pytest.raises(ProtocolError) as err:
            await node.subs.watch(c, ["u6"])
        assert err.value.code == "forbidden" and "at most 5 users" in err.value.message
    assert n1.refusals == n2.refusals == ["presence_subs"]
    assert n1.subs.watchers.get("u6") is None  # nothing of a refused call stays
    await n1.subs.unwatch(a, ["u2"])  # out of the count before the answer
    await n2.subs.watch(b, ["u6"])
    await n1.subs.unwatch(a, ["u1"])  # still watched from n2: still counts
    with pytest.raises(ProtocolError):
        await n1.subs.watch(a, ["u7"])
    calls = store.calls
    with pytest.raises(ProtocolError):  # at the cap: refused before any other work
        await n2.subs.precheck(b, ["u7"])
    await n2.subs.precheck(b, ["u4"])  # watched already: no new slot asked
    assert store.calls == calls and len(n2.refusals) == 2
    n2.close(b)  # its pairs go with the next call of the user here (or the loop)
    await n2.subs.flush()
    assert store.count_now("w") == 1  # u3, from n1
    await n1.subs.watch(a, ["u7", "u8", "u9", "u10"])
    assert store.count_now("w") == 5


async def test_two_connections_of_one_user_on_a_node_count_a_user_once() -> None:
    n1, _, store = await two_nodes(cap=2)
    c1, c2 = n1.client("w"), n1.client("w")
    await n1.subs.watch(c1, ["a", "b"])
    calls = store.calls
    await n1.subs.watch(c2, ["b", "a"])  # held here already: no count written
    assert store.calls == calls and store.count_now("w") == 2
    await n1.subs.unwatch(c1, ["a", "b"])
    assert store.count_now("w") == 2  # c2 still watches both
    n1.close(c2)
    await n1.subs.flush()
    assert store.count_now("w") == 0


async def test_presence_bindings_stay_within_the_shard_count() -> None:
    n1, n2, _ = await two_nodes(cap=10_000)
    conns = [n1.client("w") for _ in range(10)]
    watched = [f"t{i}" for i in range(5000)]
    for k, c in enumerate(conns):
        await n1.subs.watch(c, watched[k * 500:(k + 1) * 500])
    keys = [k for k in n1.broker.bound_keys() if parse_key(k)[0] == "presence"]
    assert len(keys) == len(set(n1.subs.shards)) <= PRESENCE_SHARDS
    assert n1.broker.binds <= PRESENCE_SHARDS
    assert n2.broker.bound_keys() == set()  # n2 watches nobody
    # A change of a watched user reaches its watcher only; others of its shard are dropped.
    target = watched[0]
    other = next(u for u in (f"x{i}" for i in range(10_000))
                 if presence_shard(u) == presence_shard(target))
    v = n1.client("v")
    await n1.subs.watch(v, [other])
    assert n1.subs.deliver_presence(target, b'{"op":"presence"}') == 1  # conns[0]
    assert n1.subs.deliver_presence("nobody", b"{}") == 0
    assert presence_key(other) == presence_key(target)  # one key, filtered here
    # Everyone gone: each shard idle, unbound at the sweep.
    for c in [*conns, v]:
        n1.close(c)
    assert len(n1.subs.shards) == 0
    await n1.bindings.sweep(float("inf"), lambda _key: False)
    assert n1.broker.bound_keys() == set()
