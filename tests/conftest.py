"""Fixtures: real Redis, RabbitMQ and MongoDB-compatible server; one namespace per run.

Servers come from IM_REDIS_URL / IM_MONGO_URL / IM_AMQP_URL (defaults: the
local ones). Each test run gets a fresh namespace (Redis key prefix, Mongo
database, RabbitMQ name prefix), dropped at the end, so runs never meet.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from pymongo import AsyncMongoClient

from gateway.auth import issue_token
from gateway.config import Settings
from gateway.node import Node
from tests.helpers import WsClient
from tests.servers import PrivateServer

SECRET = "test-secret-0123456789-abcdefghijkl"
RUN_NS = "t" + uuid.uuid4().hex[:10]

NodeFactory = Callable[..., Awaitable[Node]]


def base_settings(**overrides: Any) -> Settings:
    env = {k: v for k, v in os.environ.items() if k in
           ("IM_REDIS_URL", "IM_MONGO_URL", "IM_AMQP_URL")}
    values: dict[str, Any] = {"namespace": RUN_NS, "auth_secret": SECRET, "ws_port": 0,
                              "http_port": 0, "node_id": -1}
    values.update(overrides)
    return Settings.from_env(env, **values)


def token(user: str, ttl: int = 3600) -> str:
    return issue_token(SECRET, user, ttl)


@pytest.fixture(scope="session")
async def redis_client() -> AsyncIterator[aioredis.Redis]:
    r = aioredis.Redis.from_url(base_settings().redis_url)
    yield r
    async for key in r.scan_iter(match=f"{RUN_NS}*", count=1000):
        await r.delete(key)
    await r.aclose()


@pytest.fixture(scope="session")
async def mongo_db(redis_client: aioredis.Redis) -> AsyncIterator[Any]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(base_settings().mongo_url)
    yield client[RUN_NS]
    await client.drop_database(RUN_NS)
    await client.close()


@pytest.fixture
async def make_node(mongo_db: Any) -> AsyncIterator[NodeFactory]:
    nodes: list[Node] = []

    async def factory(**overrides: Any) -> Node:
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
async def connect() -> AsyncIterator[Callable[..., Awaitable[WsClient]]]:
    clients: list[WsClient] = []

    async def factory(node: Node, user: str, **kw: Any) -> WsClient:
        c = await WsClient.open(node.ws_port, token(user), **kw)
        clients.append(c)
        return c

    yield factory
    for c in clients:
        await c.close()


@pytest.fixture
async def http(request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """HTTP clients as a user, to ``target`` or (started only if asked for) the
    default ``node`` fixture."""
    clients: list[httpx.AsyncClient] = []

    def factory(user: str, target: Node | None = None) -> httpx.AsyncClient:
        port = (target or request.getfixturevalue("node")).http_port
        c = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                              headers={"Authorization": f"Bearer {token(user)}"}, timeout=10)
        clients.append(c)
        return c

    yield factory
    for c in clients:
        await c.aclose()


@pytest.fixture
async def private() -> AsyncIterator[Callable[[str], Awaitable[PrivateServer]]]:
    """Private servers ("redis" or "mongo") a test may kill and restart."""
    servers: list[PrivateServer] = []

    async def factory(kind: str) -> PrivateServer:
        server = PrivateServer(kind)
        await server.start()
        servers.append(server)
        return server

    yield factory
    for server in servers:
        await server.stop_and_clean()


def uid(prefix: str = "u") -> str:
    """A user id unique to this test run and call."""
    return f"{prefix}{uuid.uuid4().hex[:8]}"
