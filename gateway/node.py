"""A gateway node's lifecycle: one process serving WebSocket and HTTP.

Start-up opens the stores and checks each dependency (one clear line if one
cannot be reached), leases a node number, has ``gateway.app.compose`` build
everything else, then listens and keeps the heartbeat. ``drain`` is the
graceful stop: refuse new connections, tell clients to ``reconnect``, close
them with 1001, finish in-flight sends, release the lease. Nothing imports
this module but the entry point (and tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from starlette.types import ASGIApp
from websockets.asyncio.server import Server, serve

from core.errors import Unavailable
from core.ids import mid_for_time_ms
from core.inflight import SHARE_S
from gateway import frames, wire
from gateway.app import App, Step, compose
from gateway.chat.dead_sends import CLAIM_TTL_S, DeadSends
from gateway.config import Settings
from gateway.frames import conversation_last, encode_group
from gateway.http.api import build_metrics_http
from gateway.http.guard import TimedH11Protocol
from gateway.metrics import NodeMetrics
from router.amqp_urls import mask_password
from store import Stores, open_stores
from store.ports import LeaseKeeper, NodeLease
from store.records import Beat, InboxLimits

__all__ = ["Node", "StartupError"]

log = logging.getLogger("gateway.node")
REWRITE_RETRY_S = 0.25  # routes lost with Redis: the rewrite is tried again this often


class StartupError(Exception):
    """A dependency could not be reached at start-up; the message says which."""


class _HttpServer(uvicorn.Server):
    """uvicorn inside our loop: signals belong to the node, not to uvicorn; and
    it wakes once a second (its Date header's resolution), not ten times a
    second to look for a stop: the node says when to stop (``stop``). An idle
    node's wake-ups are its CPU at rest, two servers' worth here."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._stopping = asyncio.Event()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def stop(self) -> None:
        self.should_exit = True
        self._stopping.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):
            counter = (counter + 10) % 864_000  # (``on_tick``'s once-a-second work)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await self._stopping.wait()


