"""The MongoDB connection (PyMongo's async API) and its error mapping."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pymongo import AsyncMongoClient
from pymongo.errors import PyMongoError

from store.errors import Unavailable

__all__ = ["connect_mongo", "mongo_guard"]


def connect_mongo(url: str, timeout_s: float, w: str = "majority"
                  ) -> AsyncMongoClient[dict[str, Any]]:
    """A client whose writes are acknowledged only once journaled (``j: true``).

    Without ``j`` an acknowledged write can sit in the server's memory: a
    SIGKILL of the server loses it (seen with SecantusDB, and mongod's
    journal interval allows the same). ``w`` is ``majority`` so that on a
    replica set an ack also survives the loss of the primary.

    ``retryWrites`` is off: every write here is idempotent by ``_id`` and a
    failed batch is retried by the client with the same ``cmid``, so the
    driver's retry bookkeeping buys nothing. On SecantusDB it costs a lot:
    the server keeps every retryable write for 30 minutes and scans them on
    each new one (2.5x slower inserts at batch 16 after a few minutes).
    """
    ms = int(timeout_s * 1000)
    return AsyncMongoClient(
        url,
        w=int(w) if w.isdigit() else w,
        journal=True,
        retryWrites=False,
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
