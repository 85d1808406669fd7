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

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from core.ids import MidGenerator
from core.inflight import InFlight
from core.ttl_cache import TtlCache
from gateway import frames
from gateway.auth import TokenVerifier
from gateway.bindings import Bindings
from gateway.chat.claims import Claims
from gateway.chat.service import ChatLimits, ChatService
from gateway.chat.unfinished import UnfinishedSends
from gateway.config import Settings
from gateway.contacts.service import Privacy, RelationLimits, Relations
from gateway.delivery import Replay
from gateway.events import Events
from gateway.feed.fanout import TimelineFanout
from gateway.feed.service import FeedLimits, FeedService, feed_frame
from gateway.groups.admin import AdminLimits, GroupAdmin
from gateway.groups.diffusion import GroupDiffusion
from gateway.groups.hub import GroupHub
from gateway.groups.membership import GroupMembership
from gateway.groups.service import GroupLimits, GroupService
from gateway.hooks.client import Hooks, HookSettings
from gateway.http.api import HttpDeps, LazyHttp, build_http
from gateway.http.guard import HttpLimits
from gateway.http.server import ServerDeps
from gateway.hub import Hub
from gateway.inbox.conversations import HELD_WAIT_S, Conversations
from gateway.inbox.edits import Edits
from gateway.inbox.ops import Features, MessageOps
from gateway.inbox.reactions import Reactions
from gateway.metrics import NodeMetrics
from gateway.moderation import Moderation
from gateway.presence.devices import Devices
from gateway.presence.subs import PresenceSubs
from gateway.presence.watch import PresenceQuery, PresenceWatch
from gateway.rooms.hub import RoomHub, RoomLimits
from gateway.rooms.service import LiveRooms, RoomRules
from gateway.ws.core import ConnectionLimits, SessionLimits
from gateway.ws.registry import Registry
from gateway.ws.session import Sessions
from router import Router, make_broker
from router.controls import (
    Close,
    CloseConn,
    Controls,
    GroupAdd,
    GroupDel,
    RelationChange,
    Revoke,
    RoomKick,
    RoomMute,
    RoomUnmute,
    Unban,
)
from router.positions import RoomPositions
from router.routing import group_key, parse_key, room_key
from store import Stores
from store.ports import ConvSettingStore, GroupCache, RouteStore
from store.records import ChatMessage

__all__ = ["App", "compose"]

Step = tuple[str, Callable[[], Awaitable[object]]]
MUTERS_S = 5.0  # a group's muters, as its offline.group events name them, kept this long
MUTERS_MAX = 1000  # muters an offline.group event names at most


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
    group_presence: GroupMembership
    conversations: Conversations
    live: LiveRooms
    feed: FeedService
    registry: Registry
    replay: Replay
    sessions: Sessions
    http: LazyHttp
    events: Events
    presence: PresenceWatch
    watchers: PresenceSubs
    stuck_close_s: float = 30.0  # a socket skipped for backlog this long is closed
    inflight: InFlight = field(default_factory=InFlight)  # this node's sends (core.inflight)
    marks: dict[str, int] = field(default_factory=dict)  # the other nodes' oldest in flight
    live_marks: dict[str, int] = field(default_factory=dict)  # of their sends under way
    hooks: Hooks | None = None  # the product's hooks (their HTTP client)
    devices: Devices | None = None  # the login policy (its claims and releases in flight)
    unfinished: UnfinishedSends | None = None  # failed sends the node finishes itself

    async def start(self) -> None:
        """Connect to the broker (raises if it cannot), start background work."""
        await self.router.start()
        self.feed.start()
        self.events.start()
        self.presence.start()
        self.watchers.start()

    def beat(self, live: dict[str, float], read_at: float) -> None:
        """The live nodes' heartbeats, after each of this node's beats (read at
        ``read_at``, unix s)."""
        self.router.set_live(live, read_at)
        self.presence.beat(live)

    def keys_in_use(self) -> list[str]:
        """Every broker routing key a local connection needs now."""
        return [*map(room_key, self.room_hub.members), *map(group_key, self.group_hub.members),
                *self.watchers.shard_keys()]

    def key_in_use(self, key: str) -> bool:
        """Whether a broker routing key still has a local member."""
        kind, name = parse_key(key)
        if kind == "presence":
            return name.isdigit() and int(name) in self.watchers.shards
        return name in (self.group_hub.members if kind == "group" else self.room_hub.members)

    async def tick(self) -> None:
        """Housekeeping (every ``IM_ROOM_REPORT_S``): room counts, idle bindings,
        and sockets stuck too long (slow readers of any traffic: the socket
        writer owns the rule)."""
        self.hub.writer.close_stuck(self.stuck_close_s, time.monotonic())
        await self.live.tick()
        await self.bindings.sweep(time.monotonic(), self.key_in_use)
        self.bindings.tick_metrics()

    def closers(self) -> list[Step]:
        """Ordered shutdown steps after the listeners: work in flight first, the
        broker last (pushes of what was flushed still go out)."""
        return [("sanction reads", self.sessions.moderation.close),
                ("route writes", self.registry.close),
                *((("device releases", self.devices.close_all),)
                  if self.devices is not None else ()),
                ("claims", self.claims.close),
                *((("unfinished sends", self.unfinished.close),)
                  if self.unfinished is not None else ()),
                ("chat", self.chat.close),
                ("rooms", self.live.close), ("room positions", self.router.close_positions),
                ("groups", self.groups.close),
                ("group loads", self.group_presence.close), ("feed", self.feed.close),
                ("replay", self.replay.close), ("presence watches", self.watchers.close),
                ("presence", self.presence.close),
                ("events", self.events.close),
                *((("hooks", self.hooks.close),) if self.hooks is not None else ()),
                ("broker", self.router.close)]


