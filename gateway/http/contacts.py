"""Privacy settings and blocks over HTTP (``gateway.contacts.service.Relations``);
the server API reads and sets any user's settings. Installed by
``gateway.http.api.build_http`` and ``gateway.http.server``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Query
from pydantic import BaseModel, ConfigDict, Field

from core.paging import seek_page
from gateway.contacts.service import Relations
from gateway.http.common import JSON, READ, WRITE, User, UserCursor, ok
from gateway.http.models import Ok, UserId

__all__ = ["PrivacyChange", "PrivacySettings", "install_contacts", "install_server_privacy"]

BLOCKS_LIMIT = 200


class PrivacySettings(BaseModel):
    dm: Literal["everyone", "contacts"] = Field(
        description="who may send this user 1:1 messages")
    presence: Literal["everyone", "contacts", "nobody"] = Field(
        description="who sees this user online and when it was last seen")
    group_add: Literal["everyone", "contacts"] = Field(
        description="who may put this user in a group")


class PrivacyChange(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dm: Literal["everyone", "contacts"] | None = None
    presence: Literal["everyone", "contacts", "nobody"] | None = None
    group_add: Literal["everyone", "contacts"] | None = None

    def changes(self) -> dict[str, str]:
        return {k: v for k, v in self.model_dump().items() if v is not None}


class BlockPage(BaseModel):
    users: list[str]
    cursor: str | None = Field(description="the next page's `cursor`; null on the last page")


def install_contacts(app: FastAPI, relations: Relations) -> None:
    @app.get("/v1/settings/privacy", response_model=PrivacySettings, responses=READ)
    async def my_privacy(user: User) -> JSON:
        """The caller's privacy settings (the node's defaults where unchanged)."""
        return JSON(await relations.settings(user))

    @app.patch("/v1/settings/privacy", response_model=PrivacySettings, responses=WRITE)
    async def change_privacy(user: User, body: PrivacyChange) -> JSON:
        """Change any of the caller's settings; answers them all."""
        return JSON(await relations.set_privacy(user, body.changes()))

    @app.post("/v1/blocks/{other}", response_model=Ok, responses=WRITE)
    async def block(user: User, other: UserId) -> JSON:
        """``other``'s 1:1 sends to the caller are ``forbidden`` from now on, its
        typing and receipts never reach the caller, the caller's presence is
        hidden from it, and it cannot add the caller to a group."""
        await relations.block(user, other)
        return ok()

    @app.delete("/v1/blocks/{other}", response_model=Ok, responses=READ)
    async def unblock(user: User, other: UserId) -> JSON:
        await relations.unblock(user, other)
        return ok()

    @app.get("/v1/blocks", response_model=BlockPage, responses=READ)
    async def blocks(user: User, cursor: UserCursor = None,
                     limit: Annotated[int, Query(ge=1, le=BLOCKS_LIMIT)] = 100) -> JSON:
        """Whom the caller blocked, by id."""
        users, last = seek_page(await relations.blocks_page(user, cursor, limit + 1), limit,
                                lambda u: u)
        return JSON({"users": users, "cursor": last})


def install_server_privacy(app: FastAPI, relations: Relations, key: Sequence[Any],
                           responses: dict[int | str, dict[str, Any]]) -> None:
    @app.get("/v1/server/users/{user}/privacy", response_model=PrivacySettings,
             responses=responses, dependencies=key)
    async def user_privacy(user: UserId) -> JSON:
        """A user's privacy settings."""
        return JSON(await relations.settings(user))

    @app.patch("/v1/server/users/{user}/privacy", response_model=PrivacySettings,
               responses=responses, dependencies=key)
    async def set_user_privacy(user: UserId, body: PrivacyChange) -> JSON:
        """Change a user's privacy settings (the product's own rules)."""
        return JSON(await relations.set_privacy(user, body.changes()))

