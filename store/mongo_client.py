"""The MongoDB connection (PyMongo's async API) and its error mapping."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from pymongo import AsyncMongoClient, IndexModel, monitoring
from pymongo.asynchronous.collection import AsyncCollection
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.errors import BulkWriteError, PyMongoError

from store.errors import Unavailable

__all__ = ["DUPLICATE_KEY", "CommandObserver", "CommandTimer", "Index", "connect_mongo",
           "ensure_indexes", "insert_each", "insert_idempotent", "mongo_guard"]

DUPLICATE_KEY = 11000
# (collection, keys, options): one index a store's collections carry.
Index = tuple[str, list[tuple[str, int]], dict[str, Any]]


# (command, collection, shape, seconds, succeeded): one command the server
# answered or failed; ``shape``: the fields a read filters and sorts on
CommandObserver = Callable[[str, str, str, float, bool], None]


def query_shape(command: Mapping[str, Any]) -> str:
    """The fields a find / findAndModify filters on and sorts by (``"owner,mid
    sort mid:-1"``): which query it is, not its values (bounded: the code's
    queries)."""
    filt = command.get("filter", command.get("query"))
    if not isinstance(filt, Mapping):
        return ""
    shape = ",".join(sorted(filt))
    sort = command.get("sort")
    if isinstance(sort, Mapping) and sort:
        shape += " sort " + ",".join(f"{k}:{v}" for k, v in sort.items())
    return shape


class CommandTimer(monitoring.CommandListener):
    """Times every command the client sends, by command and collection, so an
    operator sees which reads load the store (PyMongo's command monitoring;
    called on the event loop, a dict operation per event)."""

    def __init__(self, observe: CommandObserver) -> None:
        self.observe = observe
        self._started: dict[int, tuple[float, str, str, str]] = {}  # request id ->

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        target = event.command.get(event.command_name)
        coll = target if isinstance(target, str) else ""
        if len(self._started) < 10_000:  # bounded: an event lost by the driver is not kept
            self._started[event.request_id] = (time.monotonic(), event.command_name, coll,
                                               query_shape(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        self._end(event.request_id, True)

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        self._end(event.request_id, False)

    def _end(self, request_id: int, ok: bool) -> None:
        start = self._started.pop(request_id, None)
        if start is not None:
            t0, name, coll, shape = start
            self.observe(name, coll, shape, time.monotonic() - t0, ok)


def connect_mongo(url: str, timeout_s: float, w: str = "majority",
                  observe: CommandObserver | None = None
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
        event_listeners=[CommandTimer(observe)] if observe is not None else None,
    )


@asynccontextmanager
async def mongo_guard() -> AsyncIterator[None]:
    """Turn a MongoDB failure into ``Unavailable``: nothing is acknowledged."""
    try:
        yield
    except PyMongoError as exc:
        raise Unavailable("mongo", type(exc).__name__) from exc


async def ensure_indexes(db: AsyncDatabase[dict[str, Any]], indexes: list[Index]) -> None:
    """Create the indexes a collection does not have yet (by name), all of a
    collection in one command. A node's start costs one ``listIndexes`` per
    collection once they exist: a busy store is not asked to check every
    index again whenever a node restarts."""
    wanted: dict[str, list[IndexModel]] = {}
    for collection, keys, options in indexes:
        wanted.setdefault(collection, []).append(IndexModel(keys, **options))
    async with mongo_guard():
        for collection, models in wanted.items():
            have = {str(ix["name"]) async for ix in await db[collection].list_indexes()}
            missing = [m for m in models if m.document["name"] not in have]
            if missing:
                await db[collection].create_indexes(missing)


async def insert_each(collection: AsyncCollection[dict[str, Any]],
                      docs: list[dict[str, Any]]) -> tuple[set[int], dict[int, int]]:
    """Unordered ``insert_many``: (indexes of documents already there, by ``_id``
    or a unique key; index -> error code of every other document that failed).
    A failure of the whole call (no answer) is ``Unavailable``."""
    async with mongo_guard():
        try:
            await collection.insert_many(docs, ordered=False)
        except BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            dup = {e["index"] for e in errors if e.get("code") == DUPLICATE_KEY}
            return dup, {e["index"]: int(e.get("code") or 0) for e in errors
                         if e.get("code") != DUPLICATE_KEY}
    return set(), {}


async def insert_idempotent(collection: AsyncCollection[dict[str, Any]],
                            docs: list[dict[str, Any]]) -> None:
    """Unordered ``insert_many`` where a document already there (same ``_id`` or
    unique key) counts as written; any other failure is ``Unavailable``."""
    _, failed = await insert_each(collection, docs)
    if failed:
        raise Unavailable("mongo", f"write error {next(iter(failed.values()))}")
