"""Events out (``{ns}.events``, durable topic exchange): ``offline.msg`` for each
1:1 message stored for a user with no connected device, on the real RabbitMQ;
published at least once across a broker outage, never delaying a send."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aio_pika
import pytest

from testkit.events import EventQueue, bind_events
from testkit.poll import until
from tests.conftest import RUN_NS, base_settings, settle, uid
from tests.integration.router.test_failover import amqp_port, amqp_through


@pytest.fixture
async def events() -> AsyncIterator[EventQueue]:
    """The run's events as an offline-push service would bind them (``offline.#``)."""
    conn = await aio_pika.connect(base_settings().amqp_url.split(",")[0].strip(), timeout=10)
    try:
        yield EventQueue(await bind_events(await conn.channel(), RUN_NS, "offline.#"))
    finally:
        await conn.close()


async def test_one_offline_msg_per_message_to_an_offline_user_none_for_online(
        make_node, connect, events):
    a_node, b_node = await make_node(), await make_node()
    await settle(a_node, b_node)
    alice, bob, carol = uid("a"), uid("b"), uid("c")
    ca = await connect(a_node, alice)
    await connect(b_node, carol)  # online, on the other node
    sent = [await ca.request("send", to=carol, cmid="c1", body="to carol")]
    for i, body in enumerate(({"text": "x" * 150, "kind": "long"}, "second", [1, 2])):
        sent.append(await ca.request("send", to=bob, cmid=f"b{i}", body=body))
    # A resend of an acked cmid stores nothing, so no second event.
    assert (await ca.request("send", to=bob, cmid="b0", body="again"))["mid"] == sent[1]["mid"]
    got = await events.until(3)
    # The outbox is in order: carol's event, had there been one, came first.
    assert [e["user"] for e in got] == [bob, bob, bob]
    assert [e["mid"] for e in got] == [r["mid"] for r in sent[1:]]
    # ``unread`` is the total when the event was published: at least the messages
    # stored up to it, never more than were sent, and never going down.
    unread = [e["unread"] for e in got]
    assert unread == sorted(unread) and all(i + 1 <= n <= 3 for i, n in enumerate(unread))
    assert [e["preview"] for e in got] == ["x" * 100, "second", None]
    assert all(e["type"] == "offline.msg" and e["from"] == alice and e["conv"] == alice
               and isinstance(e["ts"], int) for e in got)
    assert len(await events.until(4, timeout=1.0)) == 3  # nothing more: no duplicate
    assert a_node.metrics.events.labels("offline.msg", "published")._value.get() == 3


def retried(node) -> float:
    """Failed publish attempts of the node's events worker, whatever their type."""
    return sum(sample.value for metric in node.metrics.events.collect()
               for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels.get("outcome") == "retried")


async def test_events_survive_a_broker_outage_and_never_hold_a_send(make_node, connect,
                                                                    proxy, events):
    amqp = await proxy(amqp_port())
    node = await make_node(amqp_url=amqp_through(amqp), heartbeat_s=0.5, heartbeat_ttl_s=2)
    alice, bob = uid("a"), uid("b")
    ca = await connect(node, alice)
    first = await ca.request("send", to=bob, cmid="m0", body="before")
    assert (await events.until(1))[0]["mid"] == first["mid"]
    amqp.cut()
    broker = node.app.router.broker
    assert await until(lambda: not broker.status().connected, timeout=10)
    during = [await ca.request("send", to=bob, cmid=f"m{i}", body=f"during {i}")
              for i in range(1, 6)]
    assert all(r["op"] == "ack" for r in during)  # sends never wait for the events
    assert node.app.events.pending >= 1
    # The worker tried and held them. Its first failed publish is counted under
    # the type of the batch's first event, which may be another user's presence
    # event (this node announces the users of nodes earlier tests left behind).
    assert await until(lambda: retried(node) >= 1, timeout=15)
    amqp.restore()
    got = await events.until(6, timeout=30)
    mids = {e["mid"] for e in got}
    assert mids == {first["mid"], *(r["mid"] for r in during)}  # at least once, none lost
    dupes = len(got) - len(mids)
    print(f"\nbroker outage: {len(during)} events held, {dupes} duplicates")
