"""Failures in the middle of a chat soak: a node killed with SIGKILL, the link
between the nodes and RabbitMQ cut and restored (a TCP proxy in front of the
broker, ``testkit.proxy``). Real nodes, real servers; the soak counts sent,
acked and received, and every acked message must reach its receiver."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

from testkit.poll import until
from testkit.proxy import TcpProxy
from testkit.soak import Endpoint, Soak
from tests.conftest import SECRET, base_settings, settle, uid

FAST_HEARTBEAT = {"heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}


def report(name, result):
    print(f"\n{name}: " + ", ".join(f"{k}={v}" for k, v in result.items() if k != "missing"))


def assert_nothing_acked_was_lost(result):
    assert result["acked"] > 0
    assert result["missing"] == [], f"acked but never received: {result['missing'][:10]}"


def amqp_port() -> int:
    """The port of the broker the tests use (the first of an IM_AMQP_URL list)."""
    return urlsplit(base_settings().amqp_url.split(",")[0].strip()).port or 5672


def amqp_through(proxy: TcpProxy) -> str:
    """The run's RabbitMQ URL, by way of ``proxy``."""
    u = urlsplit(base_settings().amqp_url)
    userinfo = u.netloc.rpartition("@")[0]
    return proxy.url("amqp", f"{userinfo}@" if userinfo else "", u.path or "/")


async def test_kill9_node_mid_soak(node_process):
    nodes = [await node_process(**FAST_HEARTBEAT) for _ in range(3)]
    endpoints = [Endpoint.of(n) for n in nodes]
    soak = Soak(endpoints, [uid("k") for _ in range(12)], SECRET, interval=1 / 8)

    async def kill_first():
        nodes[0].kill()
        endpoints[0].up = False

    await soak.run(seconds=8, event=kill_first, event_at=3)
    result = await soak.finish()
    report("kill -9", result)
    assert_nothing_acked_was_lost(result)
    assert result["reconnects"] >= 4  # the dead node's clients moved
    moved = [u for u in soak.users if u.home == 0]
    # Each of them lost its connection, then connected again, to a survivor.
    assert all(u.closes and u.connects[-1][0] > u.closes[0] and u.at != 0 for u in moved)
    assert result["by_push"] > result["acked"] // 2  # live delivery kept working


async def test_rabbitmq_link_cut_mid_soak(make_node, connect, proxy):
    amqp = await proxy(amqp_port())
    nodes = [await make_node(amqp_url=amqp_through(amqp), **FAST_HEARTBEAT) for _ in range(3)]
    await settle(*nodes)
    room = uid("room")  # members on two nodes: the room binding must survive the cut
    speaker, listener = await connect(nodes[0], uid("sp")), await connect(nodes[1], uid("li"))
    await speaker.request("join", room=room)
    await listener.request("join", room=room)
    soak = Soak([Endpoint.of(n) for n in nodes], [uid("r") for _ in range(12)], SECRET,
                interval=1 / 8)
    brokers = [n.app.router.broker for n in nodes]
    lost: list[bool] = []

    async def cut_then_restore():
        amqp.cut()  # every node's connection drops; reconnects are refused meanwhile
        lost.append(await until(lambda: not any(b.connected.is_set() for b in brokers)))
        await asyncio.sleep(1.0)
        amqp.restore()
        for b in brokers:
            await asyncio.wait_for(b.connected.wait(), 15)

    await soak.run(seconds=9, event=cut_then_restore, event_at=2)
    assert lost == [True]
    assert amqp.refused >= len(nodes)  # each node tried while the link was down
    assert all(b.reconnects >= 1 for b in brokers)
    # Delivery resumed by itself: a push crosses nodes after the restore.
    before = sum(n.app.router.stats["envelopes_in"] for n in nodes)
    a, b = soak.users[0], soak.users[1]  # on different nodes (round robin), b is a's peer
    assert a.at != b.at and a.peer == b.name
    ack = await soak.deliver(a, "after-restore")
    assert ack is not None
    assert await until(lambda: ack.mid in b.got)
    assert b.got[ack.mid].how == "push"
    assert sum(n.app.router.stats["envelopes_in"] for n in nodes) > before
    assert (await speaker.request("room_send", room=room, body="after-restore"))["op"] == "ok"
    frame = await listener.next_push("room_msgs")
    assert [m["body"] for m in frame["msgs"]] == ["after-restore"]
    result = await soak.finish()
    report("rabbitmq link cut", result)
    assert_nothing_acked_was_lost(result)


async def test_an_ack_never_precedes_the_hand_off_of_its_pushes(node_process, make_node,
                                                                connect, proxy):
    """A node killed right after a send's ack must not take the push with it:
    the ack waits for the broker to confirm the envelope carrying the push.
    The sender's node reaches RabbitMQ through a proxy that holds every chunk
    0.3 s, and one send's publish is still waiting for its confirm when the
    next one is acked, so the second push would sit in the node's outbox for
    a while after its ack; the node is killed with SIGKILL on that ack."""
    amqp = await proxy(amqp_port())
    sender_node = await node_process(amqp_url=amqp_through(amqp), push_confirm_ms=10_000,
                                     **FAST_HEARTBEAT)
    receiver_node = await make_node(**FAST_HEARTBEAT)
    alice, carol, bob = uid("a"), uid("c"), uid("b")
    a, c = await connect(sender_node, alice), await connect(sender_node, carol)
    b = await connect(receiver_node, bob)
    warm = await a.request("send", to=bob, cmid="warm", body="0", timeout=15)
    assert (await b.next_push("msg", timeout=15))["mid"] == warm["mid"]  # routed, bound

    amqp.slow(0.3)
    first = asyncio.create_task(a.request("send", to=bob, cmid="m1", body="1", timeout=15))
    await asyncio.sleep(0.1)  # m1's envelope is out, its confirm not back yet
    second = await c.request("send", to=bob, cmid="m2", body="2", timeout=15)
    assert second["op"] == "ack"
    sender_node.kill()
    first.cancel()
    amqp.restore()
    got = set()
    while second["mid"] not in got:
        got.add((await b.next_push("msg", timeout=10))["mid"])
