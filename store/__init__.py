"""State: Redis (offline store, unread, dedup, routes, room counts, group and
feed caches, counters) and MongoDB (messages, boxes, groups, follows, posts,
timelines).

``open_stores`` opens both clients and builds one implementation per
boundary (``store/ports.py``); ``Stores`` hands out those, never the raw
clients. Everything else in the product reaches Redis and MongoDB through
them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core.errors import Unavailable
from store import ports
from store.changes_redis import ChangesRedis
from store.conv_settings_mongo import ConvSettingsMongo
from store.conv_settings_redis import ConvSettingsRedis
from store.counters_redis import CountersRedis
from store.dedup_redis import DedupRedis
from store.devices_redis import DevicesRedis
from store.feed_mongo import ensure_feed_indexes
from store.feed_redis import FeedCacheRedis
from store.follows_mongo import FollowsMongo
from store.group_news_redis import GroupNewsRedis
from store.groups_mongo import GroupsMongo
from store.groups_redis import GroupCacheRedis
from store.keeper_redis import LeaseKeeperRedis
from store.keys import Keys
from store.messages_mongo import MessagesMongo
from store.mongo_client import CommandObserver, connect_mongo, mongo_guard
from store.nodes_redis import NodeDirectoryRedis, NodeLeaseRedis
from store.offline_redis import OfflineRedis
from store.posts_mongo import PostsMongo
from store.presence_redis import PresenceRedis
from store.quotas_redis import QuotasRedis
from store.reactions_mongo import ReactionsMongo
from store.reactions_redis import ReactionsRedis
from store.records import ChatMessage, GroupMessage, InboxLimits
from store.redis_client import connect_redis, redis_guard
from store.relations_mongo import RelationsMongo
from store.room_history_redis import RoomHistoryRedis
from store.rooms_redis import RoomCountsRedis
from store.routes_redis import RoutesRedis
from store.sanctions_redis import SanctionsRedis
from store.timeline_mongo import TimelineMongo
from store.watches_redis import WatchesRedis

__all__ = ["Stores", "Unavailable", "open_stores"]


@dataclass(frozen=True)
class Stores:
    """One implementation per store boundary, and the lifecycle of the clients."""

    dedup: ports.DedupStore
    offline: ports.OfflineStore
    messages: ports.MessageStore
    routes: ports.RouteStore
    nodes: ports.NodeDirectory
    lease: ports.NodeLease
    rooms: ports.RoomCountStore
    room_history: ports.RoomHistoryStore
    groups: ports.GroupStore
    group_cache: ports.GroupCache
    group_news: ports.GroupNews
    follows: ports.FollowStore
    posts: ports.PostStore
    timelines: ports.TimelineStore
    feed_cache: ports.FeedCache
    counters: ports.CounterStore
    sanctions: ports.SanctionStore
    devices: ports.DeviceStore
    presence: ports.PresenceStore
    watches: ports.WatchStore
    quotas: ports.QuotaStore
    relations: ports.RelationStore
    reactions: ports.ReactionStore
    conv_settings: ports.ConvSettingStore
    changes: ports.ChangeLog
    keeper: Callable[[str, int, float], ports.LeaseKeeper]  # (node name, number, period)
    check_redis: Callable[[], Awaitable[None]]
    check_mongo: Callable[[], Awaitable[None]]
    prepare: Callable[[], Awaitable[None]]
    close: Callable[[], Awaitable[None]]


def open_stores(*, redis_url: str, redis_cluster: bool = False, mongo_url: str,
                namespace: str, timeout_s: float, limits: InboxLimits, lease_ttl_s: int,
                heartbeat_ttl_s: float, room_history: tuple[int, float] = (100, 300.0),
                encode_group_last: Callable[[GroupMessage], bytes],
                encode_conv_last: Callable[[ChatMessage, str], bytes],
                mongo_w: str = "majority", reaction_shards: int = 4,
                observe_mongo: CommandObserver | None = None) -> Stores:
    """Open the clients (lazily: nothing is sent until a store is used) and
    build the stores. ``encode_group_last`` makes the bytes a group's state
    keeps as its newest message, ``encode_conv_last`` those a 1:1
    conversation keeps for its owner (the client frames, so the gateway's)."""
    redis = connect_redis(redis_url, timeout_s, cluster=redis_cluster)
    mongo = connect_mongo(mongo_url, timeout_s, mongo_w, observe_mongo)
    db = mongo[namespace]
    keys = Keys(namespace)
    messages = MessagesMongo(mongo, namespace)
    offline = OfflineRedis(redis, keys, limits, messages, encode_conv_last)
    groups = GroupsMongo(db)
    follows, posts = FollowsMongo(db), PostsMongo(db)
    reactions, conv_settings = ReactionsMongo(db), ConvSettingsMongo(db)

    lease = NodeLeaseRedis(redis, keys, lease_ttl_s)

    def keeper(name: str, number: int, period_s: float) -> ports.LeaseKeeper:
        return LeaseKeeperRedis(redis_url, keys, name=name, number=number, token=lease.token,
                                lease_ttl_s=lease_ttl_s, heartbeat_ttl_s=heartbeat_ttl_s,
                                period_s=period_s, timeout_s=timeout_s,
                                cluster=redis_cluster)

    async def check_mongo() -> None:
        await messages.ping()

    async def prepare() -> None:
        await messages.ensure_indexes()
        await groups.ensure_indexes()
        await ensure_feed_indexes(db)
        await reactions.ensure_indexes()
        await conv_settings.ensure_indexes()

    async def close() -> None:
        async with redis_guard():
            await redis.aclose()
        async with mongo_guard():
            await mongo.close()

    return Stores(
        dedup=DedupRedis(redis, keys, limits.pending_ttl_s), offline=offline,
        messages=messages, routes=RoutesRedis(redis, keys),
        nodes=NodeDirectoryRedis(redis, keys), lease=lease, keeper=keeper,
        rooms=RoomCountsRedis(redis, keys), groups=groups,
        room_history=RoomHistoryRedis(redis, keys, keep=room_history[0],
                                      ttl_s=room_history[1]),
        group_cache=GroupCacheRedis(redis, keys, groups, encode_group_last),
        group_news=GroupNewsRedis(redis, keys),
        follows=follows, posts=posts, timelines=TimelineMongo(db),
        feed_cache=FeedCacheRedis(redis, keys, follows, posts, limits.user_key_ttl_s),
        counters=CountersRedis(redis, keys), sanctions=SanctionsRedis(redis, keys),
        devices=DevicesRedis(redis, keys),
        presence=PresenceRedis(redis, keys), watches=WatchesRedis(redis, keys),
        quotas=QuotasRedis(redis, keys),
        relations=RelationsMongo(db, follows),
        reactions=ReactionsRedis(redis, keys, reactions, reaction_shards),
        conv_settings=ConvSettingsRedis(redis, keys, conv_settings),
        changes=ChangesRedis(redis, keys, limits.offline_max, limits.offline_ttl_s),
        check_redis=offline.ping, check_mongo=check_mongo, prepare=prepare, close=close)
