"""The feed's store boundaries (follows, posts, timelines, its caches and
counters): one small Protocol each, as ``store.ports`` (which re-exports them)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["CounterStore", "Doc", "FeedCache", "FollowStore", "LikeRow", "PostStore",
           "TimelineStore"]

Doc = dict[str, Any]  # a post or user-profile document of the feed, as stored


@dataclass(frozen=True, slots=True)
class LikeRow:
    """A user's like of a post as stored: ``token`` names this like (the marks
    of its count's +1 and -1 carry it); ``counted``: its +1 is known to be in
    the counter. A row from before likes had tokens has ``""`` and counted."""

    token: str
    counted: bool


class FollowStore(Protocol):
    """Follows both ways and the follow counts."""

    async def follow(self, a: str, b: str) -> bool: ...

    async def unfollow(self, a: str, b: str) -> bool: ...

    async def page_ids(self, kind: str, user: str, after: str | None, limit: int
                       ) -> list[str]: ...

    async def existing(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (a follows b) pairs exist: point look-ups, one round trip."""
        ...

    async def all_following(self, user: str) -> list[str]: ...

    async def user(self, user: str) -> Doc: ...


class PostStore(Protocol):
    """Posts, likes and the authors whose posts are pulled at read time."""

    async def insert_post(self, doc: Doc) -> None: ...

    async def get_posts(self, ids: Sequence[int]) -> dict[int, Doc]: ...

    async def delete_post(self, post: int) -> None: ...

    async def by_author(self, author: str, before: int | None, limit: int, *,
                        top_level: bool = False, unpushed: bool = False) -> list[Doc]: ...

    async def by_authors(self, authors: Sequence[str], before: int | None, limit: int
                         ) -> list[Doc]: ...

    async def comments_of(self, post: int, before: int | None, limit: int) -> list[Doc]: ...

    async def set_fanout(self, post: int, state: str) -> None: ...

    async def stuck_fanouts(self, older_than: int, limit: int = 100) -> list[Doc]: ...

    async def flush_counts(self, counts: dict[int, dict[str, int]]) -> None: ...

    async def like_row(self, post: int, user: str) -> LikeRow | None:
        """The user's like of ``post``: inserted now (a new token, not counted
        yet), or the one already there; None if it was removed each time it
        was found (concurrent unlikes of the same user)."""
        ...

    async def like_of(self, post: int, user: str) -> LikeRow | None: ...

    async def like_counted(self, post: int, user: str, token: str) -> None:
        """The like named ``token`` (if still there) has its +1 in the counter."""
        ...

    # True if the like named ``token`` was there (and is gone now).
    async def drop_like(self, post: int, user: str, token: str) -> bool: ...

    async def pullers(self) -> dict[str, int]: ...


class TimelineStore(Protocol):
    """Per-user timelines: ids and sort keys only."""

    async def push(self, post: int, author: str, users: Sequence[str]) -> None: ...

    async def page(self, user: str, floor: int, before: int | None, limit: int
                   ) -> list[tuple[int, str]]: ...

    async def trim(self, user: str, keep: int) -> int | None: ...


class FeedCache(Protocol):
    """The feed's hot state in Redis (following sets, pullers, fan-outs under way,
    timeline floors and growth)."""

    async def following(self, user: str) -> set[str]: ...

    async def followed(self, a: str, b: str, yes: bool) -> None: ...

    async def pull_max(self, authors: Iterable[str]) -> dict[str, int]: ...

    async def set_pull(self, author: str, post: int) -> None: ...

    async def pending(self, author: str, post: int, yes: bool) -> None: ...

    async def pending_below(self, before: int | None, limit: int = 1000,
                            authors: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """Fan-outs under way below ``before``, newest first: at least those of
        ``authors`` (all, without them); callers filter by author."""

    async def floor(self, user: str) -> int: ...

    async def set_floor(self, user: str, value: int) -> None: ...

    async def grew(self, users: Sequence[str], keep: int, slack: int) -> None: ...

    async def due_trims(self, n: int) -> list[str]: ...

    async def trimmed(self, user: str, keep: int) -> None: ...


class CounterStore(Protocol):
    """Post counters (reposts, comments, likes) in Redis, flushed to MongoDB."""

    async def bump(self, post: int, field: str, delta: int = 1) -> None: ...

    async def like_once(self, post: int, user: str, token: str, counted: bool) -> int:
        """+1 to the likes of ``post`` for the like named ``token``, once however
        often asked, and never for one ``counted`` already: 1 moved now, 0
        moved before, -1 not moved because the like's -1 came first (it is
        being undone)."""
        ...

    async def unlike_once(self, post: int, user: str, token: str, counted: bool) -> bool:
        """-1 for the like named ``token``, once however often asked, and only if
        its +1 was counted (``counted``, or its +1 is marked): whether it moved."""
        ...

    async def counts(self, docs: Sequence[Doc]) -> dict[int, dict[str, int]]: ...

    async def dirty(self, n: int) -> tuple[dict[int, dict[str, int]], list[int]]: ...

    async def redirty(self, ids: Iterable[int]) -> None: ...