def compose(settings: Settings, stores: Stores, metrics: NodeMetrics, *, name: str,
            number: int, draining: Callable[[], bool],
            healthy: Callable[[], Awaitable[bool]],
            ws_port: Callable[[], int] = lambda: 8080) -> App:
    """Build a node's objects for node ``name`` holding number ``number``."""
    s = settings
    batch = {"max_batch": s.batch_max, "max_pending": s.pending_max}
    hub = Hub(metrics, s.write_buffer_max)
    room_hub = RoomHub(hub, metrics, RoomLimits(
        window_s=s.room_window_ms / 1000, rate_cap=s.room_rate_cap, frame_max=s.max_frame,
        buffer_max=s.room_buffer_max, pending_max=s.room_pending_max,
        reorder_s=s.room_reorder_ms / 1000, write_chunk=s.room_write_chunk,
        write_at_once=s.room_write_at_once, history_ttl_s=s.room_history_ttl_s))
    group_hub = GroupHub(hub)
    broker = make_broker(s.broker, s.amqp_url, s.namespace)
    bindings = Bindings(broker, metrics, s.room_unbind_delay_s, int(60 / s.room_report_s))
    presence = GroupMembership(group_hub, bindings, stores.group_cache, **batch,
                               observe=metrics.stage_observer("group_loads"))
    replay = Replay(hub, stores.offline, metrics)
    # handlers registered below, once their targets exist
    controls = Controls(lambda kind: metrics.controls.labels(kind).inc())
    watchers = PresenceSubs(hub, bindings, stores.watches, name, s.presence_subs_max,
                            refused=lambda cap: metrics.limit_refusals.labels(cap).inc())
    positions = functools.partial(
        RoomPositions, store=stores.room_history, window_s=s.room_window_ms / 1000,
        pending_max=s.room_pending_max, observe=metrics.room_stage.labels("position").observe,
        count=lambda outcome, rooms: metrics.room_positions.labels(outcome).inc(rooms))
    router = Router(name, hub, broker, stores.routes, rooms=room_hub, groups=group_hub,
                    presence=watchers, controls=controls,
                    positions=positions if s.room_history > 0 else None)
    router.when_resumed(replay.resumed)  # pushes lost meanwhile, again

    def dead_nodes() -> list[str]:  # their presence watches stop counting
        now = time.time()
        return [n for n in router.live if not router.is_alive(n, now)]

    watchers.dead_nodes = dead_nodes
    moderation = Moderation(stores.sanctions, router, hub, s.auth_max_ttl_s,
                            metrics.sanctions_unchecked.inc, **batch,
                            observe=metrics.stage_observer("sanctions"))
    controls.handle(Close, moderation.apply_control)
    controls.handle(Revoke, moderation.apply_control)
    controls.handle(Unban, moderation.apply_control)
    controls.handle(GroupAdd, presence.apply_control)
    controls.handle(GroupDel, presence.apply_control)
    metrics.watch_broker(router.broker_status)
    mids = MidGenerator(number)
    claims = Claims(stores.dedup, observe=metrics.stage_observer("dedup"), **batch)
    inflight = InFlight()
    chat = ChatService(claims, stores.messages, stores.offline, stores.routes, mids,
                       ChatLimits.from_settings(s), metrics, inflight)
    diffusion = GroupDiffusion(stores.group_cache, stores.messages, stores.offline)
    groups = GroupService(stores.groups, stores.group_cache, claims, mids, diffusion,
                          stores.offline, GroupLimits.from_settings(s), metrics, inflight,
                          stores.group_news)

    def push_finished(msg: ChatMessage, frame: bytes, sender_routes: dict[str, str],
                      receiver_routes: dict[str, str]) -> None:
        router.push(msg.to, frame, receiver_routes)
        router.push(msg.sender, frame, sender_routes)

    async def finish(node_id: int, low: int, high: int) -> int:
        """What this node stored from ``low`` to ``high`` redelivered, 1:1 then
        group, each message found pushed: its send failed before any push (a
        dead node's range, ``Node._redeliver``, is not pushed again: most of it was)."""
        return (await chat.redeliver(node_id, low, high, push_finished)
                + await groups.redeliver(node_id, low, high, router.publish_group))

    unfinished = UnfinishedSends(
        finish, inflight,
        count=lambda outcome, n: metrics.unfinished_sends.labels(outcome).inc(n))
    chat.unfinished = groups.unfinished = unfinished.add

    def refused(cap: str) -> None:
        metrics.limit_refusals.labels(cap).inc()

    async def relations_changed(users: list[str]) -> None:
        await router.tell_all(users, RelationChange())

    relations = Relations(stores.relations, stores.quotas, RelationLimits(
        Privacy(s.privacy_dm, s.privacy_presence, s.privacy_group_add),
        s.max_new_convs_per_day, s.relation_lookup_rate, s.relation_lookup_burst),
        refused, tell_all=relations_changed)
    group_admin = GroupAdmin(stores.groups, stores.group_cache, router,
                             AdminLimits.from_settings(s), stores.quotas, refused=refused,
                             may_not_add=relations.refused_adds, news=stores.group_news)
    marks: dict[str, int] = {}  # the other nodes' oldest mid in flight (Node shares them)
    live_marks: dict[str, int] = {}  # theirs of sends under way (failed ones left out)

    def low_mark() -> int | None:
        own = inflight.oldest(time.monotonic())
        return min([*marks.values(), *([own] if own is not None else [])], default=None)

    def live_mark() -> int | None:
        own = inflight.oldest_live()
        return min([*live_marks.values(), *([own] if own is not None else [])], default=None)

    reactions = Reactions(stores.reactions, stores.messages, stores.groups, stores.group_cache,
                          s.reaction_emoji_max)
    edits = Edits(stores.messages, stores.offline, stores.groups, stores.group_cache,
                  s.edit_window_s)
    conversations = Conversations(chat, groups, s.sync_settle_ms, low_mark, reactions,
                                  stores.conv_settings, stores.changes,
                                  held_wait_s=HELD_WAIT_S, live_mark=live_mark)
    replay.low_mark = low_mark  # a replay reaches back to sends in flight
    live = LiveRooms(name, RoomRules.from_settings(s), metrics, room_hub, router, stores.rooms,
                     bindings,
                     stores.sanctions, stores.room_history)
    router.when_resumed(lambda _lost_at: live.resumed())  # room messages missed meanwhile
    controls.handle(RoomMute, live.apply_control)
    controls.handle(RoomUnmute, live.apply_control)
    controls.handle(RoomKick, live.apply_control)
    fanout = TimelineFanout(stores.posts, stores.follows, stores.timelines, stores.feed_cache,
                            router, feed_frame, timeline_max=s.feed_timeline_max,
                            queue_max=s.feed_queue_max)
    feed = FeedService(stores.follows, stores.posts, stores.timelines, stores.feed_cache,
                       stores.counters, fanout, mids, FeedLimits.from_settings(s),
                       followed=lambda a, b: relations.changed(a, b))
    sources = _EventSources(conversations, stores.group_cache, stores.routes, router,
                            settings=stores.conv_settings)
    events = Events(name, router.publish_event, sources,
                    s.event_types, pending_max=s.events_pending_max,
                    pending_per_user=s.events_pending_per_user,
                    count=lambda kind, outcome: metrics.events.labels(kind, outcome).inc(),
                    push_platforms=s.offline_push_platform_set)
    router.when_resumed(lambda _lost_at: events.resume())  # the events held meanwhile
    def announce(user: str, online: bool, at_ms: int) -> None:
        """A presence change this node settled: to the events and to the watchers."""
        events.presence(user, online, at_ms)
        router.publish_presence(user, frames.presence(
            {user: {"online": online, "last_seen": at_ms}}))

    watch = PresenceWatch(name, stores.presence, announce, lambda u: len(hub.users.get(u, ())),
                          s.presence_grace_s, observe=metrics.stage_observer("presence"))
    devices = Devices(stores.devices, router, hub, name, s.login_policy,
                      alive=lambda node: router.is_alive(node, time.time()),
                      replaced=metrics.closed.labels("replaced").inc, **batch,
                      observe=metrics.stage_observer)
    controls.handle(CloseConn, devices.apply_control)
    sources.devices = devices  # the events' platforms (built after the outbox)
    registry = Registry(name, hub, stores.routes, presence, live, watch, watchers, replay,
                        **batch,
                        grace_s=s.register_grace_s, closed=metrics.closed.labels("registration"),
                        devices=devices, observe=metrics.stage_observer("routes"))
    query = PresenceQuery(stores.routes, router.live_routes)
    verifier = TokenVerifier.from_settings(s)
    hooks = Hooks(HookSettings(
        s.hook_url, s.hook_secret.encode(), s.hook_kinds, s.hook_timeout_ms / 1000,
        s.hook_failure == "open", s.hook_max_inflight, s.max_body), metrics) \
        if s.hook_url else None
    ops = MessageOps(conversations, chat, groups, router, s.recall_window_s,
                     lambda g, conn: conn in (group_hub.members.get(g) or {}), watchers, query,
                     relations, Features(edits, reactions, stores.conv_settings,
                                         stores.group_cache, s.pinned_max, stores.changes,
                                         mids, hooks))

    def relations_applied(users: list[str], ctl: RelationChange) -> Awaitable[None] | None:
        relations.apply_control(users, ctl)  # forgotten first: the checks read afresh
        return ops.recheck_watches(users) if watchers.watching(users) else None

    controls.handle(RelationChange, relations_applied)
    sessions = Sessions(SessionLimits.from_settings(s), ConnectionLimits.from_settings(s),
                        registry, chat, groups, conversations, live, router, metrics,
                        draining, verifier, moderation, ops, events, relations, hooks)

    async def notify(users: list[str], frame: bytes) -> int:
        reached = 0
        for user, r in zip(users, await stores.routes.lookup(users), strict=True):
            router.push(user, frame, r)
            now = time.time()
            reached += router.live_routes(r, now)
        return reached


    server = ServerDeps(chat, groups, live, router, moderation, notify, query.devices,
                        s.max_body, events, s.push_confirm_ms / 1000,
                        relations=relations, hooks=hooks,
                        devices=devices) if s.api_key_list else None
    http = build_http(HttpDeps(name, verifier, chat, conversations,
                               group_admin, feed, live, metrics, healthy,
                               limits=HttpLimits.from_settings(s),
                               metrics_public=bool(s.metrics_public),
                               cors_origins=s.cors_origin_list, api_keys=s.api_key_list,
                               admit=moderation.admit, server=server, ops=ops,
                               ws_port=ws_port, public_ws_url=s.public_ws_url,
                               relations=relations, devices=devices))
    if missing := controls.missing():
        raise RuntimeError(f"controls without a handler: {', '.join(missing)}")
    app = App(hub, room_hub, group_hub, bindings, router, mids, claims, chat, groups, presence,
              conversations, live, feed, registry, replay, sessions, http, events, watch,
              watchers, stuck_close_s=s.stuck_close_s, inflight=inflight, marks=marks,
              live_marks=live_marks,
              hooks=hooks, devices=devices, unfinished=unfinished)
    router.when_resumed(lambda _lost_at: bindings.resumed(app.keys_in_use))  # checked again
    return app


