"""The composition root: the one place a node's objects are built, in
dependency order, each handed only the interfaces it uses.

    stores (store/ports.py) ─┐
    connection maps ─────────┼─► router ─► services ─► sessions, HTTP API
    broker, bindings ────────┘

Nothing else constructs a service, and no service reaches through another:
a service's constructor lists everything it talks to. ``gateway.node``
(lifecycle: listeners, lease, heartbeat, drain) calls ``compose`` once the
node has its number and name.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from core.ids import MidGenerator
from gateway.auth import TokenVerifier
from gateway.bindings import Bindings
from gateway.chat import ChatService
from gateway.claims import Claims
from gateway.config import Settings
from gateway.conversations import Conversations
from gateway.events import Events
from gateway.feed import FeedService, feed_frame
from gateway.group_presence import GroupPresence
from gateway.grouphub import GroupHub
from gateway.groups import GroupService
from gateway.http_api import HttpDeps, build_http
from gateway.http_guard import HttpLimits
from gateway.hub import Hub
from gateway.live import LiveRooms
from gateway.metrics import NodeMetrics
from gateway.moderation import Moderation
from gateway.registry import Registry, Replay
from gateway.rooms import RoomHub, RoomLimits
from gateway.server_api import ServerDeps
from gateway.session import Sessions
from router import Router, make_broker
from router.group_fanout import GroupDiffusion
from router.routing import parse_key
from router.timeline_fanout import TimelineFanout
from store import Stores

__all__ = ["App", "compose"]

Step = tuple[str, Callable[[], Awaitable[object]]]


@dataclass(frozen=True)
class App:
    """Everything one node serves with, built by ``compose``."""

    hub: Hub
    room_hub: RoomHub
    group_hub: GroupHub
    bindings: Bindings
    router: Router
    mids: MidGenerator
    claims: Claims
    chat: ChatService
    groups: GroupService
    group_presence: GroupPresence
    conversations: Conversations
    live: LiveRooms
    feed: FeedService
    registry: Registry
    replay: Replay
    sessions: Sessions
    http: FastAPI
    events: Events

    async def start(self) -> None:
        """Connect to the broker (raises if it cannot), start background work."""
        await self.router.start()
        self.feed.start()
        self.events.start()

    def key_in_use(self, key: str) -> bool:
        """Whether a broker routing key still has a local member."""
        kind, name = parse_key(key)
        return name in (self.group_hub.members if kind == "group" else self.room_hub.members)

    async def tick(self) -> None:
        """Room housekeeping (every ``IM_ROOM_REPORT_S``)."""
        await self.live.tick()
        await self.bindings.sweep(time.monotonic(), self.key_in_use)
        self.bindings.tick_metrics()

    def closers(self) -> list[Step]:
        """Ordered shutdown steps after the listeners: work in flight first, the
        broker last (pushes of what was flushed still go out)."""
        return [("route writes", self.registry.close), ("claims", self.claims.close),
                ("chat", self.chat.close),
                ("rooms", self.live.close), ("groups", self.groups.close),
                ("group loads", self.group_presence.close), ("feed", self.feed.close),
                ("replay", self.replay.close), ("events", self.events.close),
                ("broker", self.router.close)]


def compose(settings: Settings, stores: Stores, metrics: NodeMetrics, *, name: str,
            number: int, draining: Callable[[], bool],
            healthy: Callable[[], Awaitable[bool]]) -> App:
    """Build a node's objects for node ``name`` holding number ``number``."""
    s = settings
    batch = {"max_batch": s.batch_max, "max_pending": s.pending_max}
    hub = Hub(metrics, s.write_buffer_max)
    room_hub = RoomHub(hub, metrics, RoomLimits(
        window_s=s.room_window_ms / 1000, rate_cap=s.room_rate_cap, frame_max=s.max_frame,
        buffer_max=s.room_buffer_max, pending_max=s.room_pending_max))
    group_hub = GroupHub(hub)
    broker = make_broker(s.broker, s.amqp_url, s.namespace)
    bindings = Bindings(broker, metrics, s.room_unbind_delay_s, int(60 / s.room_report_s))
    presence = GroupPresence(group_hub, bindings, stores.group_cache, **batch)
    replay = Replay(hub, stores.offline, metrics)
    async def on_control(users: list[str], ctl: dict[str, Any]) -> None:
        """A control message for local devices: group membership, or moderation."""
        if ctl.get("op") in ("close", "revoke"):
            await moderation.apply_control(users, ctl)
        elif ctl.get("op") in ("rmute", "runmute", "rkick"):
            await live.apply_control(users, ctl)
        else:
            await presence.apply_control(users, ctl)

    router = Router(name, hub, broker, stores.routes, rooms=room_hub, groups=group_hub,
                    on_control=on_control, on_resume=replay.resumed)
    moderation = Moderation(stores.sanctions, router, hub, s.auth_max_ttl_s,
                            metrics.sanctions_unchecked.inc)
    metrics.watch_broker(router.broker_status)
    mids = MidGenerator(number)
    claims = Claims(stores.dedup, observe=metrics.stage_observer("dedup"), **batch)
    chat = ChatService(claims, stores.messages, stores.offline, mids, s, metrics)
    diffusion = GroupDiffusion(stores.group_cache, stores.messages, stores.offline)
    groups = GroupService(stores.groups, stores.group_cache, claims, mids, diffusion,
                          stores.offline, router, s, metrics)
    conversations = Conversations(chat, groups, s.sync_settle_ms)
    live = LiveRooms(name, s, metrics, room_hub, router, stores.rooms, bindings,
                     stores.sanctions)
    fanout = TimelineFanout(stores.posts, stores.follows, stores.timelines, stores.feed_cache,
                            router, feed_frame, timeline_max=s.feed_timeline_max,
                            queue_max=s.feed_queue_max)
    feed = FeedService(stores.follows, stores.posts, stores.timelines, stores.feed_cache,
                       stores.counters, fanout, mids, s)
    registry = Registry(name, hub, stores.routes, presence, live, **batch)
    verifier = TokenVerifier.from_settings(s)

    async def unread_total(user: str) -> int:
        return int((await conversations.conversations(user, 1))["total_unread"])

    events = Events(router.publish_event, unread_total, s.event_types,
                    pending_max=s.events_pending_max,
                    count=lambda kind, outcome: metrics.events.labels(kind, outcome).inc())
    sessions = Sessions(s, registry, chat, groups, conversations, live, router, metrics,
                        draining, verifier, moderation, events)

    async def notify(users: list[str], frame: bytes) -> int:
        reached = 0
        for user, r in zip(users, await stores.routes.lookup(users), strict=True):
            router.push(user, frame, r)
            now = time.time()
            reached += sum(1 for node in r.values() if router.is_alive(node, now))
        return reached

    async def online(users: list[str]) -> list[tuple[int, int | None]]:
        now = time.time()
        routes, seen = await stores.routes.lookup(users), await stores.routes.last_seen(users)
        return [(sum(1 for node in r.values() if router.is_alive(node, now)), t)
                for r, t in zip(routes, seen, strict=True)]

    server = ServerDeps(chat, groups, live, router, moderation, notify, online,
                        s.max_body, events) if s.api_key_list else None
    http = build_http(HttpDeps(name, verifier, chat, conversations,
                               groups, feed, live, metrics, healthy,
                               limits=HttpLimits.from_settings(s),
                               metrics_public=bool(s.metrics_public),
                               cors_origins=s.cors_origin_list, api_keys=s.api_key_list,
                               admit=moderation.admit, server=server))
    return App(hub, room_hub, group_hub, bindings, router, mids, claims, chat, groups, presence,
               conversations, live, feed, registry, replay, sessions, http, events)
