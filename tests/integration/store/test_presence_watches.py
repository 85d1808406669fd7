"""``presence_watch.lua`` on the run's Redis (or Redis Cluster): the users one
user watches counted once across nodes, the cap refusing a whole call, a
node's entries forgotten once it is named dead or its lease lapsed, and a
renewal telling a node whose entries are gone."""

from __future__ import annotations

import time

from store.keys import Keys
from store.watches_redis import WatchesRedis
from tests.conftest import RUN_NS, uid


def store(redis_client) -> tuple[WatchesRedis, Keys]:
    keys = Keys(f"{RUN_NS}{uid('pw')}")
    return WatchesRedis(redis_client, keys, lease_s=60), keys


async def test_a_user_counts_once_across_nodes_and_the_cap_refuses_whole_calls(redis_client):
    s, keys = store(redis_client)
    assert await s.add("w", "n1", ["a", "b"], 3, []) == (True, 2)
    assert await s.add("w", "n2", ["a", "c", "c"], 3, []) == (True, 3)  # a, c once
    assert await s.add("w", "n2", ["d", "a"], 3, []) == (False, 3)  # nothing added
    assert not await redis_client.hexists(keys.watched("w"), "d")
    await s.remove("w", "n1", ["a"])  # n2 still holds a
    assert await s.add("w", "n1", ["d"], 3, []) == (False, 3)
    await s.remove("w", "n1", ["b"])
    assert await s.add("w", "n1", ["d"], 3, []) == (True, 3)
    assert 0 < await redis_client.ttl(keys.watched("w")) <= 60
    await s.remove("w", "n1", ["d"])
    await s.remove("w", "n2", ["a", "c"])
    assert not await redis_client.exists(keys.watched("w"), keys.watch_leases("w"))


async def test_a_dead_or_lapsed_node_stops_counting(redis_client):
    s, keys = store(redis_client)
    await s.add("w", "n1", ["a"], 3, [])
    await s.add("w", "n2", ["a", "b", "c"], 3, [])
    assert await s.add("w", "n1", ["d"], 3, []) == (False, 3)
    assert await s.count("w", []) == 3
    # n2 named dead by the caller (its heartbeat lapsed): its entries go first.
    assert await s.add("w", "n1", ["d"], 3, ["n2", "n7"]) == (True, 2)  # a (n1), d
    assert await redis_client.hget(keys.watched("w"), "a") == b"n1"
    # n3's lease ran out (it died long ago, forgotten by the heartbeats).
    await s.add("w", "n3", ["e"], 3, [])
    await redis_client.hset(keys.watch_leases("w"), "n3", int(time.time()) - 1)
    assert await s.add("w", "n1", ["f"], 3, []) == (True, 3)  # a, d, f
    await s.add("w", "n4", ["g"], 9, [])
    assert await s.count("w", ["n4"]) == 3  # count forgets the dead as add does
    assert not await redis_client.hexists(keys.watch_leases("w"), "n3")


async def test_renew_names_the_watchers_whose_entries_are_gone(redis_client):
    s, keys = store(redis_client)
    await s.add("x", "n1", ["a", "b"], 5, [])
    assert await s.renew("n1", ["x", "nobody"]) == ["nobody"]
    await redis_client.delete(keys.watched("x"), keys.watch_leases("x"))  # lost
    assert await s.renew("n1", ["x"]) == ["x"]
    await s.restore("x", "n1", ["a", "b"])
    assert await redis_client.hlen(keys.watched("x")) == 2
    assert await s.renew("n1", ["x"]) == []
