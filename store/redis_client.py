"""The Redis connection (one server, or a Redis Cluster), Lua scripts, and the
error mapping.

One server: a blocking pool (a burst waits for a free connection, then fails
as ``Unavailable``). A Redis Cluster (``IM_REDIS_CLUSTER=1``): the cluster
client keeps a pool per primary that fails at once when full, so every
command and pipeline first takes a place from one bounded gate of the same
size, waiting up to the dependency timeout; connection use is bounded as it
is on one server.

Scripts are called by SHA (``EVALSHA``). A server without the script (a
restart, a promoted replica, a cluster node not met before) answers
``NOSCRIPT``; that call, and only that call, is sent again with the body
(``EVAL``, which also caches it there). Inside a pipeline the same holds per
queued call (``Batch``): the other commands of the pipeline ran once.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from importlib import resources
from typing import Any, TypeAlias
from urllib.parse import urlsplit

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, ClusterPipeline, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import (
    MaxConnectionsError,
    NoScriptError,
    RedisClusterException,
    RedisError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

from store.errors import Unavailable
from store.redis_urls import cluster_seeds

__all__ = ["Batch", "Lua", "RedisClient", "cluster_state", "connect_redis",
           "load_lua", "redis_guard", "spop_spread"]

log = logging.getLogger("store.redis")

RedisClient: TypeAlias = "aioredis.Redis | RedisCluster"
MAX_CONNECTIONS = 64


def connect_redis(url: str, timeout_s: float, *, cluster: bool = False,
                  max_connections: int = MAX_CONNECTIONS) -> RedisClient:
    """A client for ``url`` (one server) or, with ``cluster``, for the Redis
    Cluster whose seeds ``url`` lists (``redis://h:p[,redis://h:p...]``).

    Either way at most ``max_connections`` operations use connections at once
    and a caller past that waits up to ``timeout_s``, then gets ``Unavailable``.
    """
    if cluster:
        return GatedRedisCluster.from_seeds(url, timeout_s, max_connections)
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=timeout_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        health_check_interval=15,
    )
    return aioredis.Redis(connection_pool=pool)


# -- the cluster client, gated -------------------------------------------------
_holding: ContextVar[bool] = ContextVar("imgate_redis_gate", default=False)


class _Gate:
    """At most ``size`` operations at once; a caller waits ``wait_s`` for a place.

    Re-entrant within a task (and the tasks it starts): a pipeline that
    re-sends a redirected command does not wait for a second place.
    """

    def __init__(self, size: int, wait_s: float) -> None:
        self.size = size
        self.wait_s = wait_s
        self._sem = asyncio.Semaphore(size)

    @property
    def free(self) -> int:
        """Places free now (for metrics and tests)."""
        return self._sem._value

    @asynccontextmanager
    async def place(self) -> AsyncIterator[None]:
        if _holding.get():
            yield
            return
        try:
            async with asyncio.timeout(self.wait_s):
                await self._sem.acquire()
        except TimeoutError:
            raise MaxConnectionsError(
                f"no Redis connection free within {self.wait_s:g}s "
                f"({self.size} in use)") from None
        token = _holding.set(True)
        try:
            yield
        finally:
            _holding.reset(token)
            self._sem.release()


class GatedRedisCluster(RedisCluster):
    """``RedisCluster`` whose commands and pipelines pass one bounded gate."""

    gate: _Gate

    @classmethod
    def from_seeds(cls, url: str, timeout_s: float, max_connections: int
                   ) -> GatedRedisCluster:
        first = urlsplit(url.split(",")[0].strip())
        client = cls(
            startup_nodes=[ClusterNode(h, p) for h, p in cluster_seeds(url)],
            username=first.username, password=first.password, ssl=first.scheme == "rediss",
            # A pipeline holds one connection per primary; a command one.
            max_connections=max_connections + 4,
            socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            # A failing node is retried twice, quickly, after a fresh look at
            # the slots: long enough to follow a MOVED or a failover already
            # done, short enough that a send gets ``unavailable`` in seconds.
            retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=0.5), retries=2),
        )
        client.gate = _Gate(max_connections, timeout_s)
        return client

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        async with self.gate.place():
            return await super().execute_command(*args, **kwargs)

    def pipeline(self, transaction: Any | None = None,
                 shard_hint: Any | None = None) -> ClusterPipeline:
        if shard_hint:
            raise RedisClusterException("shard_hint is deprecated in cluster mode")
        return _GatedPipeline(self, transaction)  # type: ignore[abstract]


class _GatedPipeline(ClusterPipeline):
    async def execute(self, raise_on_error: bool = True,
                      allow_redirections: bool = True) -> list[Any]:
        client = self.cluster_client
        assert isinstance(client, GatedRedisCluster)
        async with client.gate.place():
            return await super().execute(raise_on_error, allow_redirections)


async def cluster_state(client: RedisClient) -> str:
    """``ok`` or ``fail`` (as CLUSTER INFO says on every primary; a primary
    that does not answer raises), or ``single`` for one server."""
    if not isinstance(client, RedisCluster):
        return "single"
    infos = await client.cluster_info(target_nodes=RedisCluster.PRIMARIES)
    states = {str(i.get("cluster_state", "fail")) for i in _per_node(infos)}
    return "ok" if states == {"ok"} else "fail"


def _per_node(infos: Any) -> list[dict[str, Any]]:
    """CLUSTER INFO answers: one dict, or one per node keyed by node name."""
    if isinstance(infos, dict) and "cluster_state" not in infos:
        return [v for v in infos.values() if isinstance(v, dict)]
    return [infos] if isinstance(infos, dict) else []


# -- scripts -------------------------------------------------------------------
def load_lua(name: str) -> str:
    return resources.files("store").joinpath("lua", name).read_text()


class Lua:
    """A Lua script of ``store/lua``, called by SHA; NOSCRIPT sends the body."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.text = load_lua(name)
        self.sha = hashlib.sha1(self.text.encode()).hexdigest()

    async def __call__(self, client: RedisClient, keys: Sequence[Any],
                       args: Sequence[Any] = ()) -> Any:
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)  # type: ignore[misc]
        except NoScriptError:
            return await client.eval(self.text, len(keys), *keys, *args)  # type: ignore[misc]


