"""The asyncio client: a ``Connection`` at a time, kept up, on the sans-I/O core.

``Client`` connects to one of ``urls`` with a token, and from then on keeps a
connection up: on a lost connection it reconnects (the next URL, jittered
backoff), on close 4001 it asks ``get_token`` for a new token first, on a
``reconnect`` frame or close 1001 it moves to the next URL at once, on close
4003 (or a 403 handshake) it stops. After every (re)connect it writes the sends
still in flight again (same ``cmid``: the node answers the original ``mid``),
resubscribes presence, rejoins its rooms with ``since`` (``RoomRejoined`` says
whether anything was missed), and syncs from its cursor over HTTP, delivering
each stored message once (dedup by ``mid``). Received messages are
acknowledged with ``recv_ack`` in batches. Events go to one callback,
``on_event`` (``imgate_client.events``; ``EventQueue`` makes it an async
iterator).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from websockets.exceptions import InvalidHandshake, InvalidStatus, InvalidURI

from imgate_client.connection import Connection, Disconnected
from imgate_client.core import (
    MESSAGE_OPS,
    MESSAGE_UPDATE_OPS,
    AckBatcher,
    Action,
    Frame,
    Inbox,
    Outbox,
    ReconnectPolicy,
    Rooms,
    token_expiry,
    token_user,
)
from imgate_client.errors import Ack, ClientStopped, SendTimeout, ServerError
from imgate_client.events import (
    Connected,
    ConnectionLost,
    Event,
    Message,
    Push,
    Stopped,
)
from imgate_client.http import HttpClient, HttpError
from imgate_client.ops import Ops
from imgate_client.rooming import Rooming
from imgate_client.sending import Sending
from imgate_client.syncing import Syncing

__all__ = ["Ack", "Client", "ClientStopped", "SendTimeout", "ServerError"]

log = logging.getLogger("imgate_client")

TokenSource = Callable[[], Awaitable[str]]
TOKEN_MIN_LEFT_S = 1.0  # a token closer than this to its exp is renewed before a connect


def _resolver(fut: asyncio.Future[None]) -> Callable[[Any], None]:
    def resolve(_: Any) -> None:
        if not fut.done():
            fut.set_result(None)
    return resolve


class Client(Rooming, Ops, Syncing, Sending):
    """One user's connection to a cluster, kept up (see the module docstring)."""

    def __init__(self, urls: Sequence[str], *, http_urls: Sequence[str] = (),
                 token: str | None = None, get_token: TokenSource | None = None,
                 on_event: Callable[[Event], None] | None = None, since: int = 0,
                 sync_on_connect: bool = True, sync_limit: int = 200,
                 request_timeout: float = 10.0, ack_timeout: float = 10.0,
                 send_timeout: float = 60.0, refresh_ahead: float | None = 60.0,
                 ack_batch: int = 100, ack_delay: float = 0.2, dedup_window: int = 10_000,
                 drain_grace: float = 5.0, policy: ReconnectPolicy | None = None,
                 rng: random.Random | None = None, http_timeout: float = 10.0,
                 connect_kw: dict[str, Any] | None = None,
                 next_url: Callable[[int], int] | None = None,
                 room_recover_jumps: bool = True, room_recover_interval: float = 2.0,
                 device: str | None = None, platform: str | None = None) -> None:
        if not urls:
            raise ValueError("at least one ws:// URL")
        if token is None and get_token is None:
            raise ValueError("a token or a get_token callback")
        # device / platform: the login policy's slot (?device=&platform= on every
        # handshake); a close 4005 ("replaced") stops the client.
        extra = urlencode({k: v for k, v in (("device", device), ("platform", platform)) if v})
        self.urls = [f"{u}{'&' if '?' in u else '?'}{extra}" if extra else u for u in urls]
        self.http_urls = list(http_urls)
        self.get_token, self.on_event = get_token, on_event
        self.sync_on_connect, self.sync_limit = sync_on_connect, sync_limit
        self.request_timeout, self.send_timeout = request_timeout, send_timeout
        self.refresh_ahead, self.drain_grace = refresh_ahead, drain_grace
        self.connect_kw = connect_kw or {}
        self.next_url = next_url  # index of the URL left -> index of the next (default +1)
        self.rng = rng or random.Random()
        self.policy = policy or ReconnectPolicy(rng=self.rng)
        self.outbox = Outbox(ack_timeout=ack_timeout, rng=self.rng)
        self.inbox = Inbox(since, window=dedup_window)
        self.acks = AckBatcher(ack_batch, ack_delay)
        # Gaps in a room's positions: recovered with a join since the last contiguous
        # one (a jump automatically, unless off; at most one per room_recover_interval s).
        self.rooms = Rooms(recover_jumps=room_recover_jumps,
                           recover_interval=room_recover_interval)
        self.presence: set[str] = set()  # users watched (resubscribed after a reconnect)
        self.stopped: Stopped | None = None
        self.connects = 0  # connections opened
        self._token = token
        self._need_token = token is None
        self._url_index = 0
        self._gen = 0
        self._conn: Connection | None = None
        self._ready = asyncio.Event()  # _conn takes frames
        self._moving = False  # the node said reconnect
        self._waiters: dict[str, asyncio.Future[Ack]] = {}
        self._first: asyncio.Future[None] | None = None
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._run_task: asyncio.Task[None] | None = None
        self._ack_timer: asyncio.TimerHandle | None = None
        self._sync_lock = asyncio.Lock()
        self._http: dict[str, HttpClient] = {}
        self._http_timeout = http_timeout

    # -- state -------------------------------------------------------------------
    @property
    def user(self) -> str | None:
        return token_user(self._token) if self._token else None

    @property
    def token(self) -> str | None:
        return self._token

    @property
    def connection(self) -> Connection | None:
        """The current low-level connection (None between connections)."""
        return self._conn

    @property
    def connected(self) -> bool:
        return self._ready.is_set()

    def _writable(self) -> Connection | None:
        return self._conn if self._ready.is_set() else None

    @property
    def url(self) -> str:
        return self.urls[self._url_index % len(self.urls)]

    @property
    def cursor(self) -> int:
        """The sync cursor: every message up to this mid was delivered (keep it to
        start a later client with ``since=``)."""
        return self.inbox.cursor

    # -- lifecycle -----------------------------------------------------------------
    async def connect(self, timeout: float = 30) -> None:
        """Until the first connection is up and synced; ClientStopped if it stops
        first, TimeoutError after ``timeout`` (it keeps trying: ``close()`` ends it)."""
        if self.stopped is not None:
            raise ClientStopped(self.stopped.reason)
        if self._run_task is None:
            self._first = asyncio.get_running_loop().create_future()
            self._run_task = asyncio.create_task(self._run())
            self._spawn(self._ticker())
        assert self._first is not None
        await asyncio.wait_for(asyncio.shield(self._first), timeout)

    async def close(self) -> None:
        """Stop: pending acks flushed (best effort), the connection closed (1000),
        pending sends failed with ClientStopped. Idempotent."""
        if self.stopped is None:
            conn = self._conn if self._ready.is_set() else None
            if conn is not None:
                with contextlib.suppress(Disconnected, TimeoutError):
                    await asyncio.wait_for(self._flush_acks(conn), 1)
            self._stop(1000, "closed by the client")
        # Cancelled again until done: a task can miss one cancellation (an
        # application's get_token that catches it; asyncio.wait_for on 3.11, when
        # its inner future completes at the moment it is cancelled), and each of
        # our loops ends once ``stopped`` is set.
        pending = {t for t in [self._run_task, *self._tasks] if t is not None}
        while pending:
            for t in pending:
                t.cancel()
            _, pending = await asyncio.wait(pending, timeout=1.0)
        if self._conn is not None:
            await self._conn.close()
        for h in self._http.values():
            await h.close()

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _stop(self, code: int | None, reason: str) -> None:
        if self.stopped is not None:
            return
        self.stopped = Stopped(code, reason)
        self._ready.clear()
        err = ClientStopped(reason)
        for fut in self._waiters.values():
            if not fut.done():
                fut.set_exception(err)
        self._waiters.clear()
        if self._first is not None and not self._first.done():
            self._first.set_exception(err)
            self._first.exception()  # retrieved: connect() raises it when awaited
        if self._ack_timer is not None:
            self._ack_timer.cancel()
        self._emit(self.stopped)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _emit(self, event: Event) -> None:
        if self.on_event is None:
            return
        try:
            self.on_event(event)
        except Exception:  # an application's bug must not stop the client
            log.exception("on_event raised")

    # -- connecting ------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self.stopped is None:
            url, code, reason, opened, unanswered = self.url, None, "", False, 0
            try:
                token = await self._token_for_connect()
                closed: asyncio.Future[None] = loop.create_future()
                conn = await Connection.open(url, token, on_push=self._on_frame,
                                             on_close=_resolver(closed), **self.connect_kw)
            except InvalidStatus as exc:
                decision = self.policy.on_refused(exc.response.status_code)
                reason = f"handshake refused: {exc.response.status_code}"
            except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
                decision = self.policy.on_refused(None)
                reason = f"cannot connect: {exc!r}"
            except Exception as exc:  # get_token failed: try again later
                decision = self.policy.on_refused(None)
                reason = f"get_token failed: {exc!r}"
            else:
                self.policy.on_open(loop.time())
                self.connects += 1
                opened = True
                try:
                    await self._setup(conn, url)
                except Exception:  # a bug of ours or a reply we did not foresee:
                    log.exception("setting up the connection failed")  # a new one
                    await conn.close(1011, "client setup failed")
                await closed
                self._lost(conn)
                unanswered = self.outbox.unanswered(self._gen)
                code, reason = conn.close_code, conn.close_reason or ""
                decision = self.policy.on_close(code, loop.time(), self._moving)
            self._emit(ConnectionLost(url, code, reason, decision.action.value,
                                      decision.delay, opened, unanswered))
            if decision.action is Action.STOP:
                self._stop(code, decision.reason)
                return
            if decision.action is Action.REFRESH:
                if self.get_token is None:
                    self._stop(code, f"{decision.reason}, and no get_token to renew it")
                    return
                self._need_token = True
            else:
                self._url_index = self._next_index()
            await asyncio.sleep(decision.delay)

    def _next_index(self) -> int:
        """The URL to try next: ``next_url`` of the current index (kept in range; the
        next in order if it raises), else the next in order."""
        if self.next_url is not None:
            try:
                return self.next_url(self._url_index % len(self.urls)) % len(self.urls)
            except Exception:
                log.exception("next_url raised")
        return self._url_index + 1

    async def _token_for_connect(self) -> str:
        exp = token_expiry(self._token) if self._token else None
        stale = exp is not None and exp - time.time() < TOKEN_MIN_LEFT_S
        if self.get_token is not None and (self._need_token or self._token is None or stale):
            self._token = await self.get_token()
            self._need_token = False
        assert self._token is not None
        return self._token

    async def _setup(self, conn: Connection, url: str) -> None:
        """A new connection: sends go out again, presence and rooms come back, sync."""
        reconnect = self.connects > 1
        self._gen += 1
        self._conn, self._moving = conn, False
        syncing = self.sync_on_connect and bool(self.http_urls)
        if syncing:
            self.inbox.begin_sync()  # pushes wait for the older messages of the sync
        self._ready.set()
        self._wake.set()  # the ticker writes the sends in flight
        registered = True
        try:
            if syncing:
                # The node reads a connection's frames only once the device is
                # registered (its route written, its groups loaded): a message
                # acked after this answer is pushed to it, one acked before is
                # in the sync. Syncing earlier could miss one acked in between.
                try:
                    await conn.request("ping", self.request_timeout)
                except TimeoutError:
                    # Registration is slow (a store is): sync now all the same,
                    # and again once the node answers (``_sync_once_registered``).
                    registered = False
            watched = sorted(self.presence)
            for i in range(0, len(watched), 500):
                r = await conn.request("presence_sub", self.request_timeout,
                                       users=watched[i:i + 500])
                if r.get("op") == "presence":
                    self._emit(Push("presence", r))
            for st in self.rooms:
                await self._rejoin(conn, st.room)
        except Disconnected:
            if syncing:
                self._release_held()
            return
        except TimeoutError:
            # Presence or a room did not answer in time; the connection is open,
            # so it is not left without its sync (it would miss what came while away).
            pass
        synced = 0
        if syncing:
            synced = await self._sync_after_connect()
            if not registered and not conn.closed:
                self._spawn(self._sync_once_registered(conn, self._gen))
        if self.acks:
            with contextlib.suppress(Disconnected):
                await self._flush_acks(conn)
        if self.refresh_ahead is not None and self.get_token is not None:
            self._spawn(self._refresher(conn))
        if not conn.closed:
            self._emit(Connected(url, reconnect, synced))
            if self._first is not None and not self._first.done():
                self._first.set_result(None)

    def _lost(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
            self._ready.clear()
        if self.inbox.syncing and not self._sync_lock.locked():
            self._release_held()

    async def _refresher(self, conn: Connection) -> None:
        """Before the token expires: a new one from ``get_token``, sent as ``refresh``."""
        assert self.get_token is not None and self.refresh_ahead is not None
        while self.stopped is None and not conn.closed and self._token is not None:
            exp = token_expiry(self._token)
            if exp is None:
                return
            left = exp - time.time()
            await asyncio.sleep(max(left - self.refresh_ahead, left / 2, 0.0))
            if conn.closed or self.stopped is not None:
                return
            try:
                token = await self.get_token()
                r = await conn.request("refresh", self.request_timeout, token=token)
            except Disconnected:
                return
            except Exception:  # 4001 comes, and the reconnect asks get_token again
                log.warning("token refresh failed", exc_info=True)
                return
            if r.get("op") != "ok":
                log.warning("refresh refused: %s", r)
                return
            self._token = token

    def _on_moving(self, conn: Connection) -> None:
        """A ``reconnect`` frame: no new frames here; the node closes with 1001 once
        its sends in flight are answered (or we do, after ``drain_grace``)."""
        self._moving = True
        if self._conn is conn:
            self._ready.clear()

        async def close_later() -> None:
            await asyncio.sleep(self.drain_grace)
            if not conn.closed:
                conn.abort()

        self._spawn(close_later())

    # -- frames from the node ------------------------------------------------------------
    def _on_frame(self, f: Frame) -> None:
        op = f.get("op")
        if f.get("re") is not None:
            self._on_send_reply(f)
            return
        if op in MESSAGE_OPS:
            out = self.inbox.push(f)
            if out is not None:
                self._deliver(out, "push")
            if self.inbox.wants_sync and self.http_urls and not self._sync_lock.locked():
                self._spawn(self._background_sync())
        elif op in ("room_msgs", "room_gap"):
            got = self.rooms.on_push(f, self._now())
            if got is not None:
                self._room_items(got.room, got.items, got.recover, "live")
        elif op == "reconnect":
            if self._conn is not None:
                self._on_moving(self._conn)
        elif op in MESSAGE_UPDATE_OPS:
            # Held during a sync (told after it, behind its messages); an edit or a
            # recall told already (the message delivered had it) is not told again.
            if not self.inbox.hold(f) and self.inbox.update(f):
                self._emit(Push(str(op), f))
        else:
            if op == "left" and f.get("reason") == "kicked":
                self.rooms.forget(str(f.get("room")))
            self._emit(Push(str(op), f))

    def _deliver(self, f: Frame, via: str) -> None:
        self._emit(Message(f, via))
        if self.acks.add(f["mid"]):
            self._spawn(self._flush_acks())
        elif self._ack_timer is None:
            self._ack_timer = asyncio.get_running_loop().call_later(
                self.acks.delay, self._ack_due)

    def _ack_due(self) -> None:
        self._ack_timer = None
        if self.acks:
            self._spawn(self._flush_acks())

    async def _flush_acks(self, conn: Connection | None = None) -> None:
        conn = conn or (self._conn if self._ready.is_set() else None)
        if conn is None:
            return  # flushed after the next connect
        while (frame := self.acks.frame()) is not None:
            try:
                await conn.send(frame)
            except Disconnected:
                # The connection went: those mids stay in the offline store, come
                # again with the sync on the next connect and are acked then.
                return

    # -- requests ------------------------------------------------------------------------------
    async def _wait_ready(self, deadline: float) -> Connection:
        loop = asyncio.get_running_loop()
        while True:
            if self.stopped is not None:
                raise ClientStopped(self.stopped.reason)
            if self._ready.is_set() and self._conn is not None:
                return self._conn
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError("not connected")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), min(left, 1.0))

    async def request(self, op: str, *, retry: bool = False, timeout: float | None = None,
                      **fields: Any) -> Frame:
        """Any op, on the connection up (waiting for one); the reply. ServerError for an
        ``error`` reply; ``retry``: the op is idempotent, so it is asked again on the next
        connection if this one is lost first (and after ``unavailable``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.request_timeout if timeout is None else timeout)
        while True:
            conn = await self._wait_ready(deadline)
            try:
                reply = await conn.request(op, max(0.01, deadline - loop.time()), **fields)
            except Disconnected:
                if not retry:
                    raise
                if self._conn is conn:
                    # Closed, and its reader has not said so yet: let it run (a bare
                    # `continue` would take this same connection again without
                    # ever yielding, and spin the event loop).
                    await asyncio.sleep(0.05)
                continue
            if reply.get("op") == "error":
                if retry and reply.get("code") == "unavailable" and deadline - loop.time() > 0.5:
                    await asyncio.sleep(0.5)
                    continue
                raise ServerError(reply)
            return reply

    # -- HTTP -------------------------------------------------------------------------------
    def _http_client(self, base: str) -> HttpClient:
        h = self._http.get(base)
        if h is None:
            h = self._http[base] = HttpClient(base, timeout=self._http_timeout)
        return h

    async def http(self, method: str, path: str, *, json: Any = None,
                   params: dict[str, Any] | None = None) -> Any:
        """A call of the node's HTTP API as the user (``http_urls``: the node of the
        current connection first, then the others); the decoded answer. HttpError for
        an answer other than 2xx (after one token renewal on a 401)."""
        if not self.http_urls:
            raise ValueError("no http_urls given")
        n = len(self.http_urls)
        first = self._url_index % n
        renewed = False
        for i in range(n):
            base = self.http_urls[(first + i) % n]
            while True:
                token = self._token or await self._token_for_connect()
                try:
                    return await self._http_client(base).json(
                        method, path, json=json, params=params,
                        headers={"Authorization": f"Bearer {token}"})
                except HttpError as exc:
                    if exc.status == 401 and self.get_token is not None and not renewed:
                        renewed, self._need_token = True, True
                        await self._token_for_connect()
                        continue
                    raise
                except (OSError, TimeoutError):
                    if i == n - 1:
                        raise
                    break
        raise AssertionError("unreachable")
