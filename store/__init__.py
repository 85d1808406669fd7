"""State: Redis (offline store, unread, dedup, routes, room counts, group caches)
and MongoDB (messages, boxes, groups, follows, posts, timelines).

``Stores.connect`` opens both and checks they answer; everything else in the
product reaches Redis and MongoDB through the classes here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis
from pymongo import AsyncMongoClient

from store.errors import Unavailable
from store.feed import FeedStore
from store.feed_cache import FeedCache
from store.group_cache import GroupCache
from store.groups import GroupStore
from store.inbox import InboxLimits, InboxStore
from store.keys import Keys
from store.messages import MessageStore
from store.mongo_client import connect_mongo
from store.redis_client import connect_redis
from store.rooms import RoomCounts

__all__ = ["Stores", "Unavailable"]


@dataclass
class Stores:
    """The open connections and the stores built on them."""

    redis: aioredis.Redis
    mongo: AsyncMongoClient[dict[str, Any]]
    keys: Keys
    inbox: InboxStore
    messages: MessageStore
    rooms: RoomCounts
    groups: GroupStore
    group_cache: GroupCache
    feed: FeedStore
    feed_cache: FeedCache

    @classmethod
    def open(
        cls, *, redis_url: str, mongo_url: str, namespace: str, timeout_s: float,
        limits: InboxLimits, mongo_w: str = "majority",
    ) -> Stores:
        redis = connect_redis(redis_url, timeout_s)
        mongo = connect_mongo(mongo_url, timeout_s, mongo_w)
        keys = Keys(namespace)
        messages = MessageStore(mongo, namespace)
        groups = GroupStore(messages.db)
        feed = FeedStore(messages.db)
        return cls(redis, mongo, keys, InboxStore(redis, keys, limits), messages,
                   RoomCounts(redis, keys), groups, GroupCache(redis, keys, groups), feed,
                   FeedCache(redis, keys, feed))

    async def close(self) -> None:
        await self.redis.aclose()
        await self.mongo.close()
