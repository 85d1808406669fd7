"""The Redis connection and its error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from store.errors import Unavailable

__all__ = ["connect_redis", "load_lua", "redis_guard"]


def connect_redis(url: str, timeout_s: float) -> aioredis.Redis:
    """A client whose pool waits (up to ``timeout_s``) for a free connection.

    The default asyncio pool raises ``MaxConnectionsError`` at once when all
    connections are busy: a burst of background work then failed sends.
    """
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=64,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=15,
    )
    return aioredis.Redis(connection_pool=pool)


def load_lua(name: str) -> str:
    return resources.files("store").joinpath("lua", name).read_text()


@asynccontextmanager
async def redis_guard() -> AsyncIterator[None]:
    """Turn a Redis failure into ``Unavailable`` with no driver text for clients."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise Unavailable("redis", type(exc).__name__) from exc
    except RedisError as exc:  # e.g. OOM, LOADING, READONLY: still nothing stored
        raise Unavailable("redis", type(exc).__name__) from exc
