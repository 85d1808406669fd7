"""The MongoDB connection (PyMongo's async API) and its error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from store.errors import Unavailable

__all__ = ["connect_mongo", "mongo_guard"]


def connect_mongo(url: str, timeout_s: float) -> AsyncMongoClient[dict[str, Any]]:
    ms = int(timeout_s * 1000)
    return AsyncMongoClient(
        url,
        serverSelectionTimeoutMS=ms,
        connectTimeoutMS=ms,
        socketTimeoutMS=ms * 2,
        maxPoolSize=32,
        tz_aware=False,
    )


@asynccontextmanager
async def mongo_guard() -> AsyncIterator[None]:
    """Turn a MongoDB failure into ``Unavailable``: nothing is acknowledged."""
    try:
        yield
    except PyMongoError as exc:
        raise Unavailable("mongo", type(exc).__name__) from exc
