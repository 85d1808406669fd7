"""Events out across a RabbitMQ restart: with the broker stopped (gracefully, or
killed with SIGKILL) and started again in the middle of a steady stream of
1:1 sends to a user who never connects, every send is acked and no
``offline.msg`` of an acked message is lost (at least once: duplicates are
allowed, and counted).

The broker is a private single RabbitMQ node (``scripts/rabbitmq_cluster.sh``
with RMQ_CLUSTER_SIZE=1 on free ports; its own directory and Erlang
cookie), started once for this module and always torn down. Two gateways run
as real processes on it and on the run's Redis and MongoDB (whatever
IM_REDIS_URL / IM_REDIS_CLUSTER / IM_MONGO_URL name). The test's own durable
queue, bound to ``{RUN_NS}.events`` with ``offline.#`` as an offline-push
service would bind one, keeps what was published before the restart. Every
wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import httpx
import orjson
import pytest

from testkit.clusters import LocalRabbit
from testkit.device import Device, DeviceClosed
from testkit.nodes import NodeProcess
from testkit.poll import until
from testkit.probe import sample
from tests.conftest import RUN_NS, uid

# One node, on ports LocalRabbit picks free (clear of the shared broker on 5672,
# of the cluster test's and of anything else running).
SCRIPT_ENV = {"RMQ_CLUSTER_SIZE": "1", "KEEP": "0"}
GATEWAY = {"metrics_public": 1, "heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}
PACE_S = 0.04  # between two sends: ~20 a second
BEFORE = 20  # acked sends before the broker goes down
DURING = 10  # at least, acked once both gateways know it is down (more while it boots)
AFTER = 10  # acked once both gateways are connected again
LINK_S = 30  # gateways see the broker go / come back within this (measured: < 1 s)
EVENTS_S = 30  # every event in the queue within this once the broker is back
_NOTABLE = re.compile(rb"^\S+ \S+ (WARNING|ERROR|CRITICAL) ")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRabbit]:
    rabbit = LocalRabbit(tmp_path_factory.mktemp("rmq") / "broker", SCRIPT_ENV)
    try:
        rabbit.start(timeout=120)
        assert len(rabbit.urls) == 1 and rabbit.urls[0].startswith("amqp://"), rabbit.urls
        yield rabbit
    finally:
        rabbit.stop(timeout=120)


@pytest.fixture
async def event_queue(broker: LocalRabbit) -> AsyncIterator[str]:
    """A durable queue of the test's own (it must outlive the restart) bound to
    ``{RUN_NS}.events`` with ``offline.#``; deleted at the end."""
    name = f"{RUN_NS}.test.offline-push.{uid('q')}"
    conn = await aio_pika.connect(broker.urls[0], timeout=10)
    try:
        channel = await conn.channel()
        exchange = await channel.declare_exchange(f"{RUN_NS}.events",
                                                  aio_pika.ExchangeType.TOPIC, durable=True)
        queue = await channel.declare_queue(name, durable=True)
        await queue.bind(exchange, routing_key="offline.#")
    finally:
        await conn.close()
    try:
        yield name
    finally:
        # If a failed test left the broker down, `stop` removes it all anyway.
        with contextlib.suppress(Exception):
            conn = await aio_pika.connect(broker.urls[0], timeout=5)
            try:
                await (await conn.channel()).queue_delete(name)
            finally:
                await conn.close()


