"""Namespaces: each run's Redis key prefix, MongoDB database and RabbitMQ names.

A run takes a fresh one and drops it at the end, so runs never meet.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["drop_namespace", "new_namespace"]


def new_namespace(prefix: str = "t") -> str:
    """``prefix`` + 10 hex digits: a valid ``IM_NAMESPACE`` nobody else uses."""
    return prefix + secrets.token_hex(5)


async def drop_namespace(ns: str, *, redis_url: str, mongo_url: str,
                         amqp_url: str | None = None, timeout: float = 120,
                         redis_cluster: bool = False) -> dict[str, Any]:
    """Delete the Redis keys ``ns*``, drop the MongoDB database ``ns`` and, given
    ``amqp_url``, the two exchanges the nodes declared. Each step is bounded and
    reported (a count, or why it failed); the others run anyway. With
    ``redis_cluster``, ``redis_url`` lists a Redis Cluster's seeds and every
    primary is scanned."""
    steps: list[tuple[str, Callable[[str, str], Awaitable[Any]], str]] = [
        ("redis_keys", _delete_cluster_keys if redis_cluster else _delete_keys, redis_url),
        ("mongo", _drop_database, mongo_url)]
    if amqp_url is not None:
        steps.append(("exchanges", _delete_exchanges, amqp_url))
    done: dict[str, Any] = {}
    for what, step, url in steps:
        try:
            async with asyncio.timeout(timeout):
                done[what] = await step(url, ns)
        except Exception as exc:  # noqa: BLE001 - reported; the other steps still run
            done[what] = f"failed: {exc!r}"
    return done


async def _delete_keys(redis_url: str, ns: str) -> int:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(redis_url, socket_timeout=10)
    deleted, batch = 0, []
    try:
        async for key in r.scan_iter(match=f"{ns}*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += await r.delete(*batch)
                batch = []
        if batch:
            deleted += await r.delete(*batch)
    finally:
        await r.aclose()
    return deleted


async def _delete_cluster_keys(redis_url: str, ns: str) -> int:
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from store.redis_urls import cluster_seeds

    r = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_seeds(redis_url)],
                     socket_timeout=10)
    deleted = 0
    try:
        # scan_iter visits every primary; DEL is sent one key at a time (keys
        # of a namespace span every slot).
        keys = [k async for k in r.scan_iter(match=f"{ns}*", count=1000)]
        for i in range(0, len(keys), 500):
            pipe = r.pipeline(transaction=False)
            for k in keys[i:i + 500]:
                pipe.delete(k)
            deleted += sum(await pipe.execute())
    finally:
        await r.aclose()
    return deleted


async def _drop_database(mongo_url: str, ns: str) -> bool:
    from pymongo import AsyncMongoClient

    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, serverSelectionTimeoutMS=5000)
    try:
        await client.drop_database(ns)
    finally:
        await client.close()
    return True


async def _delete_exchanges(amqp_url: str, ns: str) -> int:
    """The nodes' queues are exclusive and went with them; their exchanges stay
    (cluster-wide: one node of an IM_AMQP_URL list is enough, the first that answers)."""
    import aio_pika

    urls = [u.strip() for u in amqp_url.split(",") if u.strip()]
    for i, url in enumerate(urls):
        try:
            conn = await aio_pika.connect(url, timeout=10)
            break
        except Exception:
            if i == len(urls) - 1:
                raise
    try:
        channel = await conn.channel()
        for kind in ("node", "room", "events"):
            await channel.exchange_delete(f"{ns}.{kind}")
    finally:
        await conn.close()
    return 2
