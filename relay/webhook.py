"""Webhook relay (``python -m gateway events --webhook URL``): takes the events
of ``{IM_NAMESPACE}.events`` (docs/protocol.md, Events out) from a durable
queue of its own and POSTs each, body unchanged, to one HTTP(S) endpoint.

Each POST carries ``X-Imgate-Event`` (the type: the routing key),
``X-Imgate-Delivery`` (stable per event: the AMQP message id, else the hex
SHA-256 of the body), ``X-Imgate-Attempt`` (1, 2, ...), ``X-Imgate-Timestamp``
(unix seconds of this attempt) and ``X-Imgate-Signature``: ``sha256=`` + hex
HMAC-SHA256(secret, f"{timestamp}." + body). A receiver recomputes it over
the raw body, compares in constant time and refuses a timestamp far from its
own clock, a replay (``verify`` does all three).

One delivery at a time, in queue order, acked after a 2xx answer only.
Connection errors, timeouts, 408, 429 and 5xx are retried with exponential
backoff and jitter (0.5 s doubling, capped by ``--max-delay``; a numeric
``Retry-After`` is honoured, capped too) up to ``--max-attempts``. A delivery
being retried blocks the ones behind it: order is kept. Once the attempts are
spent, or at once for any other answer (the receiver refused it), the event
is published to ``{queue}.dead`` with ``x-imgate-*`` headers saying why, then
acked. Delivery is at least once: one not acked when the relay stops or loses
RabbitMQ is redelivered and POSTed again, with the same ``X-Imgate-Delivery``
(receivers dedupe on it). A lost link moves to the next node of
``IM_AMQP_URL`` at once; a node that fails is followed by the next, and only
after a whole round failed is there a backoff (0.2 s doubling to 5 s): the
broker's round robin, ``router.amqp_link``, with its log lines (one WARNING
per failed attempt). SIGTERM or
SIGINT: no new delivery is taken, an attempt in flight finishes (within
``--timeout``), a pending retry is abandoned (redelivered later); exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import logging
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import httpx
from aio_pika.abc import (
    AbstractChannel,
    AbstractConnection,
    AbstractIncomingMessage,
    AbstractQueue,
)

from core.signing import sign, verify
from router.amqp_link import AmqpNodes, Stopped
from router.amqp_urls import mask_password, parse_amqp_urls

__all__ = ["MIN_SECRET", "Relay", "RelayConfig", "config_from", "delivery_id", "main", "sign",
           "verify"]

log = logging.getLogger("relay.webhook")
MIN_SECRET = 16  # bytes
FIRST_DELAY_S = 0.5
RETRIED = frozenset({408, 429})  # and 5xx, and no answer at all (status 0)


def delivery_id(message_id: str | None, body: bytes) -> str:
    return message_id or hashlib.sha256(body).hexdigest()


def backoff(attempt: int, cap_s: float, retry_after: str | None = None) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1, 2, ...)."""
    if retry_after is not None and retry_after.strip().isdigit():
        return min(float(retry_after.strip()), cap_s)
    base = min(cap_s, FIRST_DELAY_S * 2 ** min(attempt - 1, 32))
    return random.uniform(base / 2, base)


def shown(url: httpx.URL) -> str:
    """``url`` for logs: no credentials, no query (it may hold a token)."""
    return f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}"


async def _wait_any(*events: asyncio.Event, within: float | None = None) -> bool:
    """Until one of ``events`` is set (True) or ``within`` seconds passed (False)."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        done, _ = await asyncio.wait(waits, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
    return bool(done)


@dataclass(frozen=True)
class _Session:
    """One link: consuming the relay's queue on one node."""

    conn: AbstractConnection
    channel: AbstractChannel
    queue: AbstractQueue
    tag: str
    inbox: asyncio.Queue[AbstractIncomingMessage]
    lost: asyncio.Event  # set when the connection or the channel closes


@dataclass(frozen=True)
class RelayConfig:
    url: str
    secret: bytes = field(repr=False)
    amqp_urls: tuple[str, ...]
    exchange: str
    queue: str
    binds: tuple[str, ...] = ("#",)
    max_attempts: int = 10
    max_delay_s: float = 30.0
    timeout_s: float = 10.0
    prefetch: int = 64
    summary_s: float = 60.0
    # The queue (and its .dead) is bounded: past max_length events the oldest
    # is dropped, and an event older than max_age_s goes (RabbitMQ's x-max-length
    # with drop-head, x-message-ttl): a relay stopped for good cannot let
    # RabbitMQ fill its disk. python -m gateway events --delete-queue removes them.
    max_length: int = 100_000
    max_age_s: float = 7 * 86_400

    def queue_arguments(self) -> dict[str, Any]:
        return {"x-max-length": self.max_length, "x-overflow": "drop-head",
                "x-message-ttl": int(self.max_age_s * 1000)}


