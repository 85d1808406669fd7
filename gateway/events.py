"""Events out (docs/protocol.md, Events out): JSON events to the durable topic
exchange ``{IM_NAMESPACE}.events``, persistent and publisher-confirmed, for the
product's own services (its offline-push service binds ``offline.#``).

- ``offline.msg``: per recipient with no device connected to a live node, for
  a 1:1 message and for a message of a write-diffusion group;
- ``offline.group``: one per message of a read-diffusion group (the product
  knows its members; the gateway never walks a big group for it);
- ``presence.online`` / ``presence.offline`` (``gateway.presence.watch``).

A send only queues an entry (never awaits, never fails): a bounded outbox
(``IM_EVENTS_PENDING_MAX``) that one worker drains, a batch of entries' events
pipelined on the channel at a time. The outbox is fair (``core.fairqueue``):
entries are queued by the user who caused them (the sender; the user whose
presence changed), each user's in order and at most
``IM_EVENTS_PENDING_PER_USER`` of them, and users take turns, so one user's
thousands of offline recipients never hold back or crowd out another's. The worker does
the look-ups an event needs off the send path (which members of a group are
offline, each user's unread total just before publishing) and retries with
backoff while the broker or Redis does not answer. A full outbox drops the
newest entry and counts it; delivery is at least once (a publish whose
confirm was lost is sent again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from core.fairqueue import FairQueue
from core.tasks import stop

__all__ = ["EventSources", "Events", "preview"]

log = logging.getLogger("gateway.events")
PREVIEW_CHARS = 100
BATCH = 64
LOOKUPS = 64  # unread totals read at once


def preview(body: bytes) -> str | None:
    """The first 100 characters of a string body, or of a body's string ``text``."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(value, dict):
        value = value.get("text")
    return value[:PREVIEW_CHARS] if isinstance(value, str) else None


