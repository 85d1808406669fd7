"""``IM_AMQP_URL`` as a list of a RabbitMQ cluster's nodes (router/amqp_urls.py),
the masked URLs in messages, the order the broker's supervisor tries the nodes
in (its setup faked) and what it logs, the round robin the broker and the
webhook relay share (router/amqp_link.py), and the broker link's state as the
node reports it (no servers)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from gateway.metrics import NodeMetrics
from router import BrokerStatus, MemoryBroker, Router
from router.amqp_link import AmqpNodes, Stopped
from router.amqp_urls import AmqpUrlError, mask_password, parse_amqp_urls
from router.broker_rabbitmq import RabbitMQBroker
from router.errors import BrokerUnavailable
from testkit.poll import until
from testkit.probe import sample

CLUSTER = ("amqp://guest:guest@127.0.0.1:5681/,amqp://guest:guest@127.0.0.1:5682/,"
           "amqp://guest:guest@127.0.0.1:5683/")


def test_one_url_is_a_list_of_one():
    assert parse_amqp_urls("amqp://guest:guest@127.0.0.1:5672/") == [
        "amqp://guest:guest@127.0.0.1:5672/"]


def test_a_cluster_list_keeps_its_order():
    assert parse_amqp_urls(CLUSTER) == [
        "amqp://guest:guest@127.0.0.1:5681/", "amqp://guest:guest@127.0.0.1:5682/",
        "amqp://guest:guest@127.0.0.1:5683/"]


def test_blanks_around_items_are_ignored_and_schemes_are_case_blind():
    assert parse_amqp_urls(" amqp://a:1/ , AMQPS://u:p@b/vhost?heartbeat=5 ") == [
        "amqp://a:1/", "AMQPS://u:p@b/vhost?heartbeat=5"]


@pytest.mark.parametrize("raw, says", [
    ("", "IM_AMQP_URL is empty"),
    ("   ", "IM_AMQP_URL is empty"),
    ("amqp://a/,", "IM_AMQP_URL item 2 of 2 is empty"),
    (",amqp://a/", "IM_AMQP_URL item 1 of 2 is empty"),
    ("amqp://a/,,amqp://b/", "IM_AMQP_URL item 2 of 3 is empty"),
    ("amqp://a/, ,amqp://b/", "IM_AMQP_URL item 2 of 3 is empty"),
    ("http://a/", "IM_AMQP_URL item 1 of 1 (http://a/) must start with amqp:// or amqps://"),
    ("127.0.0.1:5672", "must start with amqp://"),
    ("amqp://a/,redis://b/", "IM_AMQP_URL item 2 of 2 (redis://b/) must start with amqp://"),
    ("amqp:///vhost", "names no host"),
    ("amqp://u:p@/", "names no host"),
    ("amqp://a:notaport/", "is not a URL"),
    ("amqp://a:99999/", "is not a URL"),
    ("amqp://a:0/", "has port 0"),
])
def test_bad_settings_are_refused_by_name(raw, says):
    with pytest.raises(AmqpUrlError, match="IM_AMQP_URL") as err:
        parse_amqp_urls(raw)
    assert says in str(err.value)
    assert isinstance(err.value, ValueError)  # the node turns it into a StartupError


def test_a_refused_item_never_shows_its_password():
    with pytest.raises(AmqpUrlError) as err:
        parse_amqp_urls("amqp://guest:s3cret@a/,http://admin:hunter2@b/")
    assert "hunter2" not in str(err.value) and "s3cret" not in str(err.value)
    assert "http://admin:***@b/" in str(err.value)


@pytest.mark.parametrize("url, shown", [
    ("amqp://guest:guest@127.0.0.1:5681/", "amqp://guest:***@127.0.0.1:5681/"),
    ("amqps://u:p:q@h/v", "amqps://u:***@h/v"),  # everything after the first colon
    ("amqp://guest@h/", "amqp://guest@h/"),  # no password
    ("amqp://h:5672/", "amqp://h:5672/"),
    ("not a url", "not a url"),
])
def test_mask_password(url, shown):
    assert mask_password(url) == shown


def test_node_messages_mask_every_password_of_a_list():
    from gateway.node import _safe_url

    assert _safe_url(CLUSTER) == ("amqp://guest:***@127.0.0.1:5681/,amqp://guest:***@127.0.0.1:"
                                  "5682/,amqp://guest:***@127.0.0.1:5683/")
    assert _safe_url("redis://:pw@a:7000,redis://:pw@b:7001") == "redis://:***@a:7000,redis://:***@b:7001"
    assert _safe_url("mongodb://u:p@h1:1,h2:2/db") == "mongodb://u:***@h1:1,h2:2/db"
    assert _safe_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


async def test_a_malformed_list_fails_the_broker_start_before_any_connect():
    broker = RabbitMQBroker("amqp://guest:guest@127.0.0.1:5681/,", "ns")
    with pytest.raises(AmqpUrlError, match="IM_AMQP_URL item 2 of 2 is empty"):
        await broker.start("n1", lambda _: None)
    assert not broker.is_connected and broker.index == -1


async def test_no_node_answering_is_broker_unavailable_naming_each():
    from testkit.servers import free_port

    ports = [free_port(), free_port()]  # nothing listens there
    broker = RabbitMQBroker(",".join(f"amqp://guest:pw@127.0.0.1:{p}/" for p in ports), "ns",
                            connect_timeout_s=2)
    with pytest.raises(BrokerUnavailable) as err:
        await broker.start("n1", lambda _: None)
    text = str(err.value)
    assert all(f"127.0.0.1:{p}" in text for p in ports) and "pw" not in text.replace(
        "amqp://guest:***", "")
    assert not broker.is_connected


class _Silent:
    def deliver_to_user(self, user, frame, skip_conn):
        return 0


async def test_memory_broker_is_always_connected_and_reported():
    router = Router("n1", _Silent(), MemoryBroker(), routes=None)  # type: ignore[arg-type]
    assert router.broker_connected()
    assert router.broker_status() == BrokerStatus(connected=True, node_index=0, reconnects=0,
                                                  failovers=0)
    metrics = NodeMetrics()
    metrics.watch_broker(router.broker_status)
    text = metrics.render()
    assert sample(text, "im_broker_connected") == 1
    assert sample(text, "im_broker_node_index") == 0
    assert sample(text, "im_broker_reconnects_total") == 0
    assert sample(text, "im_broker_failovers_total") == 0


def test_rabbitmq_state_is_read_at_each_scrape():
    broker = RabbitMQBroker(CLUSTER, "ns")  # never started: the state is set by hand
    router = Router("n1", _Silent(), broker, routes=None)  # type: ignore[arg-type]
    metrics = NodeMetrics()
    metrics.watch_broker(router.broker_status)
    assert not router.broker_connected()
    assert sample(metrics.render(), "im_broker_connected") == 0
    assert sample(metrics.render(), "im_broker_node_index") == -1
    broker.link.index, broker.link.reconnects, broker.link.failovers = 2, 3, 1
    broker.connected.set()
    assert router.broker_connected()
    text = metrics.render()
    assert sample(text, "im_broker_connected") == 1
    assert sample(text, "im_broker_node_index") == 2
    assert sample(text, "im_broker_reconnects_total") == 3
    assert sample(text, "im_broker_failovers_total") == 1


# -- the order nodes are tried in (the supervisor, with setup faked) -----------
class _Conn:
    is_closed = True  # nothing to close


class _Rotating(RabbitMQBroker):
    """The real supervisor; ``_setup`` answers only for the URLs in ``up``."""

    last: _Rotating | None = None  # the newest, for the ``backoffs`` fixture

    def __init__(self, urls: str, up: set[int]) -> None:
        super().__init__(urls, "ns")
        _Rotating.last = self
        self.up = up
        self.tried: list[tuple[int, float]] = []  # (index, monotonic time)
        self.resumed: list[float] = []

    async def _setup(self, index: int) -> None:
        self.tried.append((index, time.monotonic()))
        if index not in self.up:
            raise ConnectionError("refused")
        self._conn = _Conn()  # type: ignore[assignment]
        self._lost.clear()
        self.connected.set()

    def lose(self) -> float:
        self._connection_closed(self._conn)
        return time.monotonic()


async def _started(urls: str, up: set[int]) -> _Rotating:
    b = _Rotating(urls, up)
    await b.start("n1", lambda _: None, b.resumed.append)
    return b


async def test_start_takes_the_first_node_that_answers():
    b = await _started(CLUSTER, {1, 2})
    try:
        assert [i for i, _ in b.tried] == [0, 1] and b.index == 1 and b.is_connected
        assert (b.reconnects, b.failovers) == (0, 0)
    finally:
        await b.close()


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, int]]:
    """The supervisor's backoff sleeps (0.2 s doubling to 2 s), each with how
    many setups had been tried when it began (the clock is not read)."""
    seen: list[tuple[float, int]] = []
    real = asyncio.sleep

    async def sleep(delay: float, *args: Any, **kwargs: Any) -> Any:
        if delay in (0.2, 0.4, 0.8, 1.6, 2.0):
            seen.append((delay, len(_Rotating.last.tried) if _Rotating.last else -1))
        return await real(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    return seen


async def test_a_lost_node_is_followed_by_the_next_at_once(backoffs):
    b = await _started(CLUSTER, {0, 1, 2})
    try:
        b.tried.clear()
        b.up = {1, 2}  # node 0 died
        b.lose()
        assert not b.is_connected and b.index == -1
        assert await until(lambda: b.resumed, timeout=2)
        assert [i for i, _ in b.tried] == [1]
        assert backoffs == []  # no backoff before the next node
        assert b.index == 1 and b.is_connected and (b.reconnects, b.failovers) == (1, 1)
        b.tried.clear()
        b.up = {0, 2}
        b.lose()  # round robin: from 2 on, 0 after it
        assert await until(lambda: len(b.resumed) == 2, timeout=2)
        assert [i for i, _ in b.tried] == [2] and (b.reconnects, b.failovers) == (2, 2)
    finally:
        await b.close()


async def test_backoff_only_after_a_whole_round_failed(backoffs):
    b = await _started(CLUSTER, {0, 1, 2})
    try:
        b.tried.clear()
        b.up = set()
        b.lose()
        assert await until(lambda: len(b.tried) >= 6, timeout=3)  # two rounds
        b.up = {1}
        assert await until(lambda: b.resumed, timeout=5)
        order = [i for i, _ in b.tried]
        assert order[:6] == [1, 2, 0, 1, 2, 0]  # the lost one last in each round
        # The first round at once; a 0.2 s pause after it, 0.4 s after the second.
        assert backoffs[:2] == [(0.2, 3), (0.4, 6)]
        assert b.index == 1 and (b.reconnects, b.failovers) == (1, 1)
    finally:
        await b.close()


async def test_one_url_reconnects_to_itself():
    b = await _started("amqp://guest:guest@127.0.0.1:5672/", {0})
    try:
        b.tried.clear()
        b.lose()
        assert await until(lambda: b.resumed, timeout=2)
        assert [i for i, _ in b.tried] == [0] and (b.reconnects, b.failovers) == (1, 0)
    finally:
        await b.close()


async def test_a_failed_reconnect_attempt_is_one_warning_line(caplog):
    b = await _started(CLUSTER, {0})
    try:
        b.tried.clear()
        b.up = {2}
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="router.rabbitmq"):
            b.lose()
            assert await until(lambda: b.resumed, timeout=2)
        failed = [r for r in caplog.records if "setup failed" in r.getMessage()]
        assert [r.getMessage() for r in failed] == [
            "RabbitMQ at amqp://guest:***@127.0.0.1:5682/: setup failed "
            "(ConnectionError: refused); trying amqp://guest:***@127.0.0.1:5683/ next"]
        assert failed[0].levelno == logging.WARNING and failed[0].exc_info is None
        assert "guest:guest" not in caplog.text
        assert b.index == 2 and (b.reconnects, b.failovers) == (1, 1)
    finally:
        await b.close()


# -- the shared round robin (router/amqp_link.py), as the relay uses it ----------
def _nodes(n: int = 3, max_delay_s: float = 5.0) -> AmqpNodes:
    urls = [f"amqp://u:s3cret@127.0.0.1:{5681 + i}/" for i in range(n)]
    return AmqpNodes(urls, logging.getLogger("test.amqp_link"), max_delay_s=max_delay_s)


async def test_an_unexpected_failure_is_one_error_with_its_traceback(caplog):
    nodes = _nodes(2)

    async def attempt(i: int) -> str:
        if i == 0:
            raise KeyError("surprise")
        raise TimeoutError(f"no answer from {nodes.urls[i]}")

    with caplog.at_level(logging.INFO, logger="test.amqp_link"), pytest.raises(
            BrokerUnavailable) as err:
        await nodes.round(attempt)
    # The bug, with its traceback; the last of the round has no line of its own
    # (the round's line, with its backoff, says it: ``rounds``).
    [first] = caplog.records
    assert first.levelno == logging.ERROR and first.exc_info is not None
    assert first.getMessage() == ("RabbitMQ at amqp://u:***@127.0.0.1:5681/: setup failed "
                                  "(KeyError: 'surprise')")
    assert "s3cret" not in caplog.text and "s3cret" not in str(err.value)
    # The URL in the exception's own message is masked too.
    assert str(err.value) == ("no RabbitMQ node answered (amqp://u:***@127.0.0.1:5681/: "
                              "KeyError: 'surprise'; amqp://u:***@127.0.0.1:5682/: "
                              "TimeoutError: no answer from amqp://u:***@127.0.0.1:5682/)")
    assert nodes.index == -1


async def test_rounds_back_off_to_the_cap_and_reconnect_counts():
    nodes, up, tried, pauses = _nodes(), set[int](), [], []

    async def attempt(i: int) -> int:
        tried.append(i)
        if i not in up:
            raise ConnectionError("refused")
        return i * 10

    async def pause(seconds: float) -> bool:
        pauses.append(seconds)
        if len(pauses) == 7:
            up.add(2)
        return False

    assert await nodes.rounds(attempt, 0, pause=pause) == 20  # at start: from the first on
    assert pauses == [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert tried == [0, 1, 2] * 7 + [0, 1, 2] and nodes.index == 2
    assert (nodes.reconnects, nodes.failovers) == (0, 0)
    nodes.lost()
    assert nodes.index == -1 and nodes.lost_index == 2
    tried.clear()
    pauses.clear()
    up.update({0, 1})
    assert await nodes.reconnect(attempt, pause=pause) == 0  # after the lost one: 0, then 1
    assert tried == [0] and pauses == [] and nodes.index == 0
    assert (nodes.reconnects, nodes.failovers) == (1, 1)
    nodes.lost()
    tried.clear()
    up.clear()
    up.add(0)
    assert await nodes.reconnect(attempt, pause=pause) == 0  # the lost one last: 1, 2, 0
    assert tried == [1, 2, 0] and (nodes.reconnects, nodes.failovers) == (2, 1)


async def test_stopping_ends_the_rounds():
    nodes, tried = _nodes(), []
    stop = asyncio.Event()

    async def attempt(i: int) -> int:
        tried.append(i)
        if i == 1:
            stop.set()
        raise ConnectionError("refused")

    async def pause(seconds: float) -> bool:
        raise AssertionError("no backoff once stopping")

    with pytest.raises(Stopped):
        await nodes.rounds(attempt, 0, stopping=stop.is_set, pause=pause)
    assert tried == [0, 1]  # not asked again once stopping

    stop.clear()
    tried.clear()

    async def stopped_meanwhile(seconds: float) -> bool:
        return True

    with pytest.raises(Stopped):
        await nodes.rounds(lambda i: attempt(2), 0, pause=stopped_meanwhile)
    assert tried == [2, 2, 2]  # one round, then the pause said stop