class Node:
    """Listeners, lease, heartbeat, housekeeping timers, drain and close."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = NodeMetrics()
        self.draining = False
        self.name = ""
        self.ws_port = 0
        self.http_port = 0
        s = settings
        self.stores: Stores = open_stores(
            redis_url=s.redis_url, redis_cluster=bool(s.redis_cluster), mongo_url=s.mongo_url,
            namespace=s.namespace, timeout_s=s.dep_timeout_s, lease_ttl_s=int(s.heartbeat_ttl_s),
            heartbeat_ttl_s=s.heartbeat_ttl_s,
            limits=InboxLimits(offline_max=s.offline_max, offline_ttl_s=s.offline_ttl_s,
                               unread_cap=s.unread_cap, dedup_ttl_s=s.dedup_ttl_s,
                               user_key_ttl_s=s.user_key_ttl_s),
            encode_group_last=encode_group, encode_conv_last=conversation_last,
            mongo_w=s.mongo_w, reaction_shards=s.reaction_shards,
            observe_mongo=self.metrics.observe_store_command,
            room_history=(s.room_history, s.room_history_ttl_s))
        self.lease: NodeLease = self.stores.lease
        self._keeper: LeaseKeeper | None = None
        self._held_at = 0.0  # monotonic time the lease was last confirmed
        self._beat_ok_at = time.time()  # unix time (the keeper's) of the last beat Redis answered
        self._routes_lost_after: float | None = None  # set while routes are to be rewritten
        self._beat_failed = False  # a beat failed since the last one Redis answered
        self._dead_marks: list[str] = []  # dead nodes' in-flight entries, dropped next time
        self._dead_sends = DeadSends(
            self._redeliver,
            lambda dead: self.stores.nodes.claim_dead(dead, self.name, CLAIM_TTL_S),
            release=lambda dead: self.stores.nodes.release_dead(dead, self.name),
            forget=self.stores.nodes.forget_marks)
        self._app: App | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._ws_server: Server | None = None
        self._http: _HttpServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self.metrics_port = -1  # the /metrics listener's port; -1: none
        self._metrics_http: _HttpServer | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def app(self) -> App:
        """The composed services (once ``start`` has leased a number)."""
        if self._app is None:
            raise RuntimeError("the node is not started")
        return self._app

    # -- start ---------------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        await self._check_dependencies()
        number = await self._acquire_lease()
        # The name routes traffic; it changes with every start, so routes left
        # by this node's previous life never reach the new one.
        self.name = f"n{number}-{self.lease.token[:6]}"
        self._app = app = compose(s, self.stores, self.metrics, name=self.name, number=number,
                                  draining=lambda: self.draining, healthy=self.healthy,
                                  ws_port=lambda: self.ws_port)
        try:
            await app.start()
        except ValueError as exc:  # IM_AMQP_URL itself is malformed (router.amqp_urls)
            raise StartupError(str(exc)) from None
        except Exception:
            raise StartupError(f"cannot reach RabbitMQ at {_safe_url(s.amqp_url)}") from None
        self._keeper = self.stores.keeper(self.name, number, s.heartbeat_s)
        self._held_at = time.monotonic()
        await self.beat()  # learn the live nodes before routing anything
        loop = asyncio.get_running_loop()

        def report(result: Beat | Unavailable) -> None:  # on the keeper's thread
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._on_beat, result)

        self._keeper.start(report)
        try:
            await self._listen(app)
        except StartupError:  # a port in use: what started is stopped, then one line
            await self.close()
            raise
        self._tasks.append(asyncio.create_task(self._every("room housekeeping",
                                                           s.room_report_s, app.tick)))
        # Every half second: a send in flight longer than that (and than the
        # sync settle time, 1 s by default) holds every node's sync cursors.
        self._tasks.append(asyncio.create_task(self._every(
            "sharing sends in flight", min(s.heartbeat_s, SHARE_S),
            self._share_inflight)))
        self._tasks.append(asyncio.create_task(self._watch_lag()))
        log.info("node %s serving ws=%s:%d http=%s:%d metrics=%s namespace=%s fan-out=%s",
                 self.name, s.host, self.ws_port, s.host, self.http_port,
                 f"{s.metrics_host}:{self.metrics_port}" if self.metrics_port >= 0 else "off",
                 s.namespace, wire.FANOUT)

    async def _check_dependencies(self) -> None:
        """Redis and MongoDB answer, and the store's indexes exist.

        Each is tried again (every half second, a line logged per failure)
        until ``IM_STARTUP_WAIT_S`` has passed: a store that is still starting,
        or too busy to answer within one ``IM_DEP_TIMEOUT_S``, is waited for;
        one that stays away ends the start with a one-line error.
        """
        s = self.settings
        await self._wait_for("Redis", s.redis_url, self.stores.check_redis)

        async def mongo() -> None:
            await self.stores.check_mongo()
            await self.stores.prepare()

        await self._wait_for("MongoDB", s.mongo_url, mongo)

    async def _wait_for(self, what: str, url: str,
                        check: Callable[[], Awaitable[None]]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.startup_wait_s
        while True:
            try:
                await check()
                return
            except Unavailable as exc:
                if loop.time() >= deadline:
                    raise StartupError(f"cannot reach {what} at {_safe_url(url)}") from None
                log.warning("waiting for %s at %s (%s)", what, _safe_url(url), exc)
                await asyncio.sleep(0.5)

    async def _acquire_lease(self) -> int:
        wanted = self.settings.node_id
        deadline = asyncio.get_running_loop().time() + self.settings.heartbeat_ttl_s + 1
        while True:
            try:
                return await self.lease.acquire(wanted)
            except Unavailable as exc:
                # A configured id still leased by this node's previous life: wait it out.
                if wanted < 0 or asyncio.get_running_loop().time() > deadline:
                    raise StartupError(str(exc)) from None
                await asyncio.sleep(0.5)

    async def _listen(self, app: App) -> None:
        s = self.settings
        with _listening(s.host, s.ws_port, "IM_WS_PORT"):
            self._ws_server = await serve(
                app.sessions.handle, s.host, s.ws_port, reuse_port=bool(s.reuse_port),
                process_request=app.sessions.process_request,
                # Keepalive pings are the node's (gateway.ws.keepalive): no task
                # and timer per connection.
                max_size=s.max_frame, compression=None, ping_interval=None,
                close_timeout=2, backlog=s.listen_backlog,
                create_connection=wire.NodeConnection,  # pongs read without the parser
            )
        self.ws_port = self._ws_server.sockets[0].getsockname()[1]
        with _listening(s.host, s.http_port, "IM_HTTP_PORT"):
            sock = socket.create_server((s.host, s.http_port), reuse_port=bool(s.reuse_port))
        self.http_port = sock.getsockname()[1]
        self._http = self._http_server(app.http)
        # The socket already listens, so clients can connect before uvicorn is up.
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))
        if s.metrics_port >= 0:  # /metrics apart from the API (IM_METRICS_HOST/PORT)
            with _listening(s.metrics_host, s.metrics_port, "IM_METRICS_PORT"):
                msock = socket.create_server((s.metrics_host, s.metrics_port),
                                             reuse_port=False)
            self.metrics_port = msock.getsockname()[1]
            self._metrics_http = self._http_server(build_metrics_http(self.metrics))
            self._metrics_task = asyncio.create_task(self._metrics_http.serve(sockets=[msock]))

    def _http_server(self, asgi: ASGIApp) -> _HttpServer:
        """uvicorn on h11 with header and body deadlines (``gateway.http.guard``)."""
        s = self.settings
        protocol = TimedH11Protocol.with_deadlines(
            s.http_header_timeout_s, s.http_body_timeout_s,
            lambda phase: self.metrics.closed.labels(f"http_{phase}_timeout").inc())
        return _HttpServer(uvicorn.Config(
            # "error": not a line per malformed request a client sends
            asgi, log_level="error", access_log=False, lifespan="off", loop="none",
            http=protocol, ws="none", server_header=False))

    # -- running -------------------------------------------------------------
    @staticmethod
    async def _every(name: str, period_s: float, work: Callable[[], Awaitable[None]]) -> None:
        """Run ``work`` every ``period_s``; a failed run is logged and retried next."""
        while True:
            await asyncio.sleep(period_s)
            try:
                await work()
            except Unavailable as exc:
                log.warning("%s failed: %s", name, exc)
            except Exception:  # keep ticking: a failed run is retried by the next
                log.exception("%s failed", name)

    async def _watch_lag(self, period_s: float = 0.1) -> None:
        """``im_loop_lag_seconds``: how late a timer fires. time.monotonic(), not
        loop.time(): uvloop's clock is read once per loop turn."""
        lag = self.metrics.loop_lag
        while True:
            t = time.monotonic()
            await asyncio.sleep(period_s)
            lag.observe(max(0.0, time.monotonic() - t - period_s))

    async def beat(self) -> None:
        """One lease renewal and heartbeat now (the keeper's thread does this
        every ``IM_HEARTBEAT_S`` on its own; tests call it to be exact)."""
        keeper = self._keeper
        if keeper is None:
            raise RuntimeError("the node is not started")
        self._on_beat(await asyncio.to_thread(keeper.beat_once))

    def _on_beat(self, result: Beat | Unavailable) -> None:
        """Apply one beat of the ``LeaseKeeper`` (on the loop).

        A lease another node holds now, or one not confirmed for most of its
        ttl, stops the minting of mids until it is held again. A lease that
        had vanished (or, on a Redis Cluster, a canary: ``Beat.lost``) means
        Redis lost its data (flush, failover, a master restarted): the routes of
        every local connection are written again, then what came for them since
        the last beat before the loss is pushed again (a 1:1 push sent while
        their routes were gone reached no other node).
        """
        app = self.app
        now = time.monotonic()
        if isinstance(result, Unavailable):
            self.metrics.beats.labels("unavailable").inc()
            self._beat_failed = True
            log.warning("heartbeat failed: %s", result)
            if now - self._held_at > 0.8 * self.settings.heartbeat_ttl_s:
                app.mids.hold(False)
            return
        self.metrics.beats.labels("held" if result.held else "lost").inc()
        # The keeper's time of the beat, not the loop's: a loop that applies
        # beats late (busy for seconds) did not let the heartbeat lapse, since
        # the thread wrote it on time, and must not replay what it pushed.
        ok_before = self._beat_ok_at
        self._beat_ok_at = max(ok_before, result.read_at or time.time())
        if result.held:
            self._held_at = now
        elif app.mids.held:
            log.error("node id lease held by another node: minting stopped")
        app.mids.hold(result.held)
        app.beat(result.live, result.read_at)
        # A beat so late that this node's heartbeat lapsed (Redis was out of
        # reach, or the process stalled): other nodes may have read it lapsed,
        # dropped pushes to it and purged its routes until they see this beat.
        gap, s = self._beat_ok_at - ok_before, self.settings
        lapsed = gap > s.heartbeat_ttl_s and (self._beat_failed or gap > 2 * s.heartbeat_s)
        self._beat_failed = False
        if (result.retaken or result.lost or lapsed) and self._routes_lost_after is None:
            self._routes_lost_after = ok_before
            # Every other node reads the heartbeats again within its beat period.
            again_after = min(1.5 * s.heartbeat_s, s.heartbeat_ttl_s) if lapsed else 0.0
            self._tasks.append(asyncio.create_task(self._rewrite(app, again_after)))

    async def _rewrite(self, app: App, again_after: float = 0.0) -> None:
        """Every local route written again, tried every ``REWRITE_RETRY_S`` until
        it is done (the first command on a connection Redis dropped fails), then
        the replay. A node whose routes are not back is deaf to other nodes.

        After a lapse of this node's heartbeat, once more ``again_after`` s later,
        when every other node has read this node's beats again (a route they
        purged meanwhile is back), and only then the replay: it covers the
        pushes they dropped meanwhile too."""
        why = "this node's heartbeat lapsed" if again_after > 0 else "Redis lost the routes"
        if again_after > 0:
            with contextlib.suppress(Unavailable):
                await app.registry.rewrite(why)
            await asyncio.sleep(again_after)
        failures = 0
        while (lost_after := self._routes_lost_after) is not None:
            try:
                await app.registry.rewrite(why)
            except Unavailable as exc:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("rewriting routes failed (%d time(s), trying again every "
                                "%.2f s): %s", failures, REWRITE_RETRY_S, exc)
                await asyncio.sleep(REWRITE_RETRY_S)
                continue
            self._routes_lost_after = None
            app.replay.resumed(lost_after, why)
            app.live.rewrite_counts()

    async def _redeliver(self, node_id: int, low: int, high: int) -> int:
        """What a dead node stored from its in-flight mark on: 1:1, then group."""
        app = self.app
        return (await app.chat.redeliver(node_id, low, high)
                + await app.groups.redeliver(node_id, low, high))

    async def _share_inflight(self) -> None:
        """This node's oldest mid in flight to the others, theirs here (the live
        ones: a dead node's sends died with it, and its entry is dropped)."""
        app = self.app
        # Nothing in flight: the mark is now, below every mid a send begun
        # before the next share takes. Were it left out, a send begun in
        # between by a node then killed (stored in MongoDB, not yet in the
        # offline stores) would have no mark to redeliver it from, nor to
        # hold cursors below it. The live mark leaves out failed sends (whose
        # marks linger): a full sync page waits for it (``Conversations.sync``).
        moment = mid_for_time_ms(int(time.time() * 1000))
        oldest = app.inflight.oldest(time.monotonic())
        under_way = app.inflight.oldest_live()
        try:
            shared, shared_live = await self.stores.nodes.share_inflight(
                self.name, moment if oldest is None else oldest, self._dead_marks,
                moment if under_way is None else under_way)
        except Unavailable:
            app.replay.note_low_mark(time.time())
            return  # Redis is down: the heartbeat says so; no send completes meanwhile
        now = time.time()
        others = {n: m for n, m in shared.items() if n != self.name}
        # Only nodes whose heartbeat is seen and current count: an entry left by
        # a node that closed, or one this node never saw beat, must not hold
        # every cursor back.
        seen = app.router.live
        live = {n for n in others if seen.get(n, 0.0) > now}
        # A dead node's mark holds cursors back until what it stored is redelivered.
        held, self._dead_marks = self._dead_sends.observe(
            {n: m for n, m in others.items() if n in seen and n not in live})
        app.marks.clear()
        app.marks.update({n: m for n, m in others.items() if n in live})
        app.marks.update(held)
        app.live_marks.clear()
        app.live_marks.update({n: m for n, m in shared_live.items() if n in live})
        app.live_marks.update(held)
        app.replay.note_low_mark(now)

    async def healthy(self) -> bool:
        """Serving: not draining, the broker link up (its state, no I/O), Redis
        and MongoDB answering."""
        if self.draining or (self._app is not None and not self._app.router.broker_connected()):
            return False
        try:
            await self.stores.check_redis()
            await self.stores.check_mongo()
        except Unavailable:
            return False
        return True

    # -- stop ----------------------------------------------------------------
    async def drain(self) -> None:
        """Graceful stop (SIGTERM): bounded by ``drain_timeout_s``."""
        if self.draining:
            await self._stopped.wait()
            return
        self.draining = True
        log.info("draining %d connections (at most %.0fs)", len(self.app.hub.clients()),
                 self.settings.drain_timeout_s)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await self._drain_clients()
        await self.close()
        log.info("stopped")

    async def _drain_clients(self) -> None:
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        app = self.app
        frame = frames.reconnect()
        clients = app.hub.clients()
        with contextlib.suppress(Unavailable):
            await app.registry.forget_all()
            await self.stores.nodes.leave(self.name)
        await app.live.close()
        for c in clients:
            c.write(frame, limit=1 << 30)
        pending = [t for c in clients for t in c.tasks or ()]
        if pending:
            await asyncio.wait(pending)
        await asyncio.gather(*(c.ws.close(1001, "node draining") for c in clients),
                             return_exceptions=True)
        await app.chat.close()

    async def close(self) -> None:
        """Stop at once: listeners, background tasks, connections to the stores.

        Each step is bounded (``IM_DRAIN_TIMEOUT_S``): a dependency that stops
        answering mid-shutdown is logged by name instead of hanging the exit.
        """
        self.draining = True
        for t in self._tasks:
            t.cancel()
        steps: list[Step] = [
            ("websocket listener", self._close_ws),
            ("background tasks", lambda: asyncio.gather(*self._tasks, return_exceptions=True)),
            ("dead nodes' sends", self._dead_sends.close),
            ("http listener", self._close_http),
            *(self._app.closers() if self._app is not None else []),
            # Its sends are over: its mark must not hold the others' sync
            # cursors until its heartbeat lapses.
            ("in-flight mark", lambda: self.stores.nodes.share_inflight(self.name, None)),
            ("lease keeper", self._stop_keeper),
            ("node lease", self.lease.release),
            ("stores", self.stores.close),
        ]
        for name, step in steps:
            try:
                async with asyncio.timeout(self.settings.drain_timeout_s):
                    await step()
            except TimeoutError:
                log.error("shutdown: %s did not finish within %.0fs; going on", name,
                          self.settings.drain_timeout_s)
            except Unavailable as exc:
                log.warning("shutdown: %s: %s", name, exc)
        self._stopped.set()

    async def _close_ws(self) -> None:
        if self._ws_server is not None:
            self._ws_server.close()
            await self._ws_server.wait_closed()
        if self._app is not None and self._app.sessions.keepalive is not None:
            self._app.sessions.keepalive.close()

    async def _stop_keeper(self) -> None:
        if self._keeper is not None:
            await asyncio.to_thread(self._keeper.stop)

    async def _close_http(self) -> None:
        for server, task in ((self._http, self._http_task),
                             (self._metrics_http, self._metrics_task)):
            if server is not None:
                server.stop()
                if task is not None:
                    await asyncio.gather(task, return_exceptions=True)


@contextlib.contextmanager
def _listening(host: str, port: int, setting: str) -> Iterator[None]:
    """A listener that cannot bind is a one-line StartupError naming the setting."""
    try:
        yield
    except OSError as exc:
        why = "in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
        raise StartupError(f"cannot listen on {host}:{port} ({setting}): {why}; set "
                           f"{setting} to a free port (0: any free one)") from None


def _safe_url(url: str) -> str:
    """The URL without its password, for messages; a comma-separated list of
    URLs (IM_AMQP_URL, IM_REDIS_URL seeds) with every one's password masked."""
    return ",".join(mask_password(one) for one in url.split(","))
