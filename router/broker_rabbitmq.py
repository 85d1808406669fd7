"""RabbitMQ broker (aio-pika): one queue per node, direct exchange keyed by node.

``IM_AMQP_URL`` may list several nodes of one RabbitMQ cluster (comma-
separated, ``router.amqp_urls``). Start-up connects to the first that
answers, trying each in order (each attempt bounded).

Reconnect by replaying setup, not by trusting ``connect_robust``: a plain
connection is watched; when it closes, a supervisor moves to the next URL of
the list (round robin, starting after the one that failed; the failed one is
tried last), re-declares the exchanges, the node's queue, every binding it
recorded and the consumer there, then tells the router (``on_resume``) so it
can replay what may have been lost meanwhile. The first round is tried at
once; only after a whole round failed does it back off (0.2 s doubling to
2 s). The round robin, its backoff, the URL in use and the reconnect and
failover counts are ``router.amqp_link``'s (the webhook relay uses it too):
a failed attempt is one WARNING line, an unexpected kind of failure one ERROR
with its traceback. The node's queue is exclusive (a classic queue on the
RabbitMQ node the gateway is connected to, under a fresh name at each
setup): it dies with that node and is declared afresh on the next one; what
it held is recovered by the replay and by sync. A link is lost when its socket closes, or after
``(heartbeat + 1) * 3`` seconds of silence (aiormq; ``?heartbeat=`` of the
URL, 60 s by default): a node that hangs, rather than dies, is left that late.

Publishes use publisher confirms, but no caller waits on one message's
confirm: the router hands over whole batches and gathers their confirms.
Two channels, each with confirms: one for the router's traffic (node and room
envelopes, the node's queue and bindings), one for events out, so a backlog of
events never delays a chat or room acknowledgement. A publish is handed to
aiormq without waiting for its frame to reach the socket (``wait=False``):
aiormq otherwise holds the channel's lock until the writer task has written
that one frame, so a batch takes several loop turns per message, and on a loop
busy with a big room's fan-out the publishes of a batch time out behind each
other (measured: a 10,000-member room with a connect storm's presence events
got no room ``ok`` at all). Confirms still come back from the broker, in order.
A channel the broker closes while the connection stays up counts as a lost
link: the supervisor sets everything up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractExchange,
    AbstractIncomingMessage,
    AbstractQueue,
)
from aiormq import Channel as AmqpChannel
from aiormq import spec
from aiormq.exceptions import AMQPError

from router.amqp_link import AmqpNodes, Stopped
from router.amqp_urls import parse_amqp_urls
from router.base import BrokerStatus
from router.errors import BrokerUnavailable

__all__ = ["RabbitMQBroker"]

log = logging.getLogger("router.rabbitmq")


class RabbitMQBroker:
    """Carries envelopes between nodes over RabbitMQ (one node of a cluster at a time)."""

    def __init__(self, url: str, namespace: str, *, queue_max: int = 100_000,
                 connect_timeout_s: float = 5.0, setup_timeout_s: float = 10.0) -> None:
        self.url = url  # IM_AMQP_URL as given: parsed by ``start``
        # Its nodes, the one in use, the counts (router.amqp_link; 2 s: the longest backoff).
        self.link = AmqpNodes((), log, max_delay_s=2.0)
        self.namespace = namespace
        self.queue_max = queue_max
        self.connect_timeout_s = connect_timeout_s
        self.setup_timeout_s = setup_timeout_s
        self.node = ""
        self.connected = asyncio.Event()
        self.binds = 0
        self.unbinds = 0
        self.echoes = 0  # own room envelopes handed back by the exchange, dropped
        self._bindings: set[tuple[str, str]] = set()  # (exchange kind, routing key)
        self._on_envelope: Callable[[bytes], None] = lambda _: None
        self._on_resume: Callable[[float], None] = lambda _lost_at: None
        self._lost_at = 0.0
        self._conn: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._events_channel: AbstractChannel | None = None
        self._underlay: dict[str, AmqpChannel] = {}  # exchange kind -> its aiormq channel
        self._names: dict[str, str] = {}  # exchange kind -> exchange name
        self._queue: AbstractQueue | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lost = asyncio.Event()
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None
        self._setups = 0  # queues declared: the node's queue is ``ns.q.<node>.<setups>``

    @property
    def urls(self) -> tuple[str, ...]:
        """IM_AMQP_URL's nodes, in failover order (empty until ``start``)."""
        return self.link.urls

    @property
    def index(self) -> int:
        """The URL of ``urls`` connected to now; -1: none."""
        return self.link.index

    @property
    def reconnects(self) -> int:
        """Connections restored after a loss."""
        return self.link.reconnects

    @property
    def failovers(self) -> int:
        """Of which on another URL than the one lost."""
        return self.link.failovers

    @property
    def is_connected(self) -> bool:
        """Connected to a RabbitMQ node, setup done (no I/O: the watched state)."""
        return self.connected.is_set()

    def status(self) -> BrokerStatus:
        return BrokerStatus(connected=self.is_connected, node_index=self.index,
                            reconnects=self.reconnects, failovers=self.failovers)

    # -- lifecycle -----------------------------------------------------------
    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None:
        """Connect to the first URL that answers; ``AmqpUrlError`` (a
        ``ValueError``) if ``IM_AMQP_URL`` is malformed, ``BrokerUnavailable``
        if no node answered."""
        self.link.urls = tuple(parse_amqp_urls(self.url))
        self.node = node
        self._on_envelope = on_envelope
        if on_resume is not None:
            self._on_resume = on_resume
        await self.link.round(self._setup, 0, stopping=self._stopping)
        self._supervisor = asyncio.create_task(self._supervise())

    def _stopping(self) -> bool:
        return self._closing

    async def _setup(self, index: int) -> None:
        conn = await aio_pika.connect(self.urls[index], timeout=self.connect_timeout_s)
        try:
            async with asyncio.timeout(self.setup_timeout_s):
                channel, queue = await self._declare(conn)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 2)
            raise
        self._conn, self._channel, self._queue = conn, channel, queue
        conn.close_callbacks.add(self._connection_closed)
        for ch in (channel, self._events_channel):
            assert ch is not None
            ch.close_callbacks.add(self._channel_closed)
        if conn.is_closed or channel.is_closed or (
                self._events_channel is not None and self._events_channel.is_closed):
            raise ConnectionError("the connection closed during setup")
        self._lost.clear()
        self.connected.set()

    async def _declare(self, conn: AbstractConnection) -> tuple[AbstractChannel, AbstractQueue]:
        """Exchanges, the node's queue, its bindings (recorded ones too), the consumer."""
        channel = await conn.channel(publisher_confirms=True)
        events = self._events_channel = await conn.channel(publisher_confirms=True)
        ns = self.namespace
        self._exchanges = {
            "node": await channel.declare_exchange(f"{ns}.node", aio_pika.ExchangeType.DIRECT),
            "room": await channel.declare_exchange(f"{ns}.room", aio_pika.ExchangeType.DIRECT),
            # Durable: the product binds its own durable queues to it (events out).
            "events": await events.declare_exchange(f"{ns}.events",
                                                    aio_pika.ExchangeType.TOPIC, durable=True),
        }
        self._names = {kind: x.name for kind, x in self._exchanges.items()}
        router_underlay = await channel.get_underlay_channel()
        events_underlay = await events.get_underlay_channel()
        # aiormq's own channel: its ``basic_publish`` takes ``wait`` (the abstract one's not).
        assert isinstance(router_underlay, AmqpChannel)
        assert isinstance(events_underlay, AmqpChannel)
        self._underlay = {"node": router_underlay, "room": router_underlay,
                          "events": events_underlay}
        # A fresh name for each setup: the queue of the lost link may still be on
        # record (on a node that hangs, until the cluster declares it down), and
        # redeclaring that name would be refused (RESOURCE_LOCKED) until then.
        self._setups += 1
        queue = await channel.declare_queue(
            f"{ns}.q.{self.node}.{self._setups}", exclusive=True, auto_delete=True,
            arguments={"x-max-length": self.queue_max, "x-overflow": "drop-head"},
        )
        await queue.consume(self._deliver, no_ack=True)
        await queue.bind(self._exchanges["node"], routing_key=self.node)
        # Until nothing changed meanwhile: ``bind_key`` and ``unbind_key`` only
        # record while disconnected, and may run while this awaits.
        bound: set[tuple[str, str]] = set()
        while todo := (self._bindings - bound) | (bound - self._bindings):
            for kind, key in sorted(todo):
                if (kind, key) in self._bindings:
                    await queue.bind(self._exchanges[kind], routing_key=key)
                    bound.add((kind, key))
                else:
                    await queue.unbind(self._exchanges[kind], routing_key=key)
                    bound.discard((kind, key))
        return channel, queue

    def _connection_closed(self, sender: Any, *_: Any) -> None:
        if sender is not self._conn:  # one given up on (a failed setup, a dropped link)
            return
        if not self._closing and not self._lost_at:
            self._lost_at = time.time()
        self.link.lost()
        self.connected.clear()
        self._lost.set()

    def _channel_closed(self, sender: Any, *_: Any) -> None:
        """A channel closed by the broker (or by aiormq after a cancelled RPC)
        while its connection stays up: drop the link and set up afresh."""
        if self._closing or sender not in (self._channel, self._events_channel):
            return
        if self._conn is not None and not self._conn.is_closed and self.connected.is_set():
            log.warning("RabbitMQ channel closed under a live connection; setting up again")
            self._connection_closed(self._conn)

    async def _supervise(self) -> None:
        while not self._closing:
            await self._lost.wait()
            if self._closing:
                return
            lost = max(self.link.lost_index, 0)
            log.warning("RabbitMQ connection to %s lost; reconnecting (%d URL(s), the "
                        "next one first)", self.link.shown(lost), len(self.urls))
            try:
                await self.link.reconnect(self._replay, stopping=self._stopping)
            except Stopped:
                return
            log.warning("RabbitMQ connection restored on %s; setup replayed",
                        self.link.shown(self.index))
            lost_at, self._lost_at = self._lost_at, 0.0
            self._on_resume(lost_at or time.time())

    async def _replay(self, index: int) -> None:
        """One reconnect attempt: let the old connection go, set up on ``urls[index]``."""
        with contextlib.suppress(Exception):
            await self._drop_connection()
        await self._setup(index)

    async def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed:
            # Bounded: a channel left mid-RPC by a cancelled task can keep the
            # close handshake from finishing; the socket goes either way.
            await asyncio.wait_for(conn.close(), 5)

    async def close(self) -> None:
        self._closing = True
        self._lost.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            await asyncio.gather(self._supervisor, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._drop_connection()
        self.connected.clear()

    # -- traffic -------------------------------------------------------------
    async def _deliver(self, message: AbstractIncomingMessage) -> None:
        if message.app_id == self.node:  # a room envelope of our own: members got it locally
            self.echoes += 1
            return
        self._on_envelope(message.body)

    async def publish(self, node: str, envelope: bytes) -> None:
        await self._publish("node", node, envelope)

    async def publish_key(self, key: str, envelope: bytes) -> None:
        await self._publish("room", key, envelope)

    async def publish_event(self, key: str, body: bytes, event_id: str) -> None:
        await self._publish("events", key, body, persistent=True, message_id=event_id)

    async def _publish(self, kind: str, key: str, envelope: bytes, *,
                       persistent: bool = False, message_id: str | None = None) -> None:
        if not self.connected.is_set():
            raise BrokerUnavailable("not connected to RabbitMQ")
        props = (spec.Basic.Properties(app_id=self.node, delivery_mode=2,
                                       content_type="application/json",
                                       message_id=message_id) if persistent
                 else spec.Basic.Properties(app_id=self.node, delivery_mode=1,
                                            message_id=message_id))
        try:
            # Not mandatory: an event with no queue bound yet is dropped, not returned.
            await self._underlay[kind].basic_publish(
                envelope, exchange=self._names[kind], routing_key=key, properties=props,
                mandatory=False, timeout=5, wait=False)
        except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
            raise BrokerUnavailable(type(exc).__name__) from exc

    # -- key bindings (recorded, so a reconnect replays them) ---------------
    async def bind_key(self, key: str) -> None:
        self._bindings.add(("room", key))
        self.binds += 1
        if self._queue is not None and self.connected.is_set():
            with contextlib.suppress(AMQPError, OSError, RuntimeError):
                await self._queue.bind(self._exchanges["room"], routing_key=key)

    def bound_keys(self) -> set[str]:
        return {key for kind, key in self._bindings if kind == "room"}

    async def unbind_key(self, key: str) -> None:
        self._bindings.discard(("room", key))
        self.unbinds += 1
        if self._queue is not None and self.connected.is_set():
            with contextlib.suppress(AMQPError, OSError, RuntimeError):
                await self._queue.unbind(self._exchanges["room"], routing_key=key)
