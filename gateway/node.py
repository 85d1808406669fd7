"""A gateway node: one process serving WebSocket and HTTP on its own ports.

Start-up opens the stores and checks each dependency (one clear line if one
cannot be reached), leases a node id, then listens. ``drain`` is the
graceful stop: refuse new connections, tell clients to ``reconnect``, close
them with 1001, finish in-flight sends, release the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterator

import uvicorn
from websockets.asyncio.server import Server, serve

from core.batcher import Batcher
from core.ids import MidGenerator, mid_for_time_ms
from gateway.bindings import Bindings
from gateway.chat import ChatService
from gateway.config import Settings
from gateway.feed import FeedService
from gateway.grouphub import GroupHub
from gateway.groups import GroupService
from gateway.http_api import build_app
from gateway.hub import Client, Hub
from gateway.live import LiveRooms
from gateway.metrics import NodeMetrics
from gateway.protocol import encode
from gateway.rooms import RoomHub, RoomLimits
from gateway.session import Sessions
from router import Router, make_broker
from store import Stores
from store.errors import Unavailable
from store.inbox import InboxLimits
from store.nodes import NodeLease
from store.routes import RouteStore

__all__ = ["Node", "StartupError"]

log = logging.getLogger("gateway.node")


class StartupError(Exception):
    """A dependency could not be reached at start-up; the message says which."""


class _HttpServer(uvicorn.Server):
    """uvicorn inside our loop: signals belong to the node, not to uvicorn."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Node:
    """Wires stores, router, hub and the two listeners together."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics = NodeMetrics()
        self.hub = Hub(self.metrics, settings.write_buffer_max)
        self.room_hub = RoomHub(self.hub, self.metrics, RoomLimits(
            window_s=settings.room_window_ms / 1000, rate_cap=settings.room_rate_cap,
            frame_max=settings.max_frame, buffer_max=settings.room_buffer_max,
            pending_max=settings.room_pending_max))
        self.group_hub = GroupHub(self.hub)
        self.draining = False
        self.name = ""
        self.ws_port = 0
        self.http_port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._ws_server: Server | None = None
        self._http: _HttpServer | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()

    @property
    def app(self) -> Node:
        """Transitional: the composed services (becomes ``gateway.app.App``)."""
        return self

    # -- lifecycle -----------------------------------------------------------
    async def start(self) -> None:
        s = self.settings
        limits = InboxLimits(offline_max=s.offline_max, offline_ttl_s=s.offline_ttl_s,
                             unread_cap=s.unread_cap, dedup_ttl_s=s.dedup_ttl_s)
        self.stores = Stores.open(redis_url=s.redis_url, mongo_url=s.mongo_url,
                                  namespace=s.namespace, timeout_s=s.dep_timeout_s,
                                  limits=limits, mongo_w=s.mongo_w)
        await self._check_dependencies()
        self.lease = NodeLease(self.stores.redis, self.stores.keys, int(s.heartbeat_ttl_s))
        number = await self._acquire_lease()
        # The name routes traffic; it changes with every start, so routes left
        # by this node's previous life never reach the new one.
        self.name = f"n{number}-{self.lease.token[:6]}"
        self.routes = RouteStore(self.stores.redis, self.stores.keys)
        self._route_ops: Batcher[tuple[bool, str, int], None] = Batcher(
            self._flush_route_ops, name="redis", max_batch=s.batch_max,
            max_pending=s.pending_max)
        broker = make_broker(s.broker, s.amqp_url, s.namespace)
        self.router = Router(self.name, self.hub, broker, self.routes, rooms=self.room_hub,
                             groups=self.group_hub)
        self.router.on_control = self._control
        self.router.on_resume = self._broker_resumed
        try:
            await self.router.start()
        except Exception:
            raise StartupError(f"cannot reach RabbitMQ at {_safe_url(s.amqp_url)}") from None
        self.router.set_live(await self.routes.heartbeat(self.name, s.heartbeat_ttl_s))
        self.chat = ChatService(self.stores, MidGenerator(number), s, self.metrics)
        self.bindings = Bindings(self.router, self.metrics, s.room_unbind_delay_s,
                                 int(60 / s.room_report_s))
        self.live = LiveRooms(self.name, s, self.metrics, self.room_hub, self.router,
                              self.stores.rooms, self.bindings)
        self.groups = GroupService(self, self.group_hub)
        self.chat.groups = self.groups
        self.feed = FeedService(self)
        self.feed.start()
        self.sessions = Sessions(self)
        await self._listen()
        self._tasks.append(asyncio.create_task(self._heartbeat()))
        self._tasks.append(asyncio.create_task(self._room_ticks()))
        log.info("node %s serving ws=%s:%d http=%s:%d namespace=%s", self.name, s.host,
                 self.ws_port, s.host, self.http_port, s.namespace)

    async def _check_dependencies(self) -> None:
        s = self.settings
        try:
            await self.stores.inbox.ping()
        except Unavailable:
            raise StartupError(f"cannot reach Redis at {_safe_url(s.redis_url)}") from None
        try:
            await self.stores.messages.ping()
            await self.stores.messages.ensure_indexes()
            await self.stores.groups.ensure_indexes()
            await self.stores.feed.ensure_indexes()
        except Unavailable:
            raise StartupError(f"cannot reach MongoDB at {_safe_url(s.mongo_url)}") from None

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

    async def _listen(self) -> None:
        s = self.settings
        self._ws_server = await serve(
            self.sessions.handle, s.host, s.ws_port,
            process_request=self.sessions.process_request,
            max_size=s.max_frame, compression=None, ping_interval=20, ping_timeout=20,
            close_timeout=2,
        )
        self.ws_port = self._ws_server.sockets[0].getsockname()[1]
        sock = socket.create_server((s.host, s.http_port), reuse_port=False)
        self.http_port = sock.getsockname()[1]
        config = uvicorn.Config(build_app(self), log_level="warning", access_log=False,
                                lifespan="off", loop="none")
        self._http = _HttpServer(config)
        # The socket already listens, so clients can connect before uvicorn is up.
        self._http_task = asyncio.create_task(self._http.serve(sockets=[sock]))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.beat()
            except Unavailable as exc:
                log.warning("heartbeat failed: %s", exc)

    async def _room_ticks(self) -> None:
        while True:
            await asyncio.sleep(self.settings.room_report_s)
            try:
                await self.live.tick()
                await self.bindings.sweep(time.monotonic(), self._key_in_use)
                self.bindings.tick_metrics()
            except Exception:  # keep ticking: a failed tick is retried by the next
                log.exception("room housekeeping failed")

    def _key_in_use(self, key: str) -> bool:
        if key.startswith("g|"):
            return key[2:] in self.group_hub.members
        return key in self.room_hub.members

    def _control(self, users: list[str], ctl: dict[str, object]) -> None:
        """A membership change for local devices, sent by another node."""
        task = asyncio.create_task(self.groups.apply_control(users, ctl))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def beat(self) -> None:
        """Renew the lease and this node's liveness; learn which nodes live.

        A lease that had vanished means Redis lost its data (flush, failover):
        the routes of every local connection are written again.
        """
        retaken = await self.lease.renew()
        self.router.set_live(await self.routes.heartbeat(self.name, self.settings.heartbeat_ttl_s))
        if retaken:
            log.warning("lease was gone from Redis: rewriting %d routes", self.hub.count)
            await self.routes.add([(c.user, self.name, c.id) for c in self.hub.clients()])
            self.live.rewrite_counts()

    def _broker_resumed(self, lost_at: float) -> None:
        """Pushes may have been lost while the broker was away: replay them from
        the offline stores of local users (clients drop repeats by mid)."""
        since = mid_for_time_ms(int((lost_at - 2.0) * 1000))
        task = asyncio.create_task(self._replay(list(self.hub.users), since))
        self._tasks.append(task)

    async def _replay(self, users: list[str], since: int) -> None:
        for i in range(0, len(users), 500):
            chunk = users[i:i + 500]
            try:
                frames = await self.stores.inbox.recent(chunk, since, 200)
            except Unavailable as exc:
                log.warning("replay after broker outage failed: %s", exc)
                return
            for user, rows in zip(chunk, frames, strict=True):
                for frame in rows:
                    self.hub.deliver_to_user(user, frame, None)
        self.metrics.replays.inc()

    async def healthy(self) -> bool:
        try:
            await self.stores.inbox.ping()
            await self.stores.messages.ping()
        except Unavailable:
            return False
        return True

    async def drain(self) -> None:
        """Graceful stop (SIGTERM): bounded by ``drain_timeout_s``."""
        if self.draining:
            await self._stopped.wait()
            return
        self.draining = True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.drain_timeout_s):
                await self._drain_clients()
        await self.close()

    async def _drain_clients(self) -> None:
        if self._ws_server is not None:
            self._ws_server.close(close_connections=False)
        frame = encode({"op": "reconnect"})
        clients = self.hub.clients()
        with contextlib.suppress(Unavailable):
            await self.routes.remove([(c.user, self.name, c.id) for c in clients])
            await self.routes.leave(self.name)
        await self.live.close()
        for c in clients:
            c.write(frame, limit=1 << 30)
        pending = [t for c in clients for t in c.tasks or ()]
        if pending:
            await asyncio.wait(pending)
        await asyncio.gather(*(c.ws.close(1001, "node draining") for c in clients),
                             return_exceptions=True)
        await self.chat.close()

    async def close(self) -> None:
        """Stop at once: listeners, background tasks, connections to the stores.

        Each step is bounded (``IM_DRAIN_TIMEOUT_S``): a dependency that stops
        answering mid-shutdown is logged by name instead of hanging the exit.
        """
        self.draining = True
        for t in self._tasks:
            t.cancel()
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [
            ("websocket listener", self._close_ws),
            ("background tasks", lambda: asyncio.gather(*self._tasks, return_exceptions=True)),
            ("http listener", self._close_http),
            ("route writes", self._route_ops.close),
            ("rooms", self.live.close),
            ("groups", self.groups.close),
            ("feed", self.feed.close),
            ("node lease", self.lease.release),
            ("broker", self.router.close),
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

    async def _close_http(self) -> None:
        if self._http is not None:
            self._http.should_exit = True
            if self._http_task is not None:
                await asyncio.gather(self._http_task, return_exceptions=True)

    # -- hub events ----------------------------------------------------------
    async def client_connected(self, client: Client) -> None:
        """Register a device locally and in the routes (so other nodes find it)."""
        self.hub.add(client)
        try:
            await self._route_ops.submit((True, client.user, client.id))
        except Unavailable as exc:  # served locally; other nodes find it after a rewrite
            log.warning("route write failed for %s: %s", client.user, exc)
        await self.groups.connected(client)

    async def client_disconnected(self, client: Client) -> None:
        self.hub.remove(client)
        self.live.disconnected(client)
        self.groups.disconnected(client)
        with contextlib.suppress(Unavailable):
            await self._route_ops.submit((False, client.user, client.id))

    async def _flush_route_ops(self, ops: list[tuple[bool, str, int]]) -> list[None]:
        adds = [(user, self.name, conn) for add, user, conn in ops if add]
        removes = [(user, self.name, conn) for add, user, conn in ops if not add]
        if adds:
            await self.routes.add(adds)
        if removes:
            await self.routes.remove(removes)
        return [None] * len(ops)


def _safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    head, sep, tail = url.rpartition("@")
    if not sep or ":" not in head.split("//", 1)[-1]:
        return url
    scheme, _, creds = head.partition("//")
    return f"{scheme}//{creds.split(':', 1)[0]}:***@{tail}"