class Relay:
    """Consumes the relay's queue and POSTs each event (see the module's docstring)."""

    def __init__(self, cfg: RelayConfig, client: httpx.AsyncClient) -> None:
        self.cfg = cfg
        self.client = client
        self.shown_url = shown(httpx.URL(cfg.url))
        self.stop = asyncio.Event()
        self.delivered = self.retried = self.dead_lettered = 0
        self.sessions = 0  # links that got as far as consuming
        self.fatal: ConfigError | None = None  # why it stopped by itself
        self._carry = ("", 0)  # (delivery, attempts made): counted on across a redelivery

    def summary(self) -> str:
        return (f"delivered={self.delivered} retried={self.retried} "
                f"dead_lettered={self.dead_lettered}")

    async def report(self) -> None:
        """A summary line every ``summary_s`` seconds in which something happened."""
        last = self.summary()
        while True:
            await asyncio.sleep(self.cfg.summary_s)
            if (line := self.summary()) != last:
                log.info("webhook: %s", line)
                last = line

    async def run(self) -> None:
        """Until ``stop``: consume on one RabbitMQ node, on the next when it is lost."""
        nodes = AmqpNodes(self.cfg.amqp_urls, log, max_delay_s=5.0)
        while True:
            try:
                if nodes.lost_index < 0:  # the first URL first
                    session = await nodes.rounds(self._open, 0, stopping=self.stop.is_set,
                                                 pause=self._pause)
                else:  # the one after the URL lost
                    session = await nodes.reconnect(self._open, stopping=self.stop.is_set,
                                                    pause=self._pause)
            except Stopped:
                return
            url = nodes.urls[nodes.index]
            try:
                await self._serve(session)
            except Exception as exc:  # noqa: BLE001 - a link that failed midway: the next node
                log.warning("RabbitMQ at %s: %s: %s", mask_password(url), type(exc).__name__,
                            str(exc).replace(url, mask_password(url)))
            finally:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(session.conn.close(), 5)
            nodes.lost()
            if self.stop.is_set():
                return
            log.warning("RabbitMQ link to %s lost; unacked deliveries will be "
                        "redelivered; trying %s", mask_password(url),
                        nodes.shown((nodes.lost_index + 1) % len(nodes.urls)))

    async def _pause(self, seconds: float) -> bool:
        """A backoff between two rounds of nodes; True if stopped meanwhile."""
        await _wait_any(self.stop, within=seconds)
        return self.stop.is_set()

    async def _open(self, index: int) -> _Session:
        """Connect to ``amqp_urls[index]``: the queues, bindings and consumer
        set up there (the connection closed again if that failed)."""
        url = self.cfg.amqp_urls[index]
        conn = await aio_pika.connect(url, timeout=5)
        try:
            session = await self._declare(conn)
        except BaseException:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 5)
            raise
        self.sessions += 1
        log.info("webhook: consuming %s (bound to %s: %s) on %s, posting to %s",
                 self.cfg.queue, self.cfg.exchange, " ".join(self.cfg.binds),
                 mask_password(url), self.shown_url)
        return session

    async def _declare(self, conn: AbstractConnection) -> _Session:
        lost = asyncio.Event()
        conn.close_callbacks.add(lambda *_: lost.set())
        channel = await conn.channel(publisher_confirms=True)
        channel.close_callbacks.add(lambda *_: lost.set())
        await channel.set_qos(prefetch_count=self.cfg.prefetch)
        exchange = await channel.declare_exchange(self.cfg.exchange,
                                                  aio_pika.ExchangeType.TOPIC, durable=True)
        bounds = self.cfg.queue_arguments()
        try:
            queue = await channel.declare_queue(self.cfg.queue, durable=True, arguments=bounds)
            await channel.declare_queue(self.cfg.queue + ".dead", durable=True,
                                        arguments=bounds)
        except aio_pika.exceptions.ChannelPreconditionFailed:
            # Not a broker failure to retry on the next node: the relay stops.
            self.stop.set()
            self.fatal = ConfigError(
                f"the queue {self.cfg.queue} (or its .dead) exists with other bounds than "
                f"--max-length {self.cfg.max_length} --max-age {self.cfg.max_age_s:g}: pass "
                "the ones it has, or remove it (python -m gateway events --delete-queue; "
                "the events in it are lost)")
            raise self.fatal from None
        for key in self.cfg.binds:
            await queue.bind(exchange, routing_key=key)
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        tag = await queue.consume(inbox.put)
        return _Session(conn, channel, queue, tag, inbox, lost)

    async def _serve(self, s: _Session) -> None:
        """Deliveries of one link, until it is lost or the relay stops."""
        while (message := await self._next(s.inbox, s.lost)) is not None:
            await self._handle(message, s.channel, s.lost)
        if not s.lost.is_set():  # stopping: take no more, then close (unacked go back)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.queue.cancel(s.tag), 2)

    async def _next(self, inbox: asyncio.Queue[AbstractIncomingMessage],
                    lost: asyncio.Event) -> AbstractIncomingMessage | None:
        """The next delivery, or None once stopping or the link is lost."""
        get = asyncio.ensure_future(inbox.get())
        ended = asyncio.ensure_future(_wait_any(self.stop, lost))
        await asyncio.wait([get, ended], return_when=asyncio.FIRST_COMPLETED)
        ended.cancel()
        if not get.done():
            get.cancel()
            return None
        if self.stop.is_set() or lost.is_set():
            return None  # taken, but unacked: redelivered
        return get.result()

    async def _handle(self, message: AbstractIncomingMessage, channel: AbstractChannel,
                      lost: asyncio.Event) -> None:
        body, event = message.body, message.routing_key or ""
        did = delivery_id(message.message_id, body)
        attempt = self._carry[1] if self._carry[0] == did else 0
        while True:
            attempt += 1
            self._carry = (did, attempt)
            status, why, retry_after = await self._post(body, event, did, attempt)
            if 200 <= status < 300:
                await message.ack()
                self.delivered += 1
                break
            if status != 0 and status not in RETRIED and status < 500:  # refused
                await self._dead_letter(message, channel, did, attempt, status, why)
                break
            if attempt >= self.cfg.max_attempts:
                await self._dead_letter(message, channel, did, attempt, status,
                                        f"{why}; gave up after {attempt} attempts")
                break
            delay = backoff(attempt, self.cfg.max_delay_s, retry_after)
            self.retried += 1
            log.warning("webhook: %s delivery %s attempt %d/%d failed (%s); retrying in %.2fs",
                        event, did[:16], attempt, self.cfg.max_attempts, why, delay)
            if await _wait_any(self.stop, lost, within=delay):
                return  # abandoned: unacked, so redelivered (the count goes on)
        self._carry = ("", 0)

    async def _post(self, body: bytes, event: str, did: str,
                    attempt: int) -> tuple[int, str, str | None]:
        """(status, why, Retry-After): status 0 if no answer came (retried), -1
        if the request could not be made at all (dead-lettered)."""
        ts = int(time.time())
        headers = {"Content-Type": "application/json", "User-Agent": "imgate-webhook",
                   "X-Imgate-Event": event, "X-Imgate-Delivery": did,
                   "X-Imgate-Attempt": str(attempt), "X-Imgate-Timestamp": str(ts),
                   "X-Imgate-Signature": sign(self.cfg.secret, ts, body)}
        try:
            response = await self.client.post(self.cfg.url, content=body, headers=headers)
        except httpx.TransportError as exc:  # refused, reset, timed out...
            return 0, type(exc).__name__, None
        except Exception as exc:  # noqa: BLE001 - e.g. a header that cannot be sent
            return -1, f"not sent: {type(exc).__name__}", None
        return response.status_code, f"HTTP {response.status_code}", \
            response.headers.get("retry-after")

    async def _dead_letter(self, message: AbstractIncomingMessage, channel: AbstractChannel,
                           did: str, attempts: int, status: int, why: str) -> None:
        """To ``{queue}.dead`` (confirmed), then acked."""
        headers: dict[str, Any] = {**(message.headers or {}), "x-imgate-reason": why,
                                   "x-imgate-attempts": attempts, "x-imgate-status": status,
                                   "x-imgate-event": message.routing_key or "",
                                   "x-imgate-delivery": did,
                                   "x-imgate-failed-at": int(time.time() * 1000)}
        dead = aio_pika.Message(message.body, headers=headers, message_id=message.message_id,
                                content_type=message.content_type or "application/json",
                                delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
        await channel.default_exchange.publish(dead, routing_key=self.cfg.queue + ".dead",
                                               timeout=10)
        await message.ack()
        self.dead_lettered += 1
        log.error("webhook: %s delivery %s dead-lettered to %s.dead after %d attempt(s): %s",
                  message.routing_key, did[:16], self.cfg.queue, attempts, why)


class ConfigError(ValueError):
    """A setting of the relay that cannot be used (one line, for the operator)."""


def config_from(args: argparse.Namespace, env: Mapping[str, str], *, namespace: str,
                amqp_url: str) -> RelayConfig:
    """The relay's settings (``namespace`` and ``amqp_url``: the nodes' own, as
    checked by ``gateway.config``); ``ConfigError`` if one cannot be used."""
    try:
        secret = (Path(args.secret_file).read_bytes().rstrip(b"\r\n") if args.secret_file
                  else env.get("IM_WEBHOOK_SECRET", "").encode())
    except OSError as exc:
        raise ConfigError(f"--secret-file {args.secret_file}: {exc.strerror}") from None
    if not secret:
        raise ConfigError("no webhook secret: set IM_WEBHOOK_SECRET or give --secret-file PATH "
                          f"(at least {MIN_SECRET} bytes)")
    if len(secret) < MIN_SECRET:
        where = f"--secret-file {args.secret_file}" if args.secret_file else "IM_WEBHOOK_SECRET"
        raise ConfigError(f"the webhook secret ({where}) is {len(secret)} bytes: it must be "
                          f"at least {MIN_SECRET}")
    try:
        url = httpx.URL(args.webhook)
    except (httpx.InvalidURL, ValueError, TypeError):
        url = httpx.URL("invalid:")
    if url.scheme not in ("http", "https") or not url.host:
        raise ConfigError("--webhook must be an http:// or https:// URL with a host")
    queue, binds = args.queue or f"{namespace}.webhook", tuple(args.bind or ["#"])
    if args.max_attempts < 1 or not 1 <= args.prefetch <= 65_535:
        raise ConfigError("--max-attempts must be at least 1, --prefetch in 1..65535")
    if not min(args.max_delay, args.timeout, args.summary_every, args.max_age) > 0 \
            or args.max_length < 1:
        raise ConfigError("--max-delay, --timeout, --summary-every, --max-age and "
                          "--max-length must be positive")
    if not 0 < len(queue.encode()) <= 250 or not all(binds):
        raise ConfigError("--queue must be 1-250 bytes, and --bind patterns not empty")
    return RelayConfig(str(url), secret, tuple(parse_amqp_urls(amqp_url)),
                       f"{namespace}.events", queue, binds, args.max_attempts,
                       args.max_delay, args.timeout, args.prefetch, args.summary_every,
                       args.max_length, args.max_age)


def main(args: argparse.Namespace, env: Mapping[str, str], *, namespace: str,
         amqp_url: str) -> int:
    if args.delete_queue:
        return asyncio.run(_delete(args.queue or f"{namespace}.webhook", amqp_url))
    if not args.webhook:
        print("gateway: events: --webhook URL is required (or --delete-queue)", file=sys.stderr)
        return 2
    try:
        cfg = config_from(args, env, namespace=namespace, amqp_url=amqp_url)
    except ValueError as exc:
        print(f"gateway: events: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request, URL included
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)  # tracebacks: run() logs a line
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux/macOS
        return asyncio.run(_run(cfg))
    return uvloop.run(_run(cfg))


async def _delete(queue: str, amqp_url: str) -> int:
    """Remove the relay's queue and its ``.dead``; says how many events went with them."""
    try:
        conn = await aio_pika.connect(parse_amqp_urls(amqp_url)[0], timeout=10)
    except Exception:  # noqa: BLE001 - one line for the operator
        print(f"gateway: events: cannot reach RabbitMQ at {mask_password(amqp_url)}",
              file=sys.stderr)
        return 1
    async with conn:
        for name in (queue, queue + ".dead"):
            channel = await conn.channel()
            try:
                # passive: only an existing queue (a declare would create it to delete it)
                q = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                print(f"{name}: no such queue")
                continue
            held = q.declaration_result.message_count
            await q.delete(if_unused=False, if_empty=False)
            print(f"{name}: deleted, with {held} events in it")
    return 0


async def _run(cfg: RelayConfig) -> int:
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=30)
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits) as client:
        relay = Relay(cfg, client)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, relay.stop.set)
        reporter = asyncio.create_task(relay.report())
        try:
            await relay.run()
        finally:
            reporter.cancel()
            log.info("webhook: stopped: %s", relay.summary())
    if relay.fatal is not None:
        print(f"gateway: events: {relay.fatal}", file=sys.stderr)
        return 2
    return 0
