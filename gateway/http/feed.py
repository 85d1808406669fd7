"""The feed's HTTP routes: follows and relations, posts, likes, the timeline.

Each route calls ``gateway.feed.service.FeedService`` and answers its JSON; errors are
the service's ``ProtocolError`` codes (documented per route in ``responses``).
Installed by ``gateway.http.api.build_http``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Query
from pydantic import BaseModel

from core.seek_cursor import MAX_CURSOR
from gateway.feed.service import FeedService
from gateway.http.common import (
    JSON,
    READ,
    WRITE,
    Cursor,
    Limit,
    PostId,
    User,
    UserCursor,
    ok,
)
from gateway.http.models import NewPost, Ok, PostOut, PostPage, Profile, UserId, UserPage, errors

__all__ = ["FriendsCursor", "Relation", "install_feed"]

FRIENDS_LIMIT = 100
FriendsCursor = Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR,
                                            description="opaque: the last page's `cursor`")]
FriendsLimit = Annotated[int, Query(ge=1, le=FRIENDS_LIMIT)]


class Relation(BaseModel):
    """Between the caller and a user; ``friends``: both ways."""

    following: bool
    followed_by: bool
    friends: bool


def install_feed(app: FastAPI, feed: FeedService) -> None:
    """Every feed route, on ``app``."""
    _follows(app, feed)
    _posts(app, feed)


def _follows(app: FastAPI, feed: FeedService) -> None:
    @app.post("/v1/follow/{other}", response_model=Ok, responses={**READ, **errors(403)})
    async def follow(user: User, other: UserId) -> JSON:
        """Follow ``other``; 403 past IM_FEED_FOLLOW_MAX follows."""
        await feed.follow(user, other, True)
        return ok()

    @app.delete("/v1/follow/{other}", response_model=Ok, responses=READ)
    async def unfollow(user: User, other: UserId) -> JSON:
        await feed.follow(user, other, False)
        return ok()

    @app.get("/v1/relation/{other}", response_model=Relation, responses=READ)
    async def relation(user: User, other: UserId) -> JSON:
        """Whether the caller follows ``other``, is followed by ``other``, both."""
        return JSON(await feed.relation(user, other))

    @app.get("/v1/users/{other}", response_model=Profile, responses=READ)
    async def profile(_: User, other: UserId) -> JSON:
        """Follow counts (an extension of the contract)."""
        return JSON(await feed.profile(other))

    @app.get("/v1/users/{other}/following", response_model=UserPage, responses=READ)
    async def following(_: User, other: UserId, cursor: UserCursor = None,
                        limit: Limit = 50) -> JSON:
        """Who ``other`` follows, by id, seek-paginated (an extension)."""
        return JSON(await feed.follow_page("following", other, cursor, limit))

    @app.get("/v1/users/{other}/followers", response_model=UserPage, responses=READ)
    async def followers(_: User, other: UserId, cursor: UserCursor = None,
                        limit: Limit = 50) -> JSON:
        """Who follows ``other``, by id, seek-paginated (an extension)."""
        return JSON(await feed.follow_page("followers", other, cursor, limit))

    @app.get("/v1/users/{other}/friends", response_model=UserPage, responses=READ)
    async def friends(_: User, other: UserId, cursor: FriendsCursor = None,
                      limit: FriendsLimit = 50) -> JSON:
        """Users ``other`` follows who follow ``other`` back, by id. A page walks
        ``other``'s following list (never its followers): at most
        IM_FEED_FOLLOW_MAX / 200 + 1 rounds of two indexed queries. ``cursor``
        is opaque; one not handed out for this user's list is a 400."""
        return JSON(await feed.friends(other, cursor, limit))


def _posts(app: FastAPI, feed: FeedService) -> None:
    @app.get("/v1/users/{other}/posts", response_model=PostPage, responses=READ)
    async def user_posts(_: User, other: UserId, cursor: Cursor = None,
                         limit: Limit = 50) -> JSON:
        return JSON(await feed.user_posts(other, cursor, limit))

    @app.post("/v1/posts", response_model=PostOut, responses={**WRITE, **errors(404)})
    async def create_post(user: User, body: NewPost) -> JSON:
        return JSON({"post": await feed.create(user, body.text, body.repost_of,
                                               body.reply_to)})

    @app.get("/v1/posts/{post}", response_model=PostOut, responses={**READ, **errors(404)})
    async def get_post(_: User, post: PostId) -> JSON:
        """One post with its counts (a repost carries ``original``); 404 once deleted."""
        return JSON({"post": await feed.post(post)})

    @app.delete("/v1/posts/{post}", response_model=Ok, responses={**READ, **errors(403, 404)})
    async def delete_post(user: User, post: PostId) -> JSON:
        """Author only."""
        await feed.delete(user, post)
        return ok()

    @app.post("/v1/posts/{post}/like", response_model=Ok, responses={**READ, **errors(404)})
    async def like(user: User, post: PostId) -> JSON:
        await feed.like(user, post)
        return ok()

    @app.delete("/v1/posts/{post}/like", response_model=Ok,
                responses={**READ, **errors(404)})
    async def unlike(user: User, post: PostId) -> JSON:
        """Undo the caller's like; without one, nothing changes (still ok)."""
        await feed.unlike(user, post)
        return ok()

    @app.get("/v1/posts/{post}/comments", response_model=PostPage,
             responses={**READ, **errors(404)})
    async def comments(_: User, post: PostId, cursor: Cursor = None,
                       limit: Limit = 50) -> JSON:
        return JSON(await feed.comments(post, cursor, limit))

    @app.get("/v1/timeline", response_model=PostPage, responses=READ)
    async def timeline(user: User, cursor: Cursor = None,
                       limit: Limit = 50) -> JSON:
        """Posts of the people the caller follows and its own, newest first."""
        return JSON(await feed.timeline(user, cursor, limit))
