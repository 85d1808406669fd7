"""A slow link between a node and RabbitMQ (``testkit.proxy`` holding every chunk
0.2 s, both ways): slower pushes, but nothing acknowledged is lost, pushes
still arrive, in order, and the link is never taken for a dead one."""

from __future__ import annotations

from testkit.device import Device
from testkit.soak import Endpoint, Soak
from tests.conftest import SECRET, settle, uid
from tests.integration.router.test_failover import (
    amqp_port,
    amqp_through,
    assert_nothing_acked_was_lost,
    report,
)


async def pushed_from(dev: Device, sender: str, n: int) -> list[int]:
    """The mids of the next ``n`` message pushes from ``sender``, in the order
    they first came. A push of the device's own message, and a repeat, are
    passed over, as a device drops repeats by mid: on CI's loaded machine a
    node's heartbeat can lapse (its thread starved for seconds), and then what
    it stored is delivered again (at least once, as documented)."""
    got: list[int] = []
    while len(got) < n:
        push = await dev.next_push("msg", timeout=30)
        if push["from"] == sender and push["mid"] not in got:
            got.append(push["mid"])
    return got


async def test_slow_link_to_rabbitmq_loses_nothing(make_node, connect, proxy):
    amqp = await proxy(amqp_port())
    slow = await make_node(amqp_url=amqp_through(amqp))
    other = await make_node()
    await settle(slow, other)
    a, b = uid("a"), uid("b")
    ca, cb = await connect(slow, a), await connect(other, b)
    amqp.slow(0.2)
    # Out of the slow node and into it: every push arrives, in the order acked.
    out = [await ca.request("send", to=b, cmid=f"o{i}", body=i) for i in range(8)]
    back = [await cb.request("send", to=a, cmid=f"b{i}", body=i) for i in range(8)]
    assert [x["op"] for x in out + back] == ["ack"] * 16
    assert await pushed_from(cb, a, len(out)) == [x["mid"] for x in out]
    assert await pushed_from(ca, b, len(back)) == [x["mid"] for x in back]
    # A soak across both nodes while the link stays slow.
    soak = Soak([Endpoint.of(slow), Endpoint.of(other)], [uid("s") for _ in range(8)], SECRET,
                interval=0.25)
    await soak.run(seconds=4)
    result = await soak.finish()
    report("slow link", result)
    assert_nothing_acked_was_lost(result)
    assert result["by_push"] > 0
    # Slow, never cut: the node's first connection carried everything.
    assert amqp.accepted == 1 and amqp.refused == 0
    assert slow.app.router.broker.reconnects == 0
    assert slow.app.router.stats["envelopes_in"] > 0 and other.app.router.stats[
        "envelopes_in"] > 0
