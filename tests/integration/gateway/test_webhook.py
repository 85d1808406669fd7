"""The webhook relay (``python -m gateway events``, relay/webhook.py) as a
process, on the real RabbitMQ, relaying the ``offline.msg`` events of real
nodes to an HTTP receiver of the test's own: signed, in order, retried with
the attempt counted, dead-lettered when refused or given up on, redelivered
across a lost RabbitMQ link (on the next node); and refusing to start
without a usable secret or URL."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import orjson
import pytest

from testkit.events import bind_events
from testkit.poll import until
from tests.conftest import RUN_NS, base_settings, uid
from tests.integration.router.test_failover import amqp_port, amqp_through

REPO = Path(__file__).resolve().parents[3]
WEBHOOK_SECRET = "webhook-secret-for-tests-0123456789"


def amqp_url() -> str:
    return base_settings().amqp_url.split(",")[0].strip()


@dataclass
class Hit:
    status: int  # what the receiver answered
    headers: dict[str, str]  # names in lower case
    body: bytes
    at: float  # time.time() when it arrived

    @property
    def event(self) -> dict[str, Any]:
        return orjson.loads(self.body)


Answer = Callable[[int, dict[str, Any]], "int | tuple[int, str]"]


class Receiver:
    """A minimal HTTP/1.1 server (keep-alive, Content-Length bodies) on
    127.0.0.1; ``answer(attempt, event)`` chooses the status (and a
    ``Retry-After``), ``attempt`` being how many requests this
    ``X-Imgate-Delivery`` has made, this one included."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.hits: list[Hit] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def of(self, user: str) -> list[Hit]:
        """The requests carrying events for ``user``, in arrival order."""
        return [h for h in self.hits if h.event.get("user") == user]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                headers = {}
                for line in head.split("\r\n")[1:]:
                    name, sep, value = line.partition(":")
                    if sep:
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                did = headers.get("x-imgate-delivery")
                attempt = 1 + sum(h.headers.get("x-imgate-delivery") == did for h in self.hits)
                answer = self.answer(attempt, orjson.loads(body))
                status, after = answer if isinstance(answer, tuple) else (answer, "")
                self.hits.append(Hit(status, headers, body, time.time()))
                extra = f"Retry-After: {after}\r\n" if after else ""
                writer.write(f"HTTP/1.1 {status} X\r\n{extra}Content-Length: 0\r\n\r\n".encode())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the relay closed its keep-alive connection
        finally:
            self._writers.discard(writer)
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._writers):
                w.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)


class Relay:
    """``python -m gateway events`` as a process; its output (stdout and
    stderr) is kept in ``lines``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: list[str] = []
        self._reader: asyncio.Task[None] | None = None

    async def start(self, *args: str, env: dict[str, str]) -> Relay:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "events", *args, cwd=REPO, env=env,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT)
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode(errors="replace").rstrip())

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    async def ready(self, timeout: float = 20) -> None:
        """Until the relay's queue is bound and consumed (events published from
        then on reach it); fails at once if the process exited."""
        assert self.proc is not None
        ok = await until(lambda: "webhook: consuming" in self.output
                         or self.proc.returncode is not None, timeout=timeout)
        assert ok and self.proc.returncode is None, f"relay not ready:\n{self.output}"

    async def stop(self, timeout: float = 15) -> int:
        """SIGTERM, then its exit code (and all its output read)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), timeout)
        if self._reader is not None:
            await asyncio.wait_for(self._reader, timeout)
        return code

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.kill()
            await asyncio.wait_for(self.proc.wait(), 10)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


def relay_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "IM_WEBHOOK_SECRET"}
    env.update({"IM_NAMESPACE": RUN_NS, "IM_AMQP_URL": base_settings().amqp_url, **extra})
    return env


@pytest.fixture
async def receiver() -> AsyncIterator[Callable[..., Awaitable[Receiver]]]:
    made: list[Receiver] = []

    async def factory(answer: Answer) -> Receiver:
        r = Receiver(answer)
        made.append(r)
        return await r.start()

    yield factory
    for r in made:
        await r.close()