@dataclass
class _EventSources:
    """What the events worker reads (``gateway.events.EventSources``)."""

    conversations: Conversations
    group_cache: GroupCache
    routes: RouteStore
    router: Router
    devices: Devices | None = None
    settings: ConvSettingStore | None = None
    muters: TtlCache[str, list[str]] = field(default_factory=lambda: TtlCache(10_000))

    async def muted(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        if self.settings is None or not pairs:
            return set()
        mine = await self.settings.of_users(sorted({u for u, _ in pairs}))
        return {(u, c) for u, c in pairs if (v := mine[u].get(c)) is not None and v.muted}

    async def muted_by(self, conv: str) -> list[str]:
        """Who muted a group (kept ``MUTERS_S`` on the node: one read per busy group)."""
        if self.settings is None:
            return []
        now = time.monotonic()
        found, users = self.muters.get(conv, now)
        if found and users is not None:
            return users
        users = await self.settings.muted_by(conv, MUTERS_MAX)
        self.muters.set(conv, users, now + MUTERS_S)
        return users

    async def platforms(self, users: Sequence[str]) -> dict[str, list[str]]:
        if self.devices is None or not users:
            return {}
        found = await self.devices.devices_many(users)
        return {u: [d["platform"] for d in ds] for u, ds in zip(users, found, strict=True)}

    async def unread(self, user: str) -> int:
        return await self.conversations.total_unread(user)

    async def members(self, group: str) -> list[str]:
        return (await self.group_cache.members([group])).get(group, [])

    async def offline(self, users: Sequence[str]) -> list[str]:
        now = time.time()
        found = await self.routes.lookup(users)
        return [u for u, r in zip(users, found, strict=True)
                if not self.router.live_routes(r, now)]
