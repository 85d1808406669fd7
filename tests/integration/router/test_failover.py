"""Failures in the middle of a chat soak: a node killed with SIGKILL, RabbitMQ
restarted, Redis flushed. Real nodes, real servers; the soak counts sent,
acked and received, and every acked message must reach its receiver."""

from __future__ import annotations

import asyncio
import subprocess

from tests.conftest import RUN_NS, SECRET, uid
from tests.procs import NodeProcess, node_env
from tests.servers import wait_port
from tests.soak import Endpoint, Soak

FAST_HEARTBEAT = {"heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}


def report(name, result):
    print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in result.items() if k != "missing"))


def assert_nothing_acked_was_lost(result):
    assert result["acked"] > 0
    assert result["missing"] == [], f"acked but never received: {result['missing'][:10]}"


async def test_kill9_node_mid_soak(mongo_db):
    env = node_env(namespace=RUN_NS, auth_secret=SECRET, ws_port=0, http_port=0,
                   **FAST_HEARTBEAT)
    nodes = [await NodeProcess(env).start() for _ in range(3)]
    try:
        endpoints = [Endpoint(n.ws_port, n.http_port) for n in nodes]
        soak = Soak(endpoints, [uid("k") for _ in range(12)])

        async def kill_first():
            nodes[0].kill9()
            endpoints[0].up = False

        await soak.run(seconds=8, rate=8, event=kill_first, event_at=3)
        result = await soak.finish()
        report("kill -9", result)
        assert_nothing_acked_was_lost(result)
        assert result["reconnects"] >= 4  # the dead node's clients moved
        assert result["by_push"] > result["acked"] // 2  # live delivery kept working
        assert max(soak.reconnect_times) < 10
    finally:
        for n in nodes:
            await n.stop()


async def restart_rabbitmq():
    """Restart the broker application: every connection and queue is dropped."""
    for cmd in (["rabbitmqctl", "stop_app"], ["rabbitmqctl", "start_app"]):
        proc = await asyncio.create_subprocess_exec(*cmd, stdout=subprocess.DEVNULL,
                                                    stderr=subprocess.DEVNULL)
        assert await asyncio.wait_for(proc.wait(), 60) == 0, cmd
    await wait_port(5672, 60)


async def test_rabbitmq_restart_mid_soak(make_node, connect):
    nodes = [await make_node(**FAST_HEARTBEAT) for _ in range(3)]
    for n in nodes:
        await n.beat()
    room = uid("room")  # members on two nodes: the room binding must survive the restart
    speaker, listener = await connect(nodes[0], uid("sp")), await connect(nodes[1], uid("li"))
    await speaker.request("join", room=room)
    await listener.request("join", room=room)
    endpoints = [Endpoint(n.ws_port, n.http_port) for n in nodes]
    soak = Soak(endpoints, [uid("r") for _ in range(12)])
    recovered: list[float] = []

    async def restart():
        loop = asyncio.get_running_loop()
        await restart_rabbitmq()
        t0 = loop.time()
        for n in nodes:
            await asyncio.wait_for(n.router.broker.connected.wait(), 10)
        recovered.append(loop.time() - t0)

    await soak.run(seconds=9, rate=8, event=restart, event_at=2)
    assert recovered and recovered[0] < 10
    assert all(n.router.broker.reconnects >= 1 for n in nodes)
    # Delivery resumed by itself: a push crosses nodes after the restart.
    before = sum(n.router.stats["envelopes_in"] for n in nodes)
    a, b = soak.users[0], soak.users[1]  # on different nodes (round robin)
    assert a.at != b.at
    await soak._send(a, b.name, "after-restart")
    for _ in range(100):
        if b.received.get(a.acked["after-restart"]) == "push":
            break
        await asyncio.sleep(0.05)
    assert b.received.get(a.acked["after-restart"]) == "push"
    assert sum(n.router.stats["envelopes_in"] for n in nodes) > before
    assert (await speaker.request("room_send", room=room, body="after-restart"))["op"] == "ok"
    frame = await listener.next_push("room_msgs")
    assert [m["body"] for m in frame["msgs"]] == ["after-restart"]
    result = await soak.finish()
    report("rabbitmq restart", result)
    assert_nothing_acked_was_lost(result)


async def test_redis_flush_mid_soak(private, make_node):
    import redis.asyncio as aioredis

    private_redis = await private("redis")
    nodes = [await make_node(redis_url=private_redis.url, **FAST_HEARTBEAT) for _ in range(3)]
    for n in nodes:
        await n.beat()
    endpoints = [Endpoint(n.ws_port, n.http_port) for n in nodes]
    users = [uid("f") for _ in range(12)]
    soak = Soak(endpoints, users)
    r = aioredis.Redis.from_url(private_redis.url)

    async def flush():
        await r.flushall()

    await soak.run(seconds=8, rate=8, event=flush, event_at=3)
    # Routes were written again by the nodes (their leases vanished with the flush).
    keys = nodes[0].stores.keys
    assert all([await r.exists(keys.routes(u)) for u in users])
    result = await soak.finish()
    report("redis flush", result)
    await r.aclose()
    assert_nothing_acked_was_lost(result)
    # Pushes recover within a heartbeat or two: most messages still arrive live.
    assert result["by_push"] > result["acked"] * 0.8


async def test_sigterm_drains_the_node(mongo_db, redis_client):
    env = node_env(namespace=RUN_NS, auth_secret=SECRET, ws_port=0, http_port=0,
                   drain_timeout_s=5)
    node = await NodeProcess(env).start()
    from tests.conftest import token
    from tests.helpers import WsClient

    users = [uid("d") for _ in range(3)]
    clients = [await WsClient.open(node.ws_port, token(u)) for u in users]
    for c in clients:
        await c.request("ping")
    from store.keys import Keys

    keys = Keys(RUN_NS)
    assert all([await redis_client.hlen(keys.routes(u)) == 1 for u in users])
    node.term()
    for c in clients:
        assert (await c.next_push("reconnect"))["op"] == "reconnect"
        await asyncio.wait_for(c.ws.wait_closed(), 10)
        assert c.ws.close_code == 1001
    assert await node.wait(15) == 0
    assert all([await redis_client.hlen(keys.routes(u)) == 0 for u in users])
    assert not await redis_client.zscore(keys.nodes(), node.name)