class EventSources(Protocol):
    """What the worker reads to complete events (composed in ``gateway.app``)."""

    async def unread(self, user: str) -> int: ...

    async def members(self, group: str) -> list[str]: ...

    async def offline(self, users: Sequence[str]) -> list[str]:
        """Those of ``users`` with no device connected to a live node."""
        ...

    async def platforms(self, users: Sequence[str]) -> dict[str, list[str]]:
        """Each user's connected devices' platforms (on live nodes), one per device."""
        ...

    async def muted(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Those (user, conversation) the user muted."""
        ...

    async def muted_by(self, conv: str) -> list[str]:
        """Who muted a group's conversation (``g:G``)."""
        ...


@dataclass(slots=True)
class _Entry:
    """One outbox entry: the events it makes are found when it reaches the head
    (``users`` of an ``offline.msg`` entry: its recipients, each an event)."""

    kind: str  # offline.msg | offline.group | presence.online | presence.offline
    fields: dict[str, Any]
    id: str = ""  # node name + sequence: the same on every retry (consumers dedupe on it)
    users: list[str] | None = None  # offline.msg: recipients, or None: find (group)
    group: str | None = None
    # a 1:1 offline.msg for a receiver with a device connected: made only if none
    # of its devices is of these platforms (IM_OFFLINE_PUSH_PLATFORMS)
    unless_on: frozenset[str] = frozenset()
    sent: int = 0  # events of this entry already confirmed (a retry goes on from here)
    muted_checked: bool = False  # recipients who muted the conversation left out (once)
    ts: int = field(default_factory=lambda: int(time.time() * 1000))

    @property
    def done(self) -> bool:
        """Every event of the entry confirmed (a group's recipients once found)."""
        if self.kind != "offline.msg":
            return self.sent >= 1
        return self.users is not None and self.sent >= len(self.users)


class Events:
    """The node's outbox of events and its worker."""

    def __init__(self, node: str, publish: Callable[[str, bytes, str], Awaitable[None]],
                 sources: EventSources, wanted: tuple[str, ...], *,
                 pending_max: int = 10_000, pending_per_user: int = 500,
                 count: Callable[[str, str], None] = lambda _type, _outcome: None,
                 push_platforms: frozenset[str] = frozenset()) -> None:
        self.node = node
        # IM_OFFLINE_PUSH_PLATFORMS: offline.msg also for a receiver connected on
        # none of these (a phone to wake while only the desktop is open)
        self.push_platforms = push_platforms
        self.publish = publish  # (routing key, body, event id), confirmed by the broker
        self.sources = sources
        self.wanted = wanted
        self.pending_max = pending_max
        self.count = count
        # by the user who caused them: the sender, or the user whose presence changed
        self._queue: FairQueue[str, _Entry] = FairQueue(pending_max, pending_per_user)
        self._ready = asyncio.Event()
        self._resumed = asyncio.Event()
        self._made = 0
        self._task: asyncio.Task[None] | None = None

    def wants(self, kind: str) -> bool:
        """``IM_EVENTS`` names the type or a prefix of it (``offline`` covers ``offline.msg``)."""
        return any(kind == w or kind.startswith(w + ".") for w in self.wanted)

    @property
    def pending(self) -> int:
        return len(self._queue)

    # -- queueing (never awaits) ---------------------------------------------------
    def offline_msg(self, user: str, mid: int, sender: str, conv: str, body: bytes, *,
                    online: bool = False) -> None:
        """``offline.msg`` for ``user``, who has no device on a live node; or,
        ``online`` and with ``IM_OFFLINE_PUSH_PLATFORMS`` set, who may have none
        of those platforms connected (the worker looks)."""
        if not self.wants("offline.msg") or (online and not self.push_platforms):
            return
        self._put(_Entry("offline.msg", {"mid": mid, "from": sender, "conv": conv,
                                         "preview": preview(body)}, users=[user],
                         unless_on=self.push_platforms if online else frozenset()))

    def group_msg(self, group: str, mid: int, seq: int, sender: str, body: bytes, *,
                  diffused: bool) -> None:
        """A group message: ``offline.msg`` for each offline member of a
        write-diffusion group (found by the worker), or one ``offline.group``."""
        fields = {"mid": mid, "from": sender, "conv": f"g:{group}", "group": group, "seq": seq,
                  "preview": preview(body)}
        if diffused and self.wants("offline.msg"):
            self._put(_Entry("offline.msg", fields, group=group))
        elif not diffused and self.wants("offline.group"):
            self._put(_Entry("offline.group", fields))

    def presence(self, user: str, online: bool, at_ms: int) -> None:
        kind = "presence.online" if online else "presence.offline"
        if self.wants(kind):
            self._put(_Entry(kind, {"user": user}, ts=at_ms))

    def _put(self, entry: _Entry) -> None:
        if not self._queue.put(str(entry.fields.get("from", entry.fields.get("user"))), entry):
            self.count(entry.kind, "dropped")
            return
        self._made += 1
        entry.id = f"{self.node}.{self._made}"
        self._ready.set()

    # -- the worker ------------------------------------------------------------------
    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def resume(self) -> None:
        """The broker link is back: retry now rather than after the backoff."""
        self._resumed.set()

    async def close(self) -> None:
        task, self._task = self._task, None
        await stop(task)  # a cancel lost in redis-py's wait_for is asked again

    async def _run(self) -> None:
        delay = 0.2
        while True:
            await self._ready.wait()
            if not self._queue:
                self._ready.clear()
                continue
            batch = self._queue.batch(BATCH)
            try:
                await self._send(batch)
            except Exception as exc:  # noqa: BLE001 - retried: the broker, or Redis, is down
                log.warning("events not published yet (%d pending): %s", len(self._queue),
                            type(exc).__name__)
                self._resumed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._resumed.wait()
                delay = min(delay * 2, 5.0)
                continue
            delay = 0.2

    async def _send(self, batch: list[_Entry]) -> None:
        """Publish the batch's events at once (pipelined on the channel: the broker
        keeps their order) and let entries leave the outbox, each user's in order,
        once all their events are confirmed; at the first unconfirmed event the
        rest is retried from there (an event confirmed after it is sent again: at
        least once)."""
        try:
            for e in batch:
                if e.users is None and e.group is not None:
                    members = await self.sources.members(e.group)
                    e.users = await self.sources.offline(
                        [u for u in members if u != e.fields["from"]])
            # Which platforms each user of the batch has connected: presence
            # events count devices, offline.msg says them (and one for a user
            # connected on a platform to push to is not made).
            # (An offline.msg made because no device was connected says [] without
            # a look-up: the common case costs nothing more.)
            await self._leave_out_muted(batch)
            asked = {str(e.fields["user"]) for e in batch if e.kind.startswith("presence.")}
            asked.update(e.users[0] for e in batch if e.unless_on and e.users)
            platforms = await self.sources.platforms(sorted(asked)) if asked else {}
            for e in batch:
                if e.unless_on and e.users and e.sent == 0 and \
                        e.unless_on.intersection(platforms.get(e.users[0], ())):
                    e.users = []  # it reached a device it pushes to: no event
            totals = await self._unread({u for e in batch if e.kind == "offline.msg"
                                         for u in e.users or ()})
        except Exception:
            self.count(batch[0].kind, "retried")  # its look-ups could not be done
            raise
        events: list[tuple[_Entry, dict[str, Any], str]] = []
        for e in batch:
            if e.kind.startswith("presence."):
                on = platforms.get(str(e.fields["user"]), [])
                events.append((e, {**e.fields, "devices": len(on),
                                   "platforms": sorted(set(on))}, e.id))
                continue
            if e.kind != "offline.msg":
                events.append((e, e.fields, e.id))
                continue
            users = e.users or []
            for i in range(e.sent, len(users)):
                events.append((e, {"user": users[i], **e.fields, "unread": totals[users[i]],
                                   "platforms": sorted(set(platforms.get(users[i], [])))},
                               e.id if e.group is None else f"{e.id}.{i}"))
        results = await asyncio.gather(*(self._publish(e, fields, event_id)
                                         for e, fields, event_id in events),
                                       return_exceptions=True)
        failed: BaseException | None = None
        for (e, _, _), result in zip(events, results, strict=True):
            if isinstance(result, BaseException):
                failed = result
                self.count(e.kind, "retried")  # the first that failed: its type
                break
            e.sent += 1
        self._queue.remove_done(_done)  # each user's in order, up to its first not confirmed
        if failed is not None:
            raise failed

    async def _leave_out_muted(self, batch: list[_Entry]) -> None:
        """A recipient who muted the conversation gets no ``offline.msg`` (its
        unread still counts); an ``offline.group`` names the group's muters
        (``muted``) for the consumer to leave out. Once per entry, before any
        of its events is sent (a retry keeps its recipients' order)."""
        todo = [e for e in batch if not e.muted_checked and e.sent == 0
                and (e.kind == "offline.group" or (e.kind == "offline.msg" and e.users))]
        if not todo:
            return
        pairs = [(u, str(e.fields["conv"])) for e in todo if e.kind == "offline.msg"
                 for u in e.users or ()]
        muted = await self.sources.muted(pairs) if pairs else set()
        for e in todo:
            if e.kind == "offline.group":
                e.fields["muted"] = await self.sources.muted_by(str(e.fields["conv"]))
            else:
                conv = str(e.fields["conv"])
                kept = [u for u in e.users or () if (u, conv) not in muted]
                for _ in range(len(e.users or ()) - len(kept)):
                    self.count(e.kind, "muted")
                e.users = kept
            e.muted_checked = True

    async def _unread(self, users: set[str]) -> dict[str, int]:
        order = list(users)
        totals: dict[str, int] = {}
        for i in range(0, len(order), LOOKUPS):
            chunk = order[i:i + LOOKUPS]
            for user, n in zip(chunk, await asyncio.gather(
                    *(self.sources.unread(u) for u in chunk)), strict=True):
                totals[user] = n
        return totals

    async def _publish(self, e: _Entry, fields: dict[str, Any], event_id: str) -> None:
        body = orjson.dumps({"type": e.kind, "id": event_id, "ts": e.ts, **fields})
        await self.publish(e.kind, body, event_id)
        self.count(e.kind, "published")


def _done(e: _Entry) -> bool:
    return e.done
