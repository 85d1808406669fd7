"""The feed in MongoDB: the collections and their indexes. The stores over them
are ``follows_mongo.py`` (``FollowStore``), ``posts_mongo.py`` (``PostStore``)
and ``timeline_mongo.py`` (``TimelineStore``).

- ``follows`` ``{_id: "a|b", a, b}``: a follows b; ``fans`` ``{_id: "b|a"}``:
  b is followed by a (two row keys per follow, the ``_id`` making each
  idempotent): each list pages by seek on its own index, (a, b) and (b, a).
- ``users`` ``{_id, following, followers, pull_max, tl_floor}``: counts (only
  moved by a follow that was new), the newest post id of the user that was
  not pushed to timelines, and the id below which the user's timeline was
  trimmed.
- ``posts`` ``{_id: id, author, text, ts, repost_of, reply_to, deleted,
  pushed, fanout, counts}``; ids are time-ordered 53-bit integers (the mid
  generator), so the id is the sort key.
- ``timelines`` ``{_id: "user|id16", u, p, a}``: ids and sort keys only.
- ``likes`` ``{_id: "post|user"}``: a like is once per user, whatever Redis
  knows.
"""

from __future__ import annotations

from typing import Any

from pymongo import ASCENDING, DESCENDING
from pymongo.asynchronous.database import AsyncDatabase

from store.mongo_client import Index, ensure_indexes

__all__ = ["FEED_INDEXES", "ensure_feed_indexes", "tl_id"]

# Every read is an equality on the first key plus a range and sort on the
# second: SecantusDB answers ``_id`` ranges by scanning the collection (640 ms
# at 60,000 timeline entries, against 1.3 ms through (u, p)), mongod either way.
FEED_INDEXES: list[Index] = [
    ("follows", [("a", ASCENDING), ("b", ASCENDING)], {"name": "a_b"}),
    ("fans", [("b", ASCENDING), ("a", ASCENDING)], {"name": "b_a"}),
    ("posts", [("author", ASCENDING), ("_id", DESCENDING)], {"name": "author_id"}),
    ("posts", [("reply_to", ASCENDING), ("_id", DESCENDING)], {"name": "reply_id"}),
    ("posts", [("fanout", ASCENDING), ("_id", ASCENDING)], {"name": "fanout_id"}),
    ("timelines", [("u", ASCENDING), ("p", DESCENDING)], {"name": "user_post"}),
]


def tl_id(user: str, post: int) -> str:
    return f"{user}|{post:016d}"


async def ensure_feed_indexes(db: AsyncDatabase[dict[str, Any]]) -> None:
    await ensure_indexes(db, FEED_INDEXES)
