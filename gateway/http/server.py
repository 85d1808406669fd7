"""The server API: ``/v1/server/*``, for the product's backend (docs/protocol.md,
Server API). Authenticated by ``X-API-Key`` (``IM_API_KEYS``) in ``HttpGuard``;
a user's token is never accepted here, nor a key on the user calls.

Each call goes through the same services as the user's own ops (one code
path: ``ChatService.send``, ``GroupService.send``, the router's room publish
and ``tell``), and answers once it took effect where it must: a send once
durable, a room publish once the broker confirmed it, a disconnect, ban or
revocation once every node holding a device of the user was told (the
broker's confirm) and the state a handshake reads is written.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Security
from fastapi.security import APIKeyHeader
from pydantic import Field, StrictInt

from core.ids import MAX_MID
from gateway import frames
from gateway.chat.service import ChatService
from gateway.contacts.service import Relations
from gateway.delivery import Pusher, handed_over, push_group_sent, push_sent
from gateway.events import Events
from gateway.groups.service import GroupService
from gateway.hooks.client import Hooks, send_vet
from gateway.http.common import UserList, user_list
from gateway.http.contacts import install_server_privacy
from gateway.http.devices import install_server_devices
from gateway.http.models import Id, Ok, UserId, _Body, errors
from gateway.moderation import MAX_BAN_S, Moderation
from gateway.presence.devices import Devices
from gateway.protocol import encode_body
from gateway.rooms.service import LiveRooms

__all__ = ["API_KEY_HEADER", "ServerDeps", "install_server_api"]

API_KEY_HEADER = "X-API-Key"
SERVER_PREFIX = "/v1/server/"
MAX_NOTIFY_USERS = 1000

api_key = APIKeyHeader(name=API_KEY_HEADER, auto_error=False, scheme_name="ApiKey",
                       description="one of IM_API_KEYS (the product's backend only)")
KEY = [Security(api_key)]
SERVER = errors(400, 401, 404, 413, 500, 503)


@dataclass(frozen=True)
class ServerDeps:
    chat: ChatService
    groups: GroupService
    live: LiveRooms
    pusher: Pusher
    moderation: Moderation
    # A frame to every device of these users on every node; the devices reached.
    notify: Callable[[list[str], bytes], Awaitable[int]]
    # (devices on live nodes, last disconnect in unix s) of each user
    presence: Callable[[list[str]], Awaitable[list[tuple[int, int | None]]]]
    max_body: int
    events: Events | None = None
    push_confirm_s: float = 0.5  # IM_PUSH_CONFIRM_MS
    relations: Relations | None = None  # users' privacy settings
    hooks: Hooks | None = None  # the product's hooks: server sends are hooked too
    devices: Devices | None = None  # users' devices, one's disconnect


# -- bodies and answers ------------------------------------------------------------
class ServerSend(_Body):
    from_: Annotated[UserId, Field(alias="from")]
    to: UserId
    cmid: Id
    body: Any
    reply_to: Annotated[StrictInt | None, Field(ge=1, le=MAX_MID, description="a mid of this "
                                                "conversation the message answers")] = None


class ServerGroupSend(_Body):
    from_: Annotated[UserId, Field(alias="from")]
    group: Id
    cmid: Id
    body: Any
    reply_to: Annotated[StrictInt | None, Field(ge=1, le=MAX_MID, description="a mid of this "
                                                "group the message answers")] = None


class RoomPublish(_Body):
    body: Any
    prio: Annotated[StrictInt, Field(ge=0, le=1)] = 0
    from_: Annotated[UserId, Field(alias="from")] = "system"


class Notify(_Body):
    users: Annotated[list[UserId], Field(min_length=1, max_length=MAX_NOTIFY_USERS)]
    body: Any


class Ban(_Body):
    seconds: Annotated[StrictInt, Field(ge=1, le=MAX_BAN_S)]


class Revoke(_Body):
    before: Annotated[StrictInt, Field(ge=0, le=4_102_444_800)]  # unix s, before 2100


class Mute(_Body):
    seconds: Annotated[StrictInt, Field(ge=1, le=MAX_BAN_S)]


class Sent(_Body):
    mid: int
    ts: int


class GroupSent(_Body):
    mid: int
    seq: int
    ts: int


class Reached(_Body):
    online: int  # devices connected (their frames were queued)


class UserPresence(_Body):
    online: bool
    devices: int
    last_seen: int | None  # unix ms: now while online, else the last disconnect


class PresencePage(_Body):
    users: dict[str, UserPresence]


def install_server_api(app: FastAPI, deps: ServerDeps) -> None:
    d = deps
    if d.relations is not None:
        install_server_privacy(app, d.relations, KEY, SERVER)
    if d.devices is not None:
        install_server_devices(app, d.devices, KEY, SERVER)

    @app.post("/v1/server/send", response_model=Sent, responses=SERVER, dependencies=KEY)
    async def server_send(req: ServerSend) -> dict[str, Any]:
        """A 1:1 message from ``from`` (a system account or any user): durable and
        idempotent by (``from``, ``cmid``) exactly like the WebSocket ``send``."""
        body = encode_body(req.body, d.max_body)
        vetted = [body]
        vet = send_vet(d.hooks, req.from_, {"to": req.to}, req.cmid, vetted)
        result = await d.chat.send(req.from_, req.to, req.cmid, body, vet=vet,
                                   reply_to=req.reply_to or 0)
        confirms: list[asyncio.Future[None]] = []
        push_sent(d.pusher, d.events, req.from_, req.to, result, vetted[0], confirms=confirms)
        await handed_over(confirms, d.push_confirm_s)
        return {"mid": result.mid, "ts": result.ts}

    @app.post("/v1/server/group_send", response_model=GroupSent, responses=SERVER,
              dependencies=KEY)
    async def server_group_send(req: ServerGroupSend) -> dict[str, Any]:
        """A group message from ``from``, who need not be a member."""
        body = encode_body(req.body, d.max_body)
        vetted = [body]
        result = await d.groups.send(
            req.from_, req.group, req.cmid, body, as_server=True,
            vet=send_vet(d.hooks, req.from_, {"group": req.group}, req.cmid, vetted),
            reply_to=req.reply_to or 0)
        confirms: list[asyncio.Future[None]] = []
        push_group_sent(d.pusher, d.events, req.from_, req.group, result, vetted[0],
                        confirms=confirms)
        await handed_over(confirms, d.push_confirm_s)
        return {"mid": result.mid, "seq": result.seq, "ts": result.ts}

    @app.post("/v1/server/rooms/{room}/publish", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def room_publish(room: Id, req: RoomPublish) -> dict[str, Any]:
        """To every member of ``room`` on every node, once the broker confirmed it."""
        await d.live.publish(room, encode_body(req.body, d.max_body), req.prio, req.from_)
        return {"ok": True}

    @app.post("/v1/server/notify", response_model=Reached, responses=SERVER,
              dependencies=KEY)
    async def notify(req: Notify) -> dict[str, Any]:
        """A ``notice`` frame to every connected device of these users; not stored."""
        users = list(dict.fromkeys(req.users))
        frame = frames.notice(encode_body(req.body, d.max_body), int(time.time() * 1000))
        return {"online": await d.notify(users, frame)}

    @app.post("/v1/server/users/{user}/disconnect", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def disconnect(user: UserId) -> dict[str, Any]:
        """Every connection of ``user``, on every node, is closed with 4003."""
        await d.moderation.disconnect(user)
        return {"ok": True}

    @app.post("/v1/server/users/{user}/ban", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def ban(user: UserId, req: Ban) -> dict[str, Any]:
        """While banned, handshakes and HTTP calls of ``user`` are refused (403) and
        open connections are closed with 4003."""
        await d.moderation.ban(user, req.seconds)
        return {"ok": True}

    @app.delete("/v1/server/users/{user}/ban", response_model=Ok, responses=SERVER,
                dependencies=KEY)
    async def unban(user: UserId) -> dict[str, Any]:
        await d.moderation.unban(user)
        return {"ok": True}

    @app.post("/v1/server/users/{user}/revoke", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def revoke(user: UserId, req: Revoke) -> dict[str, Any]:
        """Tokens of ``user`` issued (``iat``) before ``before`` are refused from
        now on; connections opened with one are closed with 4003."""
        await d.moderation.revoke(user, float(req.before))
        return {"ok": True}

    @app.post("/v1/server/rooms/{room}/mute/{user}", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def mute(room: Id, user: UserId, req: Mute) -> dict[str, Any]:
        """``user``'s ``room_send`` to ``room`` is ``forbidden`` until then, on every node."""
        await d.moderation.mute(room, user, req.seconds)
        return {"ok": True}

    @app.delete("/v1/server/rooms/{room}/mute/{user}", response_model=Ok, responses=SERVER,
                dependencies=KEY)
    async def unmute(room: Id, user: UserId) -> dict[str, Any]:
        await d.moderation.unmute(room, user)
        return {"ok": True}

    @app.post("/v1/server/rooms/{room}/kick/{user}", response_model=Ok, responses=SERVER,
              dependencies=KEY)
    async def kick(room: Id, user: UserId) -> dict[str, Any]:
        """``user`` leaves ``room`` on every node; each of its connections there is
        told ``{"op":"left","room","reason":"kicked"}``."""
        await d.moderation.kick(room, user)
        return {"ok": True}

    @app.get("/v1/server/presence", response_model=PresencePage, responses=SERVER,
             dependencies=KEY)
    async def presence(users: UserList) -> dict[str, Any]:
        """``users``: comma-separated, at most 1,000 (and 5,000 characters)."""
        names = user_list(users, MAX_NOTIFY_USERS)
        now_ms = int(time.time() * 1000)
        out = {}
        for u, (devices, seen) in zip(names, await d.presence(names), strict=True):
            out[u] = {"online": devices > 0, "devices": devices,
                      "last_seen": now_ms if devices else (seen * 1000 if seen else None)}
        return {"users": out}

