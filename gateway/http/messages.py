"""What users add to messages and conversations, over HTTP: who reacted to
a message (``GET /v1/messages/{mid}/reactions``) and the caller's settings
of a conversation (``PATCH /v1/conversations/{conv}``). Reacting and
editing are WebSocket ops (``react``, ``edit``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import FastAPI, Path, Query

from core.ids import MAX_MID
from gateway.http.common import JSON, READ, WRITE, Limit, User, UserCursor
from gateway.http.models import ConvSettingsOut, ConvSettingsPatch, Id, ReactionUsers, errors
from gateway.inbox.ops import MessageOps
from gateway.protocol import check_emoji

__all__ = ["install_message_features"]

Mid = Annotated[int, Path(ge=0, le=MAX_MID)]
Emoji = Annotated[str, Query(min_length=1, max_length=32, description="the emoji (1-32 "
                             "printable characters)")]


def install_message_features(app: FastAPI, ops: MessageOps) -> None:
    @app.get("/v1/messages/{mid}/reactions", response_model=ReactionUsers,
             responses={**READ, **errors(404)})
    async def reaction_users(user: User, mid: Mid, emoji: Emoji, cursor: UserCursor = None,
                             limit: Limit = 100) -> JSON:
        """Who reacted to a message of the caller's conversations with ``emoji``,
        in user id order; ``cursor``: the last page's."""
        users = await ops.reaction_users(user, mid, check_emoji(emoji), cursor, limit + 1)
        return JSON({"users": users[:limit],
                     "cursor": users[limit - 1] if len(users) > limit else None})

    @app.patch("/v1/conversations/{conv}", response_model=ConvSettingsOut,
               responses={**WRITE, **errors(403)})
    async def conversation_settings(user: User, conv: Id, body: ConvSettingsPatch) -> JSON:
        """The caller's settings of a conversation (a peer, or ``g:GROUP``):
        ``muted`` (no ``offline.msg`` / ``offline.group`` push events; unread
        still counts), ``pinned`` (first in ``GET /v1/conversations``, at most
        ``IM_PINNED_MAX``), ``archived``. Its devices get ``conv_settings``."""
        changes = {k: v for k, v in body.model_dump().items() if v is not None}
        new = await ops.set_conversation(user, conv, changes)
        return JSON({"ok": True, "conv": conv, "muted": new.muted, "pinned": new.pinned,
                     "archived": new.archived})