@pytest.fixture
async def relay() -> AsyncIterator[Callable[..., Awaitable[Relay]]]:
    """Relays with a queue of their own each; killed, and their queues (and
    ``.dead`` queues) deleted, after the test."""
    made: list[Relay] = []

    async def factory(url: str, *args: str, **env: str) -> Relay:
        r = Relay(f"{RUN_NS}.webhook-{uuid.uuid4().hex[:8]}")
        made.append(r)
        await r.start("--webhook", url, "--queue", r.queue, *args,
                      env=relay_env(IM_WEBHOOK_SECRET=WEBHOOK_SECRET, **env))
        await r.ready()
        return r

    yield factory
    for r in made:
        await r.kill()
    conn = await aio_pika.connect(amqp_url(), timeout=10)
    try:
        for name in (q for r in made for q in (r.queue, r.queue + ".dead")):
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                channel = await conn.channel()  # one each: an error closes a channel
                await channel.queue_delete(name)
                await channel.close()
    finally:
        await conn.close()


@pytest.fixture
async def tap() -> AsyncIterator[aio_pika.abc.AbstractQueue]:
    """A queue of the test's own on ``{RUN_NS}.events`` (``offline.#``): the
    events as published, to compare the relayed bodies with."""
    conn = await aio_pika.connect(amqp_url(), timeout=10)
    try:
        yield await bind_events(await conn.channel(), RUN_NS, "offline.#")
    finally:
        await conn.close()


async def drain(queue: aio_pika.abc.AbstractQueue, count: int,
                keep: Callable[[aio_pika.abc.AbstractIncomingMessage], bool],
                timeout: float = 15) -> list[aio_pika.abc.AbstractIncomingMessage]:
    """Messages of ``queue`` that ``keep`` accepts, until ``count`` of them or
    ``timeout``."""
    got: list[aio_pika.abc.AbstractIncomingMessage] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        msg = await queue.get(no_ack=True, fail=False)
        if msg is None:
            await asyncio.sleep(0.05)
        elif keep(msg):
            got.append(msg)
    return got


def summary(relay: Relay) -> dict[str, int]:
    found = re.findall(r"webhook: stopped: delivered=(\d+) retried=(\d+) dead_lettered=(\d+)",
                       relay.output)
    assert found, relay.output
    return dict(zip(("delivered", "retried", "dead_lettered"), map(int, found[-1]), strict=True))


async def test_events_arrive_signed_in_order_each_once_after_retries(
        make_node, connect, receiver, relay, tap):
    rx = await receiver(lambda attempt, _event: 503 if attempt <= 2 else 200)
    proc = await relay(rx.url, "--bind", "offline.#", "--max-delay", "0.05")
    node = await make_node()
    alice, bob = uid("a"), uid("b")  # bob has no device: each message makes an offline.msg
    ca = await connect(node, alice)
    mids = [(await ca.request("send", to=bob, cmid=f"m{i}", body=f"hello {i}"))["mid"]
            for i in range(4)]
    assert await until(lambda: sum(h.status == 200 for h in rx.of(bob)) == 4, timeout=20), \
        proc.output
    hits = rx.of(bob)
    # In order, each event's retries before the next event's first attempt.
    assert [h.event["mid"] for h in hits] == [m for m in mids for _ in range(3)]
    assert [h.status for h in hits] == [503, 503, 200] * 4
    deliveries = [h.headers["x-imgate-delivery"] for h in hits]
    assert len(set(deliveries)) == len(mids)  # one stable id per event, across its attempts
    assert [h.headers["x-imgate-attempt"] for h in hits] == ["1", "2", "3"] * 4
    published = await drain(tap, 4, lambda m: orjson.loads(m.body)["user"] == bob)
    ok = [h for h in hits if h.status == 200]
    assert [h.body for h in ok] == [m.body for m in published]  # bodies unchanged
    # The delivery id: the AMQP message id (set at each publish), else the body's SHA-256.
    assert [h.headers["x-imgate-delivery"] for h in ok] == [
        m.message_id or hashlib.sha256(m.body).hexdigest() for m in published]
    now = time.time()
    for h in hits:
        assert h.headers["content-type"] == "application/json"
        assert h.headers["x-imgate-event"] == "offline.msg" == h.event["type"]
        ts = h.headers["x-imgate-timestamp"]
        assert abs(int(ts) - h.at) <= 5 and abs(int(ts) - now) <= 60
        mac = hmac.new(WEBHOOK_SECRET.encode(), f"{ts}.".encode() + h.body, hashlib.sha256)
        assert hmac.compare_digest(h.headers["x-imgate-signature"], "sha256=" + mac.hexdigest())
    for did in set(deliveries):  # one retry line per failed attempt
        for n in (1, 2):
            assert f"offline.msg delivery {did[:16]} attempt {n}/10 failed (HTTP 503)" \
                in proc.output
    assert await proc.stop() == 0  # SIGTERM: a clean exit, with the counts
    counts = summary(proc)
    assert counts["delivered"] >= 4 and counts["retried"] >= 8 and counts["dead_lettered"] == 0
    assert WEBHOOK_SECRET not in proc.output


