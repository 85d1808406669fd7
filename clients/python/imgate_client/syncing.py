"""The ``Client``'s sync: ``GET /v1/sync`` from the cursor, page after page, each
message not delivered yet becoming a ``Message`` (the ``Inbox`` of the core
decides); pushes held meanwhile are delivered after it (the messages, then the
pushes about stored messages: ``recalled``, ``edited``, ``reaction``). A
message delivered before that a page brings again edited or recalled since
(the push missed while offline) is told as the ``edited`` / ``recalled`` push
would have been. A mixin on ``Client``:
after every connect, when the dedup window fills, and on ``sync()``."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import Frame, Inbox
from imgate_client.events import Event, Push, Stopped, SyncFailed
from imgate_client.http import HttpError

__all__ = ["Syncing"]

SYNC_TRIES = 3
RESYNC_FIRST_S = 1.0  # after those tries: again in the background, doubling to
RESYNC_MAX_S = 30.0  # this, while the connection lasts


class Syncing:
    """Sync and the pushes held during one (see the module docstring)."""

    inbox: Inbox
    sync_limit: int
    stopped: Stopped | None
    _sync_lock: asyncio.Lock
    _gen: int  # the connection's number: a new connection, a new number
    request_timeout: float

    @property
    def user(self) -> str | None:
        raise NotImplementedError

    async def http(self, method: str, path: str, *, json: Any = None,
                   params: dict[str, Any] | None = None) -> Any:
        raise NotImplementedError

    def _deliver(self, f: Frame, via: str) -> None:
        raise NotImplementedError

    def _emit(self, event: Event) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Any) -> None:
        raise NotImplementedError

    async def sync(self) -> int:
        """``GET /v1/sync`` from the cursor, every page: each message not delivered yet
        becomes a ``Message`` event; returns how many."""
        try:
            return await self._sync_pages()
        finally:
            if self.inbox.syncing and not self._sync_lock.locked():
                self._release_held()

    async def _sync_pages(self) -> int:
        async with self._sync_lock:
            self.inbox.begin_sync()
            delivered = 0
            try:
                while True:
                    page = await self.http("GET", "/v1/sync",
                                           params=self.inbox.sync_params(self.sync_limit))
                    msgs, more = self.inbox.on_sync_page(page)
                    for m in msgs:
                        self._deliver(m, "sync")
                    for f in self.inbox.changes(self.user):  # edited / recalled while away
                        self._emit(Push(str(f["op"]), f))
                    delivered += len(msgs)
                    if not more:
                        break
            finally:
                self._release_held()
            return delivered

    async def _background_sync(self) -> None:
        with contextlib.suppress(HttpError, OSError, TimeoutError, ValueError):
            await self._sync_pages()

    async def _sync_after_connect(self) -> int:
        for attempt in range(SYNC_TRIES):
            try:
                return await self._sync_pages()
            except (HttpError, OSError, TimeoutError, ValueError) as exc:
                if attempt == SYNC_TRIES - 1 or self.stopped is not None:
                    self._release_held()
                    self._emit(SyncFailed(repr(exc)))
                    if self.stopped is None:  # not left behind while connected
                        self._spawn(self._resync(self._gen))
                    return 0
                self.inbox.begin_sync()
                await asyncio.sleep(0.5 * 2 ** attempt)
        return 0

    async def _sync_once_registered(self, conn: Connection, gen: int) -> None:
        """The node did not answer the ping after connect ``gen`` in time: once it
        answers one (the device is registered), sync again, so a message acked
        between the first sync and the registration is not missed."""
        while self.stopped is None and self._gen == gen and not conn.closed:
            try:
                await conn.request("ping", self.request_timeout)
            except TimeoutError:
                continue
            except Disconnected:
                return
            if self._gen == gen:
                await self._background_sync()
            return

    async def _resync(self, gen: int) -> None:
        """The sync after connect ``gen`` failed every try (a dependency of the
        node down longer than they last): tried again, 1 s doubling to 30 s,
        until it succeeds or that connection is gone (the next connect syncs)."""
        delay = RESYNC_FIRST_S
        while True:
            await asyncio.sleep(delay)
            if self.stopped is not None or self._gen != gen:
                return
            try:
                await self._sync_pages()
                return
            except (HttpError, OSError, TimeoutError, ValueError):
                delay = min(RESYNC_MAX_S, delay * 2)

    def _release_held(self) -> None:
        for f in self.inbox.end_sync():
            self._deliver(f, "push")
        for f in self.inbox.after_sync():  # edited, reaction, recalled: after their messages
            self._emit(Push(str(f.get("op")), f))
