"""Redis loses every key in the middle of a chat soak (a flush, a failover):
the nodes write their routes again and no acknowledged message is lost."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from store.keys import Keys
from testkit.soak import Endpoint, Soak
from tests.conftest import RUN_NS, SECRET, settle, uid
from tests.integration.router.test_failover import (
    FAST_HEARTBEAT,
    assert_nothing_acked_was_lost,
    report,
)


@pytest.mark.own_redis  # a plain Redis of its own, flushed: the Redis Cluster pass skips it
async def test_redis_flush_mid_soak(private, make_node):
    private_redis = await private("redis")
    nodes = [await make_node(redis_url=private_redis.url, redis_cluster=0, **FAST_HEARTBEAT)
             for _ in range(3)]
    await settle(*nodes)
    users = [uid("f") for _ in range(12)]
    soak = Soak([Endpoint.of(n) for n in nodes], users, SECRET, interval=1 / 8)
    r = aioredis.Redis.from_url(private_redis.url)
    try:
        await soak.run(seconds=8, event=r.flushall, event_at=3)
        # Routes were written again by the nodes (their leases vanished with the flush).
        keys = Keys(RUN_NS)
        assert all([await r.exists(keys.routes(u)) for u in users])
        result = await soak.finish()
    finally:
        await r.aclose()
    report("redis flush", result)
    assert_nothing_acked_was_lost(result)
    # Pushes recover within a heartbeat or two: most messages still arrive live.
    assert result["by_push"] > result["acked"] * 0.8