# -- the stream of sends ---------------------------------------------------------
@dataclass
class Stream:
    """1:1 messages to ``to``, from each sender in turn, one at a time (the next
    only once the last is acked), ``PACE_S`` apart, until ``stop``."""

    senders: list[tuple[str, Device]]
    to: str
    acked: list[tuple[str, str]] = field(default_factory=list)  # (mid, sender), in order
    failures: list[str] = field(default_factory=list)
    slowest: float = 0.0  # seconds, the longest wait for an ack
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> Stream:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        for i in itertools.count():
            if self._stop.is_set():
                return
            sender, device = self.senders[i % len(self.senders)]
            started = loop.time()
            try:
                reply = await device.request("send", timeout=5, to=self.to, cmid=f"m{i}",
                                             body={"text": f"message {i}"})
            except (TimeoutError, DeviceClosed) as exc:
                self.failures.append(f"send {i} from {sender}: {type(exc).__name__}")
                return
            self.slowest = max(self.slowest, loop.time() - started)
            if reply.get("op") != "ack":
                self.failures.append(f"send {i} from {sender}: {reply}")
                return
            self.acked.append((str(reply["mid"]), sender))
            await asyncio.sleep(PACE_S)

    async def reach(self, count: int, timeout: float = 30) -> None:
        """Until ``count`` sends in all are acked (fails at once if one was not)."""
        await until(lambda: self.failures or len(self.acked) >= count, timeout=timeout)
        assert not self.failures, self.failures
        assert len(self.acked) >= count, f"{len(self.acked)} acked, waited for {count}"

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, 10)
        assert not self.failures, self.failures


# -- reading a gateway from outside -------------------------------------------------
async def metric(client: httpx.AsyncClient, gateways: list[NodeProcess],
                 name: str) -> list[float]:
    """Sample ``name`` of each gateway's /metrics."""
    return [sample((await client.get(f"{g.http_url}/metrics")).text, name) for g in gateways]


async def events_total(client: httpx.AsyncClient, gateways: list[NodeProcess],
                       outcome: str, kind: str | None = "offline.msg") -> float:
    """``im_events_total`` of ``outcome`` for ``kind`` (None: every type) over
    the gateways (prometheus_client writes the labels sorted by name)."""
    head = f'im_events_total{{outcome="{outcome}",type='
    total = 0.0
    for g in gateways:
        for line in (await client.get(f"{g.http_url}/metrics")).text.splitlines():
            if line.startswith(head) and (kind is None or line.startswith(f'{head}"{kind}"}}')):
                total += float(line.split()[-1])
    return total


def notable_lines(gateways: list[NodeProcess]) -> str:
    """The gateways' warnings and errors, each distinct message once with its count."""
    counts: collections.Counter[str] = collections.Counter()
    for g in gateways:
        for line in g.output:
            if _NOTABLE.search(line):
                # Without the timestamp and the numbers that vary (pending counts).
                text = line.decode(errors="replace").strip().split(" ", 2)[-1]
                counts[f"{g.name}: {re.sub(r'[0-9]+', 'N', text)}"] += 1
    return "\n".join(f"  {n}x {text}" for text, n in counts.most_common())


async def read_events(broker: LocalRabbit, queue_name: str, until_seen: set[str],
                      wait_more: Callable[[], Any]) -> tuple[list[dict[str, Any]], float]:
    """Every event in the queue: polled until each mid of ``until_seen`` has one
    (or ``EVENTS_S``), then, once ``wait_more()`` is true (the gateways'
    outboxes are drained), what else the queue holds (late duplicates).
    Also when (``time.monotonic()``) each mid had one."""
    events: list[dict[str, Any]] = []
    conn = await aio_pika.connect(broker.urls[0], timeout=10)
    try:
        queue = await (await conn.channel()).get_queue(queue_name, ensure=True)

        async def drain() -> list[dict[str, Any]]:
            while (msg := await queue.get(no_ack=True, fail=False)) is not None:
                assert msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
                events.append(orjson.loads(msg.body))
            return events

        async def all_seen() -> bool:
            return until_seen <= {str(e["mid"]) for e in await drain()}

        await until(all_seen, timeout=EVENTS_S)
        seen_at = time.monotonic()
        await until(wait_more, timeout=EVENTS_S)
        await drain()
    finally:
        await conn.close()
    return events, seen_at