async def test_refused_and_given_up_events_are_dead_lettered_and_the_next_go_on(
        make_node, connect, receiver, relay):
    def answer(_attempt: int, event: dict[str, Any]) -> int:
        return {"refuse me": 400, "fail me": 503}.get(event.get("preview") or "", 200)

    rx = await receiver(answer)
    proc = await relay(rx.url, "--max-attempts", "3", "--max-delay", "0.05")
    node = await make_node()
    alice, bob = uid("a"), uid("b")
    ca = await connect(node, alice)
    mids = [(await ca.request("send", to=bob, cmid=f"m{i}", body=body))["mid"]
            for i, body in enumerate(("refuse me", "fail me", "fine"))]
    assert await until(lambda: any(h.status == 200 for h in rx.of(bob)), timeout=20), proc.output
    hits = rx.of(bob)
    assert [(h.event["mid"], h.status) for h in hits] == [
        (mids[0], 400), (mids[1], 503), (mids[1], 503), (mids[1], 503), (mids[2], 200)]
    conn = await aio_pika.connect(amqp_url(), timeout=10)
    try:
        channel = await conn.channel()
        dead_queue = await channel.declare_queue(proc.queue + ".dead", passive=True)
        dead = await drain(dead_queue, 2, lambda m: orjson.loads(m.body)["user"] == bob)
    finally:
        await conn.close()
    assert [m.body for m in dead] == [hits[0].body, hits[1].body]  # as published, in order
    refused, gave_up = (m.headers for m in dead)
    assert refused["x-imgate-status"] == 400 and refused["x-imgate-attempts"] == 1
    assert "HTTP 400" in str(refused["x-imgate-reason"])
    assert gave_up["x-imgate-status"] == 503 and gave_up["x-imgate-attempts"] == 3
    assert "gave up after 3 attempts" in str(gave_up["x-imgate-reason"])
    assert refused["x-imgate-event"] == "offline.msg"
    assert refused["x-imgate-delivery"] == hits[0].headers["x-imgate-delivery"]
    assert gave_up["x-imgate-delivery"] == hits[1].headers["x-imgate-delivery"]
    assert all(m.delivery_mode == aio_pika.DeliveryMode.PERSISTENT for m in dead)
    assert "dead-lettered" in proc.output
    assert await proc.stop() == 0
    assert summary(proc)["dead_lettered"] >= 2


async def test_a_lost_link_fails_over_and_the_redelivered_event_counts_on(
        make_node, connect, receiver, relay, proxy):
    def answer(attempt: int, event: dict[str, Any]) -> int | tuple[int, str]:
        if attempt == 1 and event["preview"] == "before":
            return 503, "10"  # come back in 10 s: the link is cut meanwhile
        return 503 if attempt <= 2 else 200

    rx = await receiver(answer)
    amqp = await proxy(amqp_port())
    # The first node never answers: the relay goes on to the second (the proxy).
    proc = await relay(rx.url, "--max-delay", "10", "--bind", "offline.#",
                       IM_AMQP_URL=f"amqp://127.0.0.1:1/,{amqp_through(amqp)}")
    assert "RabbitMQ at amqp://127.0.0.1:1/" in proc.output
    node = await make_node()  # straight to RabbitMQ: publishes while the relay is cut off
    alice, bob = uid("a"), uid("b")
    ca = await connect(node, alice)
    first = await ca.request("send", to=bob, cmid="m0", body="before")
    assert await until(lambda: rx.of(bob), timeout=15), proc.output
    amqp.cut()  # while the relay waits out the Retry-After: abandoned, unacked
    assert await until(lambda: "lost; unacked deliveries will be redelivered" in proc.output,
                       timeout=8), proc.output
    assert time.time() - rx.of(bob)[0].at < 8  # it did not wait the 10 s out on a dead link
    second = await ca.request("send", to=bob, cmid="m1", body="during")
    amqp.restore()
    assert await until(lambda: sum(h.status == 200 for h in rx.of(bob)) == 2, timeout=20), \
        proc.output
    hits = rx.of(bob)
    assert [h.event["mid"] for h in hits] == [first["mid"]] * 3 + [second["mid"]] * 3
    # Redelivered with the same delivery id; the attempts count on across the loss.
    assert len({h.headers["x-imgate-delivery"] for h in hits[:3]}) == 1
    assert [h.headers["x-imgate-attempt"] for h in hits] == ["1", "2", "3"] * 2
    did = hits[0].headers["x-imgate-delivery"]
    assert f"{did[:16]} attempt 1/10 failed (HTTP 503); retrying in 10.00s" in proc.output
    password = urlsplit(base_settings().amqp_url.split(",")[0]).password
    assert not password or f":{password}@" not in proc.output
    assert await proc.stop() == 0


