"""Delivery of what was stored: the pushes after an ack, and the replay after a
broker outage. The WebSocket session and the server API both push through
here, so a message sent either way reaches the same devices and raises the
same events.

- ``push_sent`` / ``push_group_sent``: after a 1:1 or group ack, the message
  to every device that should see it (the router writes this node's and
  sends one envelope per other node), and the events for those offline.
- ``Replay``: the broker link came back; pushes may have been lost meanwhile,
  so local users get their offline entries since then again (clients drop
  repeats by mid).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Protocol

import orjson

from core.errors import Unavailable
from core.ids import mid_for_time_ms
from gateway.chat.service import SendResult
from gateway.events import Events
from gateway.groups.service import GroupSendResult
from gateway.hub import Client, Hub
from gateway.metrics import NodeMetrics
from store.ports import OfflineStore

__all__ = ["Pusher", "Replay", "entries_since", "push_group_sent", "push_sent"]

log = logging.getLogger("gateway.delivery")

REPLAY_PAGE = 200  # offline entries read per user and round trip when replaying
REPLAY_MAX = 2000  # per user and replay: an outage longer than that is in sync
LOW_MARK_SAMPLES = 1200  # ten minutes of the low mark, shared every half second


class Pusher(Protocol):
    """``router.Router``, as a session sees it: pushes after an ack."""

    def push(self, user: str, frame: bytes, routes: dict[str, str] | None,
             skip_conn: int | None = None,
             confirms: list[asyncio.Future[None]] | None = None) -> None: ...

    def publish_group(self, group: str, frame: bytes, skip_conn: int | None = None,
                      confirms: list[asyncio.Future[None]] | None = None) -> None: ...

    def live_routes(self, routes: Mapping[str, str] | None, now: float) -> int: ...


def push_sent(pusher: Pusher, events: Events | None, sender: str, to: str, result: SendResult,
              body: bytes, skip_conn: int | None = None,
              confirms: list[asyncio.Future[None]] | None = None) -> None:
    """After a 1:1 ack: the message to the receiver's devices and the sender's
    others (a duplicate's again while recent: ``result.repeat``), and
    ``offline.msg`` when the receiver has no device on a live node (never for a
    duplicate). The WebSocket and the server API share it."""
    if result.frame is None:
        return
    pusher.push(to, result.frame, result.receiver_routes, confirms=confirms)
    pusher.push(sender, result.frame, result.sender_routes, skip_conn=skip_conn,
                confirms=confirms)
    if events is not None and not result.repeat:
        now = time.time()
        online = bool(pusher.live_routes(result.receiver_routes, now))
        events.offline_msg(to, result.mid, sender, sender, body, online=online)


def push_group_sent(pusher: Pusher, events: Events | None, sender: str, group: str,
                    result: GroupSendResult, body: bytes, skip_conn: int | None = None,
                    confirms: list[asyncio.Future[None]] | None = None) -> None:
    """After a group ack: one envelope per node bound to the group (a duplicate's
    again while recent), and the group's events (``offline.msg`` for its offline
    members or one ``offline.group``, found by the events worker, not here;
    never for a duplicate)."""
    if result.frame is None:
        return
    pusher.publish_group(group, result.frame, skip_conn=skip_conn, confirms=confirms)
    if events is not None and not result.repeat:
        events.group_msg(group, result.mid, result.seq, sender, body, diffused=result.diffused)


async def handed_over(confirms: list[asyncio.Future[None]], wait_s: float) -> None:
    """Wait, at most ``wait_s``, for the broker to confirm the envelopes carrying
    a send's pushes, so its ack never precedes their hand-off: a node killed
    in between leaves the sender without an ack, and its resend pushes again.
    A failed or slow publish does not fail the send (it is stored; the router
    sends it again once the broker is back, and replays the gap)."""
    for fut in confirms:  # whatever comes of them, nobody is left unretrieved
        fut.add_done_callback(_retrieve)
    if confirms and wait_s > 0:
        await asyncio.wait(confirms, timeout=wait_s)


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


async def entries_since(offline: OfflineStore, users: list[str], since: int
                        ) -> list[list[bytes]]:
    """Each user's offline entries after ``since``, oldest first: pages of
    ``REPLAY_PAGE``, a user with a full page read on (an outage of a few seconds
    can hold more than a page), up to ``REPLAY_MAX`` each (past that the device
    has the rest by sync)."""
    out = await offline.recent(users, since, REPLAY_PAGE)
    for user, rows in zip(users, out, strict=True):
        page = rows
        while len(page) == REPLAY_PAGE and len(rows) < REPLAY_MAX:
            last = int(orjson.loads(page[-1])["mid"])
            [page] = await offline.recent([user], last, REPLAY_PAGE)
            rows.extend(page)
    return out


class Replay:
    """Pushes that may have been lost, again from the offline store (clients drop
    repeats by mid): after a broker outage, to every local user; after a device's
    registration completed late (Redis was down when it connected), to that
    device."""

    def __init__(self, hub: Hub, offline: OfflineStore, metrics: NodeMetrics) -> None:
        self.hub = hub
        self.offline = offline
        self.metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()
        # The sync low mark (the oldest mid in flight on any node), sampled each
        # time the nodes share it: a message published during an outage may
        # carry a mid issued long before it (a slow store, a resend keeping its
        # first attempt's mid), below a replay window of wall time alone.
        self.low_mark: Callable[[], int | None] = lambda: None
        self._lows: deque[tuple[float, int]] = deque(maxlen=LOW_MARK_SAMPLES)

    def note_low_mark(self, now: float) -> None:
        """Sample the low mark (every time the nodes share it)."""
        low = self.low_mark()
        if low is not None:
            self._lows.append((now, low))

    def _since(self, at: float) -> int:
        """The replay's start for pushes lost from ``at`` (unix s) on: two
        seconds before it, or the oldest mid in flight since then if older."""
        lows = [m for t, m in self._lows if t >= at - 2.0]
        now = self.low_mark()
        if now is not None:
            lows.append(now)
        return min([mid_for_time_ms(int((at - 2.0) * 1000)), *(m - 1 for m in lows)])

    def resumed(self, lost_at: float, why: str = "broker outage") -> None:
        """Pushes since ``lost_at`` may have gone nowhere: the broker link is back
        (``Router.when_resumed``), or Redis lost the routes and they are written
        again (``why`` says which, in the log)."""
        since = self._since(lost_at)
        task = asyncio.create_task(self._replay(list(self.hub.users), since, why))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def registered_late(self, client: Client, connected_at: float) -> None:
        """``client`` gets pushes from now on; what came for it between its
        connect and now (1:1 and write-diffused group messages) comes again."""
        since = self._since(connected_at)
        task = asyncio.create_task(self._replay_one(client, since))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replay_one(self, client: Client, since: int) -> None:
        try:
            [rows] = await entries_since(self.offline, [client.user], since)
        except Unavailable as exc:
            log.warning("replay to a late-registered device failed: %s", exc)
            return
        for frame in rows:
            self.hub.write_each((client,), frame)

    async def _replay(self, users: list[str], since: int, why: str) -> None:
        sent = 0
        for i in range(0, len(users), 500):
            chunk = users[i:i + 500]
            try:
                frames = await entries_since(self.offline, chunk, since)
            except Unavailable as exc:
                log.warning("replay after %s failed: %s", why, exc)
                return
            for user, rows in zip(chunk, frames, strict=True):
                for frame in rows:
                    sent += self.hub.deliver_to_user(user, frame, None)
        self.metrics.replays.inc()
        log.info("replay after %s: %d push(es) again to %d local user(s)", why, sent, len(users))

    async def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
