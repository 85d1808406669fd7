"""In-memory fakes of the feed's store Protocols (``FollowStore``, ``PostStore``,
``TimelineStore``, ``FeedCache``, ``CounterStore``) and of the fan-out's
``UserPusher``; see ``fakes.py`` for what the fakes promise."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from store.feed_ports import LikeRow
from tests.core.fakes import Faulty

__all__ = ["FakeCounters", "FakeFeedCache", "FakeFollows", "FakePosts", "FakePusher",
           "FakeTimelines"]

Doc = dict[str, Any]
COUNT_FIELDS = {"r": "reposts", "c": "comments", "l": "likes"}


class FakeFollows(Faulty):
    """Follow edges (a follows b); counts derived from them."""

    dependency = "mongo"

    def __init__(self) -> None:
        super().__init__()
        self.edges: set[tuple[str, str]] = set()

    async def follow(self, a: str, b: str) -> bool:
        self._up("follow")
        new = (a, b) not in self.edges
        self.edges.add((a, b))
        return new

    async def unfollow(self, a: str, b: str) -> bool:
        self._up("unfollow")
        gone = (a, b) in self.edges
        self.edges.discard((a, b))
        return gone

    async def page_ids(self, kind: str, user: str, after: str | None, limit: int
                       ) -> list[str]:
        self._up("page_ids")
        ids = sorted(b for a, b in self.edges if a == user) if kind == "following" else \
            sorted(a for a, b in self.edges if b == user)
        return [i for i in ids if not after or i > after][:limit]

    async def existing(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        self._up("existing")
        return {p for p in pairs if p in self.edges}

    async def all_following(self, user: str) -> list[str]:
        return await self.page_ids("following", user, None, 1_000_000)

    async def user(self, user: str) -> Doc:
        self._up("user")
        return {"_id": user, "following": sum(a == user for a, _ in self.edges),
                "followers": sum(b == user for _, b in self.edges)}


class FakePosts(Faulty):
    """Posts by id (copies in, copies out), likes; records its list queries."""

    dependency = "mongo"

    def __init__(self) -> None:
        super().__init__()
        self.docs: dict[int, Doc] = {}
        self.likes: dict[tuple[int, str], LikeRow] = {}
        self._tokens = itertools.count(1)
        self.queries: list[tuple[str, tuple[str, ...]]] = []

    async def insert_post(self, doc: Doc) -> None:
        self._up("insert_post")
        self.docs[doc["_id"]] = copy.deepcopy(doc)

    async def get_posts(self, ids: Sequence[int]) -> dict[int, Doc]:
        self._up("get_posts")
        return {i: copy.deepcopy(self.docs[i]) for i in ids if i in self.docs}

    async def delete_post(self, post: int) -> None:
        self._up("delete_post")
        if post in self.docs:
            self.docs[post]["deleted"] = True

    def _newest(self, keep: Callable[[Doc], bool], before: int | None, limit: int
                ) -> list[Doc]:
        found = [d for i, d in self.docs.items() if (before is None or i < before) and keep(d)]
        found.sort(key=lambda d: d["_id"], reverse=True)
        return copy.deepcopy(found[:limit])

    async def by_author(self, author: str, before: int | None, limit: int, *,
                        top_level: bool = False, unpushed: bool = False) -> list[Doc]:
        self._up("by_author")
        self.queries.append(("by_author", (author,)))
        return self._newest(lambda d: d["author"] == author and not d["deleted"]
                            and not (top_level and d.get("reply_to") is not None)
                            and not (unpushed and d["pushed"]), before, limit)

    async def by_authors(self, authors: Sequence[str], before: int | None, limit: int
                         ) -> list[Doc]:
        self._up("by_authors")
        self.queries.append(("by_authors", tuple(authors)))
        return self._newest(lambda d: d["author"] in authors and not d["deleted"]
                            and d.get("reply_to") is None, before, limit)

    async def comments_of(self, post: int, before: int | None, limit: int) -> list[Doc]:
        self._up("comments_of")
        return self._newest(lambda d: d.get("reply_to") == post and not d["deleted"],
                            before, limit)

    async def set_fanout(self, post: int, state: str) -> None:
        self._up("set_fanout")
        self.docs[post]["fanout"] = state

    async def stuck_fanouts(self, older_than: int, limit: int = 100) -> list[Doc]:
        self._up("stuck_fanouts")
        return [copy.deepcopy(d) for i, d in sorted(self.docs.items())
                if d["fanout"] == "pending" and i < older_than][:limit]

    async def flush_counts(self, counts: dict[int, dict[str, int]]) -> None:
        self._up("flush_counts")
        for post, c in counts.items():
            self.docs[post]["counts"] = dict(c)

    async def like_row(self, post: int, user: str) -> LikeRow:
        self._up("like_row")
        row = self.likes.setdefault((post, user), LikeRow(f"t{next(self._tokens)}", False))
        self._answer("like_row")
        return row

    async def like_of(self, post: int, user: str) -> LikeRow | None:
        self._up("like_of")
        return self.likes.get((post, user))

    async def like_counted(self, post: int, user: str, token: str) -> None:
        self._up("like_counted")
        row = self.likes.get((post, user))
        if row is not None and row.token == token:
            self.likes[(post, user)] = LikeRow(token, True)
        self._answer("like_counted")

    async def drop_like(self, post: int, user: str, token: str) -> bool:
        self._up("drop_like")
        row = self.likes.get((post, user))
        gone = row is not None and row.token == token
        if gone:
            del self.likes[(post, user)]
        self._answer("drop_like")
        return gone

    async def pullers(self) -> dict[str, int]:
        self._up("pullers")
        out: dict[str, int] = {}
        for i, d in self.docs.items():
            if not d["pushed"]:
                out[d["author"]] = max(out.get(d["author"], 0), i)
        return out


class FakeTimelines(Faulty):
    """user -> {post: author}."""

    dependency = "mongo"

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, dict[int, str]] = {}

    async def push(self, post: int, author: str, users: Sequence[str]) -> None:
        self._up("push")
        for u in users:
            self.entries.setdefault(u, {})[post] = author

    async def page(self, user: str, floor: int, before: int | None, limit: int
                   ) -> list[tuple[int, str]]:
        self._up("page")
        mine = self.entries.get(user, {}).items()
        return sorted(((p, a) for p, a in mine if p > floor and (before is None or p < before)),
                      reverse=True)[:limit]

    async def trim(self, user: str, keep: int) -> int | None:
        self._up("trim")
        posts = sorted(self.entries.get(user, {}), reverse=True)
        if len(posts) <= keep:
            return None
        for p in posts[keep:]:
            del self.entries[user][p]
        return posts[keep]


class FakeFeedCache(Faulty):
    """Following sets (loaded from the follow store), pull authors (loaded from
    the post store), fan-outs under way, timeline floors and growth."""

    dependency = "redis"

    def __init__(self, follows: FakeFollows, posts: FakePosts) -> None:
        super().__init__()
        self.follows = follows
        self.posts = posts
        self._following: dict[str, set[str]] = {}
        self._pull: dict[str, int] | None = None
        self.in_flight: set[tuple[str, int]] = set()
        self.floors: dict[str, int] = {}
        self.growth: dict[str, int] = {}
        self.trims: set[str] = set()

    async def following(self, user: str) -> set[str]:
        self._up("following")
        if user not in self._following:
            self._following[user] = set(await self.follows.all_following(user))
        return set(self._following[user])

    async def followed(self, a: str, b: str, yes: bool) -> None:
        self._up("followed")
        if a in self._following:
            (self._following[a].add if yes else self._following[a].discard)(b)

    async def pull_max(self, authors: Iterable[str]) -> dict[str, int]:
        self._up("pull_max")
        if self._pull is None:
            self._pull = await self.posts.pullers()
        return {a: self._pull[a] for a in authors if a in self._pull}

    async def set_pull(self, author: str, post: int) -> None:
        self._up("set_pull")
        if self._pull is not None:  # else loaded from the post store on first read
            self._pull[author] = max(self._pull.get(author, 0), post)

    async def pending(self, author: str, post: int, yes: bool) -> None:
        self._up("pending")
        (self.in_flight.add if yes else self.in_flight.discard)((author, post))

    async def pending_below(self, before: int | None, limit: int = 1000,
                            authors: Iterable[str] | None = None) -> list[tuple[str, int]]:
        self._up("pending_below")
        wanted = None if authors is None else set(authors)
        below = [(a, p) for a, p in self.in_flight
                 if (before is None or p < before) and (wanted is None or a in wanted)]
        return sorted(below, key=lambda ap: ap[1], reverse=True)[:limit]

    async def floor(self, user: str) -> int:
        self._up("floor")
        return self.floors.get(user, 0)

    async def set_floor(self, user: str, value: int) -> None:
        self._up("set_floor")
        self.floors[user] = max(self.floors.get(user, 0), value)

    async def grew(self, users: Sequence[str], keep: int, slack: int) -> None:
        self._up("grew")
        for u in users:
            self.growth[u] = self.growth.get(u, 0) + 1
            if self.growth[u] > keep + slack:
                self.trims.add(u)

    async def due_trims(self, n: int) -> list[str]:
        self._up("due_trims")
        due = sorted(self.trims)[:n]
        self.trims.difference_update(due)
        return due

    async def trimmed(self, user: str, keep: int) -> None:
        self._up("trimmed")
        self.growth[user] = keep


class FakeCounters(Faulty):
    """Per-post counters (``r``, ``c``, ``l``); a post never bumped here shows
    the counts flushed to its document."""

    dependency = "redis"

    def __init__(self) -> None:
        super().__init__()
        self.values: dict[int, dict[str, int]] = {}
        self.dirty_ids: set[int] = set()
        self.marks: set[tuple[int, str, str, str]] = set()  # a like's +1 / -1 moved

    async def bump(self, post: int, field: str, delta: int = 1) -> None:
        self._up("bump")
        v = self.values.setdefault(post, dict.fromkeys(COUNT_FIELDS, 0))
        v[field] += delta
        self.dirty_ids.add(post)

    async def like_once(self, post: int, user: str, token: str, counted: bool) -> int:
        self._up("like_once")
        if (post, user, token, "-") in self.marks:
            return -1
        moved = 0 if counted else self._mark(post, user, token, "+", 1)
        self._answer("like_once")
        return moved

    async def unlike_once(self, post: int, user: str, token: str, counted: bool) -> bool:
        self._up("unlike_once")
        if (post, user, token, "-") in self.marks:
            return False
        if not counted and (post, user, token, "+") not in self.marks:
            self.marks.add((post, user, token, "-"))
            return False
        moved = self._mark(post, user, token, "-", -1) == 1
        self._answer("unlike_once")
        return moved

    def _mark(self, post: int, user: str, token: str, sign: str, delta: int) -> int:
        if (post, user, token, sign) in self.marks:
            return 0
        self.marks.add((post, user, token, sign))
        v = self.values.setdefault(post, dict.fromkeys(COUNT_FIELDS, 0))
        v["l"] += delta
        self.dirty_ids.add(post)
        return 1

    def _named(self, doc: Doc) -> dict[str, int]:
        v = self.values.get(doc["_id"])
        if v is None:
            flushed = doc.get("counts") or {}
            return {name: int(flushed.get(name, 0)) for name in COUNT_FIELDS.values()}
        return {name: v[f] for f, name in COUNT_FIELDS.items()}

    async def counts(self, docs: Sequence[Doc]) -> dict[int, dict[str, int]]:
        self._up("counts")
        return {d["_id"]: self._named(d) for d in docs}

    async def dirty(self, n: int) -> tuple[dict[int, dict[str, int]], list[int]]:
        self._up("dirty")
        taken = sorted(self.dirty_ids)[:n]
        self.dirty_ids.difference_update(taken)
        return {p: self._named({"_id": p}) for p in taken}, []

    async def redirty(self, ids: Iterable[int]) -> None:
        self._up("redirty")
        self.dirty_ids.update(ids)


class FakePusher:
    """``gateway.feed.fanout.UserPusher``: records each push."""

    def __init__(self) -> None:
        self.pushed: list[tuple[list[str], bytes]] = []

    async def push_users(self, users: list[str], frame: bytes) -> None:
        self.pushed.append((list(users), frame))


if TYPE_CHECKING:  # mypy proves each fake satisfies its Protocol
    from gateway.feed.fanout import UserPusher
    from store.ports import CounterStore, FeedCache, FollowStore, PostStore, TimelineStore

    _f: FollowStore = FakeFollows()
    _p: PostStore = FakePosts()
    _t: TimelineStore = FakeTimelines()
    _fc: FeedCache = FakeFeedCache(FakeFollows(), FakePosts())
    _c: CounterStore = FakeCounters()
    _u: UserPusher = FakePusher()
