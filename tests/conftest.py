"""Fixtures: real Redis, RabbitMQ and MongoDB-compatible server; one namespace per run.

Servers come from IM_REDIS_URL / IM_MONGO_URL / IM_AMQP_URL (defaults: the
local ones); with IM_REDIS_CLUSTER=1 IM_REDIS_URL lists the seeds of a Redis
Cluster (CI's second pass: scripts/redis_cluster.sh). Tests that start a plain
Redis of their own say so (``redis_cluster=0``). Each test run gets a fresh
namespace (Redis key prefix, Mongo database, RabbitMQ name prefix), dropped at
the end, so runs never meet.
Clients, node processes, private servers and proxies come from ``testkit``.

Marker ``redis_topology``: set here (``pytest_collection_modifyitems``) on every
test whose behaviour can depend on what IM_REDIS_URL is (one Redis or a
Cluster): every test that uses a fixture reaching the run's servers
(``RUN_SERVER_FIXTURES``: ``redis_client``, ``node``, ``make_node``,
``node_process``, ``mongo_db``, all built on ``run_namespace``; ``http`` and
``connect``, which reach a node). CI's cluster pass runs only those
(``pytest -m redis_topology``). A test whose nodes all use a Redis it starts
itself (``redis_url=...``) is marked ``own_redis`` instead and is left out; the
fixtures fail such a test if it starts a node on the run's Redis or asks for
``redis_client``, so the exemption cannot hide a test that does. A test marked
``edge_only`` (a fuzzer of the edge with a fixed seed, the demo in a browser:
ids cannot hold a hash tag, so the topology cannot change what it finds) is left
out too, to keep the cluster pass from running it a second time to the same end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient

from gateway.config import Settings
from gateway.node import Node
from store.redis_client import RedisClient, connect_redis
from testkit.device import Device
from testkit.http import HttpUser
from testkit.namespace import drop_namespace, new_namespace
from testkit.nodes import NodeProcess, node_env
from testkit.proxy import TcpProxy
from testkit.servers import PrivateServer
from testkit.tokens import issue_token

SECRET = "test-secret-0123456789-abcdefghijkl"
RUN_NS = new_namespace("t")

NodeFactory = Callable[..., Awaitable[Node]]

# Fixtures through which a test reaches the run's Redis (directly, or through a
# node on IM_REDIS_URL): a test using any of them gets ``redis_topology``.
# ``run_namespace`` is under every fixture of the run's servers (``mongo_db``,
# ``redis_client``, ``make_node``, ``node``, ``node_process``), and a test that
# starts a ``NodeProcess`` of its own on the run's servers asks for ``mongo_db``
# (the namespace's database) as the fixtures do. ``http`` may start the default
# ``node`` on demand (``request.getfixturevalue``), so it is named too, as is
# ``connect`` (a device on some node).
RUN_SERVER_FIXTURES = frozenset({"run_namespace", "redis_client", "mongo_db", "make_node",
                                 "node", "node_process", "http", "connect"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if item.get_closest_marker("own_redis") is not None:
            if "redis_client" in names:
                raise pytest.UsageError(f"{item.nodeid}: marked own_redis but uses the run's "
                                        "Redis (redis_client)")
            continue
        if item.get_closest_marker("edge_only") is not None:
            continue
        if names & RUN_SERVER_FIXTURES:
            item.add_marker(pytest.mark.redis_topology)


def _own_redis_guard(request: pytest.FixtureRequest, settings: dict[str, Any]) -> None:
    """A test marked ``own_redis`` may start nodes only on a Redis of its own."""
    if request.node.get_closest_marker("own_redis") is not None and "redis_url" not in settings:
        pytest.fail("a test marked own_redis started a node on the run's Redis "
                    "(give it redis_url=, or drop the mark)")


# Every test connects from 127.0.0.1, some thousands of times: the per-address
# limits are off unless a test sets them (tests/integration/gateway/test_ip_limits.py).
NO_IP_LIMITS = {"ip_handshake_rate": 0, "max_conns_per_ip": 0}


def base_settings(**overrides: Any) -> Settings:
    env = {k: v for k, v in os.environ.items() if k in
           ("IM_REDIS_URL", "IM_REDIS_CLUSTER", "IM_MONGO_URL", "IM_AMQP_URL")}
    values: dict[str, Any] = {"namespace": RUN_NS, "auth_secret": SECRET, "ws_port": 0,
                              "http_port": 0, "metrics_port": 0, "node_id": -1, **NO_IP_LIMITS}
    values.update(overrides)
    return Settings.from_env(env, **values)


def token(user: str, ttl: int = 3600) -> str:
    return issue_token(SECRET, user, ttl)


def uid(prefix: str = "u") -> str:
    """A user id unique to this test run and call."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def settle(*nodes: Any) -> None:
    """Let each node learn the others' heartbeats before routing to them."""
    for n in nodes:
        await n.beat()


