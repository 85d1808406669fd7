"""SIGTERM drains a node process: clients are told to reconnect and closed with
1001, its routes are removed and its heartbeat ended (known dead at once), it
exits 0."""

from __future__ import annotations

import time

from store.keys import Keys
from tests.conftest import RUN_NS, uid


async def test_sigterm_drains_the_node(node_process, connect, redis_client):
    node = await node_process(drain_timeout_s=5)
    users = [uid("d") for _ in range(3)]
    clients = [await connect(node, u) for u in users]
    for c in clients:
        await c.request("ping")
    keys = Keys(RUN_NS)
    assert all([await redis_client.hlen(keys.routes(u)) == 1 for u in users])
    node.term()
    for c in clients:
        assert (await c.next_push("reconnect"))["op"] == "reconnect"
        assert await c.wait_closed() == 1001
    assert await node.wait(15) == 0
    assert all([await redis_client.hlen(keys.routes(u)) == 0 for u in users])
    assert (await redis_client.zscore(keys.nodes(), node.name) or 0) <= time.time()
