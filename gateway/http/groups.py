"""The groups' HTTP routes: create, members, name and owner, leave, dissolve,
the caller's groups, member pages and who read a message.

Each route calls ``gateway.groups.admin.GroupAdmin`` and answers its JSON;
errors are its ``ProtocolError`` codes (documented per route in
``responses``): 404 for a group that does not exist or was dissolved, 403
for a caller who is not a member (or not the owner where only the owner may).
Installed by ``gateway.http.api.build_http``.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.ids import MAX_MID
from core.seek_cursor import MAX_CURSOR
from gateway.groups.admin import GroupAdmin
from gateway.http.common import JSON, READ, WRITE, User, ok
from gateway.http.models import (
    GroupCreated,
    Id,
    MembersAdded,
    NewGroup,
    NewMembers,
    Ok,
    UserId,
    UserPage,
    errors,
)

__all__ = ["GroupChange", "GroupInfo", "GroupList", "ReadStatus", "install_groups"]

MEMBERS_LIMIT = 1000
GROUPS_LIMIT = 200
MemberCursor = Annotated[str | None, Query(min_length=1, max_length=MAX_CURSOR,
                                           description="opaque: the last page's `cursor`")]
MemberLimit = Annotated[int, Query(ge=1, le=MEMBERS_LIMIT)]
Mid = Annotated[int, Path(ge=0, le=MAX_MID)]
GroupName = Annotated[str, Field(strict=True, min_length=1, max_length=128)]

MEMBER_READ = {**READ, **errors(403, 404)}  # members only; no such group
OWNER_WRITE = {**WRITE, **errors(403, 404)}  # owner only; no such group


class GroupChange(BaseModel):
    """A new name and/or a new owner (a current member); at least one."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"minProperties": 1})
    name: GroupName | None = None
    owner: UserId | None = None

    @model_validator(mode="after")
    def _something(self) -> GroupChange:
        if self.name is None and self.owner is None:
            raise ValueError("name or owner is required")
        return self


class GroupInfo(BaseModel):
    group: str
    name: str
    owner: str
    members: int  # how many


class GroupList(BaseModel):
    groups: list[GroupInfo]
    cursor: str | None = Field(description="the next page's `cursor`; null on the last page")


class ReadStatus(BaseModel):
    """Of the members who could see the message (joined before it, its sender
    left out): how many read it, how many not; ``users`` who read it in a
    group of up to IM_GROUP_WRITE_DIFFUSION_MAX members."""

    read: int
    unread: int
    users: list[str] | None = None


def install_groups(app: FastAPI, admin: GroupAdmin) -> None:
    """Every group route, on ``app``."""
    _membership(app, admin)
    _group(app, admin)


def _membership(app: FastAPI, admin: GroupAdmin) -> None:
    @app.post("/v1/groups", response_model=GroupCreated, responses={**WRITE, **errors(403)})
    async def create_group(user: User, body: NewGroup) -> JSON:
        """Create a group; the caller is its owner and a member. 403 when the
        caller owns ``IM_MAX_GROUPS_OWNED`` groups or is in
        ``IM_MAX_GROUPS_JOINED``; 429 past ``IM_GROUP_CREATES_PER_MIN``."""
        group, refused = await admin.create(user, body.name, body.members)
        return JSON({"group": group, "refused": refused})

    @app.post("/v1/groups/{group}/members", response_model=MembersAdded, responses=OWNER_WRITE)
    async def add_members(user: User, group: Id, body: NewMembers) -> JSON:
        """Owner only; new members see messages from now on."""
        refused = await admin.add(user, group, body.members)
        return JSON({"ok": True, "refused": refused})

    @app.delete("/v1/groups/{group}/members/{member}", response_model=Ok,
                responses=MEMBER_READ)
    async def remove_member(user: User, group: Id, member: UserId) -> JSON:
        """Owner only; the member gets nothing sent after this answer."""
        await admin.remove(user, group, member)
        return ok()

    @app.post("/v1/groups/{group}/leave", response_model=Ok, responses=MEMBER_READ)
    async def leave(user: User, group: Id) -> JSON:
        """The caller leaves; the owner must hand the group over first (400)."""
        await admin.leave(user, group)
        return ok()

    @app.get("/v1/groups/{group}/members", response_model=UserPage, responses=MEMBER_READ)
    async def members(user: User, group: Id, cursor: MemberCursor = None,
                      limit: MemberLimit = 100) -> JSON:
        """Members only: the members by id, seek-paginated."""
        return JSON(await admin.members_page(user, group, cursor, limit))


def _group(app: FastAPI, admin: GroupAdmin) -> None:
    @app.get("/v1/groups", response_model=GroupList, responses=READ)
    async def my_groups(user: User, cursor: MemberCursor = None,
                        limit: Annotated[int, Query(ge=1, le=GROUPS_LIMIT)] = 100) -> JSON:
        """The caller's groups in id order, ``limit`` a page (the documents of
        one page only are read)."""
        return JSON(await admin.list_groups(user, cursor, limit))

    @app.get("/v1/groups/{group}", response_model=GroupInfo, responses=MEMBER_READ)
    async def group_info(user: User, group: Id) -> JSON:
        """Members only."""
        return JSON(await admin.info(user, group))

    @app.patch("/v1/groups/{group}", response_model=Ok, responses=OWNER_WRITE)
    async def change_group(user: User, group: Id, body: GroupChange) -> JSON:
        """Owner only: rename, and/or hand the group to another member (400 if
        ``owner`` is not one)."""
        await admin.update(user, group, name=body.name, owner=body.owner)
        return ok()

    @app.delete("/v1/groups/{group}", response_model=Ok, responses=MEMBER_READ)
    async def dissolve(user: User, group: Id) -> JSON:
        """Owner only: later sends are `not_found`; history stays readable to
        the former members."""
        await admin.dissolve(user, group)
        return ok()

    @app.get("/v1/groups/{group}/reads/{mid}", response_model=ReadStatus,
             responses=MEMBER_READ)
    async def reads(user: User, group: Id, mid: Mid) -> JSON:
        """Members only: who read message ``mid`` (404 if not in the group)."""
        return JSON(await admin.reads(user, group, mid))