@pytest.fixture(scope="session")
async def run_namespace() -> AsyncIterator[str]:
    yield RUN_NS
    s = base_settings()
    await drop_namespace(RUN_NS, redis_url=s.redis_url, mongo_url=s.mongo_url,
                         amqp_url=s.amqp_url, redis_cluster=bool(s.redis_cluster))


@pytest.fixture(scope="session")
async def redis_client(run_namespace: str) -> AsyncIterator[RedisClient]:
    """The run's Redis (or Redis Cluster) as the nodes reach it."""
    s = base_settings()
    r = connect_redis(s.redis_url, 10.0, cluster=bool(s.redis_cluster))
    yield r
    await r.aclose()


@pytest.fixture(scope="session")
async def mongo_db(run_namespace: str) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(base_settings().mongo_url)
    yield client[run_namespace]
    await client.close()


@pytest.fixture
async def make_node(mongo_db: Any, request: pytest.FixtureRequest
                    ) -> AsyncIterator[NodeFactory]:
    """In-process nodes of this run's namespace, closed after the test."""
    nodes: list[Node] = []

    async def factory(**overrides: Any) -> Node:
        _own_redis_guard(request, overrides)
        node = Node(base_settings(**overrides))
        await node.start()
        nodes.append(node)
        return node

    yield factory
    for node in nodes:
        await node.close()


@pytest.fixture
async def node(make_node: NodeFactory) -> Node:
    return await make_node()


@pytest.fixture
async def node_process(mongo_db: Any, request: pytest.FixtureRequest
                       ) -> AsyncIterator[Callable[..., Awaitable[NodeProcess]]]:
    """Nodes as processes (``python -m gateway serve``), stopped after the test."""
    procs: list[NodeProcess] = []

    async def factory(**settings: Any) -> NodeProcess:
        _own_redis_guard(request, settings)
        env = node_env(namespace=RUN_NS, auth_secret=SECRET, ws_port=0, http_port=0,
                       metrics_port=0, **{**NO_IP_LIMITS, **settings})
        proc = NodeProcess(env)
        procs.append(proc)
        return await proc.start()

    yield factory
    for proc in procs:
        await proc.stop(grace_s=5)


@pytest.fixture
async def connect() -> AsyncIterator[Callable[..., Awaitable[Device]]]:
    """Devices of a user on a node (anything with ``ws_port``), closed after the test."""
    devices: list[Device] = []

    async def factory(node: Any, user: str, **kw: Any) -> Device:
        d = await Device.open(node.ws_port, token(user), **kw)
        devices.append(d)
        return d

    yield factory
    for d in devices:
        await d.close()


@pytest.fixture
async def http(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., HttpUser]]:
    """HTTP users, to ``target`` or (started only if asked for) the default ``node``."""
    users: list[HttpUser] = []

    def factory(user: str, target: Any = None) -> HttpUser:
        if target is None and request.node.get_closest_marker("own_redis") is not None:
            pytest.fail("a test marked own_redis asked http() for the default node "
                        "(on the run's Redis): pass its own node")
        port = (target or request.getfixturevalue("node")).http_port
        u = HttpUser(port, token(user))
        users.append(u)
        return u

    yield factory
    for u in users:
        await u.aclose()


@pytest.fixture
async def private() -> AsyncIterator[Callable[[str], Awaitable[PrivateServer]]]:
    """Private servers ("redis" or "mongo") a test may kill and restart."""
    servers: list[PrivateServer] = []

    async def factory(kind: str) -> PrivateServer:
        server = PrivateServer(kind)
        servers.append(server)
        return await server.start()

    yield factory
    for server in servers:
        await server.stop_and_clean()


@pytest.fixture
async def proxy() -> AsyncIterator[Callable[[int], Awaitable[TcpProxy]]]:
    """TCP proxies on 127.0.0.1 in front of a local port, to cut and slow a link."""
    proxies: list[TcpProxy] = []

    async def factory(target_port: int) -> TcpProxy:
        p = TcpProxy(target_port)
        proxies.append(p)
        return await p.start()

    yield factory
    for p in proxies:
        await p.close()
