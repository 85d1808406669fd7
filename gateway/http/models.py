"""The HTTP API's types: ids, request bodies, answers and the error body.

Every id a client names (in a path, a query or a body) is one of two
annotated types checked by one validator: ``Id`` (conversations, groups,
rooms: ``g:GROUP`` allowed) and ``UserId`` (may not start with ``g:``).
Both match the whole value (``fullmatch``; a pydantic/FastAPI ``pattern``
only searches), so ``a*``, ``a b``, a NUL or a newline never reach a key or
a query. The answer models document ``/openapi.json``; the routes write
their JSON directly (stored message bytes pass through unparsed).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    WithJsonSchema,
)

from core.ids import MAX_MID
from gateway.auth import check_user_id
from gateway.protocol import ID_PATTERN

__all__ = [
    "ERROR_DESCRIPTIONS",
    "ConversationList",
    "ErrorBody",
    "MembersAdded",
    "Info",
    "GroupCreated",
    "Health",
    "HistoryPage",
    "Id",
    "Mid",
    "NewGroup",
    "NewMembers",
    "NewPost",
    "Ok",
    "PostOut",
    "PostPage",
    "Profile",
    "ReadMark",
    "RoomOnline",
    "SyncAck",
    "SyncPage",
    "UserId",
    "UserPage",
    "errors",
]

ID_CHARSET = "1-64 characters of [A-Za-z0-9_.:-]"


def _check_id(user: bool) -> AfterValidator:
    """The one id check: the contract's charset and length over the whole value;
    for a user id, also not ``g:...`` (that names a group)."""

    def check(value: str) -> str:
        if user:
            why = check_user_id(value)
            if why is not None:
                raise ValueError(why)
        elif not ID_PATTERN.fullmatch(value):
            raise ValueError(f"an id is {ID_CHARSET}")
        return value

    return AfterValidator(check)


def _id_schema(user: bool) -> WithJsonSchema:
    pattern = "^(?!g:)[A-Za-z0-9_.:-]{1,64}$" if user else "^[A-Za-z0-9_.:-]{1,64}$"
    return WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 64,
                           "pattern": pattern})


Id = Annotated[str, Field(strict=True), _check_id(user=False), _id_schema(user=False)]
UserId = Annotated[str, Field(strict=True), _check_id(user=True), _id_schema(user=True)]


def _integral(value: object) -> object:
    """JSON Schema's ``integer`` includes ``1.0``: an integral float is that int
    (anything else, a string included, stays refused by ``StrictInt``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


Mid = Annotated[StrictInt, Field(ge=0, le=MAX_MID), BeforeValidator(_integral)]


# -- request bodies ------------------------------------------------------------------
class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SyncAck(_Body):
    upto: Mid


class NewGroup(_Body):
    name: Annotated[str, Field(strict=True, min_length=1, max_length=128)]
    members: Annotated[list[UserId], Field(max_length=1000)] = []


class NewMembers(_Body):
    members: Annotated[list[UserId], Field(min_length=1, max_length=1000)]


class NewPost(_Body):
    """A post, a repost (``repost_of``, ``text`` may be empty) or a comment
    (``reply_to``), not both; ``text`` at most ``IM_FEED_TEXT_MAX`` characters
    (413 beyond); a referenced post must exist (404)."""

    text: Annotated[str, Field(strict=True)]
    repost_of: Mid | None = None
    reply_to: Mid | None = None


class ReadMark(_Body):
    mid: Mid


# -- answers -------------------------------------------------------------------------
class Ok(BaseModel):
    ok: Literal[True]


class Info(BaseModel):
    ws_url: str = Field(description="where clients open their WebSocket")


class Health(BaseModel):
    ok: Literal[True]
    node: str


class Message(BaseModel):
    """A ``msg`` (1:1: ``to``) or ``group_msg`` (``group``, ``seq``) as pushed."""

    model_config = ConfigDict(extra="allow")
    op: str
    mid: int
    from_: str = Field(alias="from")
    to: str | None = None
    group: str | None = None
    seq: int | None = None
    body: Any = None
    ts: int
    reply_to: int | None = Field(None, description="the mid of the message of this "
                                 "conversation it answers")
    edited: int | None = Field(None, description="when it was last edited (unix ms)")
    reactions: dict[str, int] | None = Field(None, description="emoji -> count; absent "
                                             "without reactions")


class SyncPage(BaseModel):
    msgs: list[Message]
    next: int
    more: bool


class HistoryPage(BaseModel):
    msgs: list[Message]
    next: int | None


class Conversation(BaseModel):
    conv: str
    unread: int
    last: Message | None
    peer_read: int | None = Field(None, description="1:1 only: the highest mid the peer "
                                  "has read (0: none yet); absent for groups, and when the "
                                  "store could not be asked")
    muted: bool = Field(False, description="the caller muted it: no offline push events")
    pinned: bool = Field(False, description="pinned: listed first on the first page")
    archived: bool = False


class ConversationList(BaseModel):
    total_unread: int
    conversations: list[Conversation]
    cursor: str | None = Field(description="the next page's `cursor`; null on the last page")


class ConvSettingsPatch(BaseModel):
    """Any of the three; those left out stay as they are."""

    model_config = ConfigDict(extra="forbid")
    muted: StrictBool | None = None
    pinned: StrictBool | None = None
    archived: StrictBool | None = None


class ConvSettingsOut(BaseModel):
    ok: Literal[True]
    conv: str
    muted: bool
    pinned: bool
    archived: bool


class ReactionUsers(BaseModel):
    users: list[str] = Field(description="who reacted with the emoji, in id order")
    cursor: str | None = Field(description="the next page's `cursor`; null on the last page")


class GroupCreated(BaseModel):
    group: str
    refused: list[str] = Field(description="members left out: each is in "
                               "IM_MAX_GROUPS_JOINED groups already")


class MembersAdded(BaseModel):
    ok: Literal[True]
    refused: list[str] = Field(description="users left out: each is in "
                               "IM_MAX_GROUPS_JOINED groups already")


class RoomOnline(BaseModel):
    room: str
    online: int = Field(description="connections in the room across live nodes")
    users: int = Field(description="distinct users in the room, summed per node (a user "
                       "connected through two nodes counts twice)")


class Profile(BaseModel):
    user: str
    following: int
    followers: int


class UserPage(BaseModel):
    users: list[str]
    cursor: str | None


class PostCounts(BaseModel):
    reposts: int
    comments: int
    likes: int


class DeletedPost(BaseModel):
    id: int
    deleted: Literal[True]


class Post(BaseModel):
    id: int
    author: str
    text: str
    ts: int
    repost_of: int | None
    reply_to: int | None
    counts: PostCounts
    original: Post | DeletedPost | None = None


class PostOut(BaseModel):
    post: Post


class PostPage(BaseModel):
    posts: list[Post]
    cursor: int | None


class ErrorDetail(BaseModel):
    code: Literal["bad_request", "unauthorized", "forbidden", "not_found", "too_large",
                  "rate_limited", "unavailable", "internal"]  # gateway.errors.CODES
    message: str


class ErrorBody(BaseModel):
    """Every refusal: the HTTP status of ``code`` and this body."""

    error: ErrorDetail


ERROR_DESCRIPTIONS = {
    400: "bad_request: a parameter or body field is invalid",
    401: "unauthorized: the bearer token is missing, expired or invalid",
    403: "forbidden: not allowed for this caller",
    404: "not_found",
    413: "too_large: the request body (IM_HTTP_BODY_MAX) or a field is over its limit",
    429: "rate_limited: over the per-user HTTP rate (IM_HTTP_RATE, IM_HTTP_BURST)",
    500: "internal: an unexpected error (logged by the node)",
    503: "unavailable: a dependency is down; retry later",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, each with ``ErrorBody``."""
    return {s: {"model": ErrorBody, "description": ERROR_DESCRIPTIONS[s]} for s in statuses}


class PresenceState(BaseModel):
    online: bool | None = Field(None, description="absent when hidden")
    last_seen: int | None = Field(None, description="unix ms: now while online, else the "
                                  "last disconnect; absent when hidden")
    hidden: bool | None = Field(None, description="true: this user's privacy settings "
                                "hide its presence from the caller")


class PresenceStates(BaseModel):
    users: dict[str, PresenceState]
