"""RabbitMQ broker (aio-pika): one queue per node, direct exchange keyed by node.

Reconnect by replaying setup, not by trusting ``connect_robust``: a plain
connection is watched; when it closes, a supervisor reconnects with backoff
and re-declares the exchange, the node's queue, every binding it recorded
and the consumer, then tells the router (``on_resume``) so it can replay
what may have been lost meanwhile.

Publishes use publisher confirms, but no caller waits on one message's
confirm: the router hands over whole batches and gathers their confirms.
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
from aiormq.exceptions import AMQPError

from router.errors import BrokerUnavailable

__all__ = ["RabbitMQBroker"]

log = logging.getLogger("router.rabbitmq")


class RabbitMQBroker:
    """Carries envelopes between nodes over RabbitMQ."""

    def __init__(self, url: str, namespace: str, *, queue_max: int = 100_000) -> None:
        self.url = url
        self.namespace = namespace
        self.queue_max = queue_max
        self.node = ""
        self.connected = asyncio.Event()
        self.reconnects = 0
        self.binds = 0
        self.unbinds = 0
        self.echoes = 0  # own room envelopes handed back by the exchange, dropped
        self._bindings: set[tuple[str, str]] = set()  # (exchange kind, routing key)
        self._on_envelope: Callable[[bytes], None] = lambda _: None
        self._on_resume: Callable[[float], None] = lambda _lost_at: None
        self._lost_at = 0.0
        self._conn: AbstractConnection | None = None
        self._channel: AbstractChannel | None = None
        self._queue: AbstractQueue | None = None
        self._exchanges: dict[str, AbstractExchange] = {}
        self._lost = asyncio.Event()
        self._closing = False
        self._supervisor: asyncio.Task[None] | None = None

    # -- lifecycle -----------------------------------------------------------
    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None:
        self.node = node
        self._on_envelope = on_envelope
        if on_resume is not None:
            self._on_resume = on_resume
        await self._setup()
        self._supervisor = asyncio.create_task(self._supervise())

    async def _setup(self) -> None:
        conn = await aio_pika.connect(self.url, timeout=5)
        conn.close_callbacks.add(self._connection_closed)
        channel = await conn.channel(publisher_confirms=True)
        ns = self.namespace
        self._exchanges = {
            "node": await channel.declare_exchange(f"{ns}.node", aio_pika.ExchangeType.DIRECT),
            "room": await channel.declare_exchange(f"{ns}.room", aio_pika.ExchangeType.DIRECT),
        }
        queue = await channel.declare_queue(
            f"{ns}.q.{self.node}", exclusive=True, auto_delete=True,
            arguments={"x-max-length": self.queue_max, "x-overflow": "drop-head"},
        )
        await queue.bind(self._exchanges["node"], routing_key=self.node)
        for kind, key in sorted(self._bindings):
            await queue.bind(self._exchanges[kind], routing_key=key)
        await queue.consume(self._deliver, no_ack=True)
        self._conn, self._channel, self._queue = conn, channel, queue
        self._lost.clear()
        self.connected.set()

    def _connection_closed(self, *_: Any) -> None:
        if not self._closing and not self._lost_at:
            self._lost_at = time.time()
        self.connected.clear()
        self._lost.set()

    async def _supervise(self) -> None:
        while not self._closing:
            await self._lost.wait()
            if self._closing:
                return
            log.warning("RabbitMQ connection lost; reconnecting")
            delay = 0.2
            while not self._closing:
                with contextlib.suppress(Exception):
                    await self._drop_connection()
                try:
                    await self._setup()
                except (TimeoutError, AMQPError, OSError, ConnectionError) as exc:
                    log.info("RabbitMQ not back yet (%s); retry in %.1fs",
                             type(exc).__name__, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
                    continue
                self.reconnects += 1
                log.warning("RabbitMQ connection restored; setup replayed")
                lost_at, self._lost_at = self._lost_at, 0.0
                self._on_resume(lost_at or time.time())
                break

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

    async def publish_room(self, room: str, envelope: bytes) -> None:
        await self._publish("room", room, envelope)

    async def _publish(self, kind: str, key: str, envelope: bytes) -> None:
        if not self.connected.is_set():
            raise BrokerUnavailable("not connected to RabbitMQ")
        message = aio_pika.Message(envelope, app_id=self.node,
                                   delivery_mode=aio_pika.DeliveryMode.NOT_PERSISTENT)
        try:
            await self._exchanges[kind].publish(message, routing_key=key, timeout=5)
        except (TimeoutError, AMQPError, OSError, RuntimeError) as exc:
            raise BrokerUnavailable(type(exc).__name__) from exc

    # -- room bindings (recorded, so a reconnect replays them) ---------------
    async def bind_room(self, room: str) -> None:
        self._bindings.add(("room", room))
        self.binds += 1
        if self._queue is not None and self.connected.is_set():
            with contextlib.suppress(AMQPError, OSError, RuntimeError):
                await self._queue.bind(self._exchanges["room"], routing_key=room)

    async def unbind_room(self, room: str) -> None:
        self._bindings.discard(("room", room))
        self.unbinds += 1
        if self._queue is not None and self.connected.is_set():
            with contextlib.suppress(AMQPError, OSError, RuntimeError):
                await self._queue.unbind(self._exchanges["room"], routing_key=room)