class Batch:
    """A non-transactional pipeline whose script calls survive NOSCRIPT.

    Queue commands on ``pipe`` and scripts with ``script``; ``execute``
    returns every reply in order and raises the first error, after sending
    the body of each script a server did not have. Those scripts then run
    after the batch's other commands: a command must not read what a script
    of the same batch writes (send it in a batch of its own).
    """

    def __init__(self, client: RedisClient) -> None:
        self.client = client
        self.pipe: Any = client.pipeline(transaction=False)
        self._scripts: dict[int, tuple[Lua, tuple[Any, ...]]] = {}

    def script(self, lua: Lua, keys: Sequence[Any], args: Sequence[Any] = ()) -> None:
        call = (len(keys), *keys, *args)
        self._scripts[len(self.pipe)] = (lua, call)
        self.pipe.execute_command("EVALSHA", lua.sha, *call)  # (evalsha() is refused there)

    def __len__(self) -> int:
        return len(self.pipe)

    async def execute(self) -> list[Any]:
        if not len(self.pipe):
            return []
        replies: list[Any] = list(await self.pipe.execute(raise_on_error=False))
        missing = [i for i, r in enumerate(replies)
                   if isinstance(r, NoScriptError) and i in self._scripts]
        if missing:
            again = self.client.pipeline(transaction=False)
            for i in missing:
                lua, call = self._scripts[i]
                again.execute_command("EVAL", lua.text, *call)
            for i, reply in zip(missing, await again.execute(raise_on_error=False),
                                strict=True):
                replies[i] = reply
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies


# -- sharded sets ----------------------------------------------------------------
async def spop_spread(client: RedisClient, keys: Sequence[str], n: int) -> list[bytes]:
    """About ``n`` (at most ``n`` + len(keys)) members popped from the sets ``keys``
    (the shards of one set):
    an equal share from each, then what is left of ``n`` from the shards that
    gave their whole share (a busy shard is not held to 1/len(keys) of ``n``).
    One round trip, two when some shard is busy."""
    share = -(-n // len(keys))
    out: list[bytes] = []
    busy: list[str] = []
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.spop(k, share)
    for k, got in zip(keys, await pipe.execute(), strict=True):
        out.extend(got or ())
        if got and len(got) == share:
            busy.append(k)
    left = n - len(out)
    if busy and left > 0:
        pipe = client.pipeline(transaction=False)
        for k in busy:
            pipe.spop(k, -(-left // len(busy)))
        for got in await pipe.execute():
            out.extend(got or ())
    return out


# -- errors ----------------------------------------------------------------------
@asynccontextmanager
async def redis_guard() -> AsyncIterator[None]:
    """Turn a Redis failure into ``Unavailable`` with no driver text for clients."""
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        raise Unavailable("redis", type(exc).__name__) from exc
    except RedisError as exc:  # e.g. OOM, LOADING, READONLY, CLUSTERDOWN: nothing stored
        raise Unavailable("redis", type(exc).__name__) from exc
    except RedisClusterException as exc:  # slots not covered, no node answers
        raise Unavailable("redis", type(exc).__name__) from exc
    except RuntimeError as exc:
        # The cluster client can surface a broken connection as a bare RuntimeError
        # (two readers on one stream while a master fails over): still "unavailable",
        # one line in the log, no traceback.
        log.warning("redis client error taken as unavailable: %s", exc)
        raise Unavailable("redis", type(exc).__name__) from exc
    except AttributeError as exc:
        # The same, from inside the driver: a connection closed under a pipeline
        # still connecting ('NoneType' object has no attribute 'writelines').
        # Raised by our own code, it is a bug, and goes up as one.
        if not _raised_in_driver(exc):
            raise
        log.warning("redis client error taken as unavailable: %s", exc)
        raise Unavailable("redis", type(exc).__name__) from exc


def _raised_in_driver(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside the redis package (its last frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}redis{os.sep}" in tb.tb_frame.f_code.co_filename
