"""Events out (docs/protocol.md, Events out): JSON events to the durable topic
exchange ``{IM_NAMESPACE}.events``, persistent and publisher-confirmed, for the
product's own services (its offline-push service binds ``offline.#``).

Built so far: ``offline.msg``, one per 1:1 message stored for a receiver with
no device connected to a live node. A send only queues the event (never
awaits, never fails): a bounded outbox (``IM_EVENTS_PENDING_MAX``) that a
worker drains in order, reading each user's unread total just before
publishing, and retrying with backoff while the broker does not take it. A
full outbox drops the newest event and counts it; delivery is at least once
(a publish whose confirm was lost is sent again).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = ["Events", "preview"]

log = logging.getLogger("gateway.events")
PREVIEW_CHARS = 100
BATCH = 64


def preview(body: bytes) -> str | None:
    """The first 100 characters of a string body, or of a body's string ``text``."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, dict):
        value = value.get("text")
    return value[:PREVIEW_CHARS] if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class _OfflineMsg:
    user: str
    mid: int
    sender: str
    conv: str
    body: bytes


class Events:
    """The node's outbox of events and its worker."""

    def __init__(self, publish: Callable[[str, bytes], Awaitable[None]],
                 unread: Callable[[str], Awaitable[int]], wanted: tuple[str, ...], *,
                 pending_max: int = 10_000,
                 count: Callable[[str, str], None] = lambda _type, _outcome: None) -> None:
        self.publish = publish
        self.unread = unread
        self.wanted = wanted
        self.pending_max = pending_max
        self.count = count
        self._queue: collections.deque[_OfflineMsg] = collections.deque()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def wants(self, kind: str) -> bool:
        """``IM_EVENTS`` names the type or a prefix of it (``offline`` covers ``offline.msg``)."""
        return any(kind == w or kind.startswith(w + ".") for w in self.wanted)

    @property
    def pending(self) -> int:
        return len(self._queue)

    def offline_msg(self, user: str, mid: int, sender: str, conv: str, body: bytes) -> None:
        """Queue ``offline.msg`` for ``user`` (never awaits)."""
        if not self.wants("offline.msg"):
            return
        if len(self._queue) >= self.pending_max:
            self.count("offline.msg", "dropped")
            return
        self._queue.append(_OfflineMsg(user, mid, sender, conv, body))
        self._ready.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        delay = 0.2
        while True:
            await self._ready.wait()
            if not self._queue:
                self._ready.clear()
                continue
            batch = [self._queue[i] for i in range(min(BATCH, len(self._queue)))]
            try:
                await self._send(batch)
            except Exception as exc:  # noqa: BLE001 - retried: the broker, or Redis, is down
                self.count("offline.msg", "retried")
                log.warning("events not published yet (%d pending): %s", len(self._queue),
                            type(exc).__name__)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2

    async def _send(self, batch: list[_OfflineMsg]) -> None:
        """Publish in order, each leaving the outbox once the broker confirmed it;
        a failure stops the batch (the rest is retried; one whose confirm was
        lost is sent again: at least once)."""
        totals: dict[str, int] = {}
        for e in batch:
            if e.user not in totals:
                totals[e.user] = await self.unread(e.user)
        for e in batch:
            event: dict[str, Any] = {"type": "offline.msg", "ts": int(time.time() * 1000),
                                     "user": e.user, "mid": e.mid, "from": e.sender,
                                     "conv": e.conv, "preview": preview(e.body),
                                     "unread": totals[e.user]}
            await self.publish("offline.msg", orjson.dumps(event))
            self._queue.popleft()
            self.count("offline.msg", "published")