@pytest.mark.parametrize(("secret", "args", "says"), [
    (None, (), "no webhook secret: set IM_WEBHOOK_SECRET or give --secret-file"),
    ("too-short", (), "is 9 bytes: it must be at least 16"),
    (WEBHOOK_SECRET, ("--webhook", "ftp://127.0.0.1/hook"), "must be an http:// or https:// URL"),
])
async def test_refuses_to_start_without_a_usable_secret_or_url(secret, args, says):
    env = relay_env() if secret is None else relay_env(IM_WEBHOOK_SECRET=secret)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "events", "--webhook", "http://127.0.0.1:9/hook",
        "--queue", f"{RUN_NS}.webhook-never", *args, cwd=REPO, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2
    lines = err.decode().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gateway: events: ") and says in lines[0]
    assert out == b""
    if secret is not None:
        assert secret not in err.decode()


async def _gateway_events(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "events", *args, cwd=REPO, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_the_queue_is_bounded_and_delete_queue_removes_it(relay, receiver):
    """The relay's queue and its .dead hold at most --max-length events for at
    most --max-age (RabbitMQ drops the oldest); --delete-queue removes both
    and says how many events went; a queue declared with other bounds makes
    the relay stop with one line, not retry for ever."""
    r = await relay((await receiver(lambda n, req: 200)).url, "--max-length", "3",
                    "--max-age", "60")
    assert await r.stop() == 0
    conn = await aio_pika.connect(amqp_url(), timeout=10)
    try:
        channel = await conn.channel()
        # The same arguments are accepted again; a plain declare is refused (406),
        # so the bounds are on the queue, and RabbitMQ enforces them.
        bounds: dict[str, Any] = {"x-max-length": 3, "x-overflow": "drop-head",
                                  "x-message-ttl": 60_000}
        queue = await channel.declare_queue(r.queue, durable=True, arguments=bounds)
        for i in range(5):
            await channel.default_exchange.publish(aio_pika.Message(b"%d" % i), r.queue)
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await (await conn.channel()).declare_queue(r.queue, durable=True)
        assert (await channel.declare_queue(r.queue, durable=True, arguments=bounds)
                ).declaration_result.message_count == 3
        first = await queue.get(no_ack=True)
        assert first.body == b"2"  # the two oldest were dropped
    finally:
        await conn.close()
    # Started again with other bounds than the queue has: one line, exit 2.
    code, _, err = await _gateway_events(
        "--webhook", "http://127.0.0.1:9/hook", "--queue", r.queue, "--max-length", "10",
        env=relay_env(IM_WEBHOOK_SECRET=WEBHOOK_SECRET))
    assert code == 2
    assert err.strip().splitlines()[-1].startswith(
        f"gateway: events: the queue {r.queue} (or its .dead) exists with other bounds")
    code, out, _ = await _gateway_events("--delete-queue", "--queue", r.queue, env=relay_env())
    assert code == 0
    assert out.splitlines() == [f"{r.queue}: deleted, with 2 events in it",
                                f"{r.queue}.dead: deleted, with 0 events in it"]
    code, out, _ = await _gateway_events("--delete-queue", "--queue", r.queue, env=relay_env())
    assert code == 0 and out.splitlines()[0] == f"{r.queue}: no such queue"