# -- the test -------------------------------------------------------------------------
@pytest.mark.parametrize("hard", [False, True], ids=["stop", "kill"])
async def test_no_event_of_an_acked_message_is_lost_across_a_rabbitmq_restart(
        broker, event_queue, node_process, connect, hard):
    gateways = list(await asyncio.gather(
        *(node_process(amqp_url=broker.urls[0], **GATEWAY) for _ in range(2))))
    bob = uid("bob")  # never connects: every message to him is an offline.msg
    senders = []
    for g, prefix in zip(gateways, ("alice", "carol"), strict=True):
        name = uid(prefix)
        senders.append((name, await connect(g, name)))
    how = "killed (SIGKILL)" if hard else "stopped"
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:

        async def connected(want: float) -> bool:
            return all(c == want for c in await metric(client, gateways,
                                                       "im_broker_connected"))

        stream = Stream(senders, bob).start()
        try:
            await stream.reach(BEFORE)
            await broker.script("stop-node", "1", hard=hard)
            assert await until(lambda: connected(0), timeout=LINK_S), notable_lines(gateways)
            down_at = len(stream.acked)
            await stream.reach(down_at + DURING)
            # Sends go on while the node boots, too.
            await broker.script("start-node", "1")
            assert await until(lambda: connected(1), timeout=LINK_S), notable_lines(gateways)
            up_at, up_since = len(stream.acked), time.monotonic()
            await stream.reach(up_at + AFTER)
        finally:
            await stream.stop()
        n = len(stream.acked)
        sender_of = dict(stream.acked)
        assert len(sender_of) == n  # every ack a new mid

        async def outboxes_drained() -> bool:
            return await events_total(client, gateways, "published") >= n

        events, seen_at = await read_events(broker, event_queue, set(sender_of),
                                            outboxes_drained)
        published = await events_total(client, gateways, "published")
        # Counted under the kind at the head of the outbox when a batch failed.
        retried = await events_total(client, gateways, "retried", None)
        dropped = await events_total(client, gateways, "dropped", None)

    seen = collections.Counter(str(e["mid"]) for e in events)
    dupes = len(events) - len(seen)
    print(f"\nRabbitMQ {how} and restarted: events: {len(events)} for {n} messages, "
          f"{dupes} duplicates ({up_at - down_at} sends acked while the gateways had no "
          f"broker; slowest ack {stream.slowest * 1000:.0f} ms; every event in the queue "
          f"{seen_at - up_since:.1f}s after the gateways reconnected; im_events_total "
          f"published {published:.0f}, retried {retried:.0f}, dropped {dropped:.0f})")
    if dupes:
        print("duplicated mids: " + ", ".join(f"{m} x{c}" for m, c in seen.items() if c > 1))
    logs = notable_lines(gateways)
    if logs:
        print("gateway warnings and errors:\n" + logs)

    missing = [m for m, _ in stream.acked if m not in seen]
    assert not missing, (f"{len(missing)} of {n} acked messages have no offline.msg "
                         f"(first: {missing[:10]}; acked while down: index {down_at}.."
                         f"{up_at})\n{logs}")
    assert not seen.keys() - sender_of.keys(), seen.keys() - sender_of.keys()  # none not acked
    index = {m: i for i, (m, _) in enumerate(stream.acked)}  # mid -> send number
    for e in events:
        mid = str(e["mid"])
        assert e["type"] == "offline.msg" and e["user"] == bob, e
        assert e["from"] == e["conv"] == sender_of[mid], e
        assert e["preview"] == f"message {index[mid]}", e
    last = stream.acked[-1][0]
    assert [e["unread"] for e in events if str(e["mid"]) == last] == [n] * seen[last]
    # Each gateway's outbox is drained in order: its mids first arrive in send order.
    first_seen = list(dict.fromkeys(str(e["mid"]) for e in events))
    for sender, _ in senders:
        sent = [m for m, s in stream.acked if s == sender]
        assert [m for m in first_seen if sender_of[m] == sender] == sent, sender
    # Every event was confirmed once (a duplicate is a resend whose confirm was
    # lost, not a second count), none dropped, and the outage was felt.
    assert published == n and dropped == 0, (published, dropped)
    assert retried >= 1, retried
