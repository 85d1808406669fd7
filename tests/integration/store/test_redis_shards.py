"""Sharded sets (the dirty counters, the trims due) on the run's Redis or Redis
Cluster: ``spop_spread`` drains a busy shard as fast as the single set did."""

from __future__ import annotations

from store.keys import COUNTER_SHARDS, Keys
from store.redis_client import spop_spread
from tests.conftest import RUN_NS, uid


async def test_a_busy_shard_is_drained_at_the_full_rate(redis_client):
    keys = Keys(f"{RUN_NS}{uid('sp')}")
    shards = [keys.dirty_counts(sh) for sh in range(COUNTER_SHARDS)]
    await redis_client.sadd(shards[5], *range(300))  # every dirty post in one shard
    got = await spop_spread(redis_client, shards, 100)
    assert len(got) == 100 and len(set(got)) == 100
    assert await redis_client.scard(shards[5]) == 200


async def test_members_spread_over_shards_come_from_all_of_them(redis_client):
    keys = Keys(f"{RUN_NS}{uid('sp')}")
    shards = [keys.dirty_counts(sh) for sh in range(COUNTER_SHARDS)]
    for sh, key in enumerate(shards):
        await redis_client.sadd(key, *(sh * 1000 + i for i in range(4)))
    got = {int(x) for x in await spop_spread(redis_client, shards, 128)}
    assert len(got) == 128
    assert {x // 1000 for x in got} == set(range(COUNTER_SHARDS))  # 2 from each
    assert sum([await redis_client.scard(k) for k in shards]) == 4 * COUNTER_SHARDS - 128
