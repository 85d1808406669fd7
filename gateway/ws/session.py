"""One WebSocket connection: authenticate, read frames, act, reply.

The decisions (parse, refuse, rate-limit, which op runs how) are the
sans-I/O ``SessionCore``'s; this module only moves bytes and runs what the
core asks for. Sends run as tasks (at most ``max_inflight`` per connection), so a client
that pipelines sends gets them batched with everyone else's; when the bound
is reached the reader waits, which pushes back on the client's TCP stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
import weakref
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response
from websockets.protocol import State

from core.client_ip import IpLimits, Proxies, client_ip
from core.devices import DeviceError, check_device
from core.errors import Unavailable
from core.ratelimit import KeyedBuckets
from gateway import frames, wire
from gateway import protocol as p
from gateway.auth import Token, TokenVerifier, bearer_token
from gateway.chat.service import ChatService, SendResult
from gateway.contacts.service import Relations
from gateway.delivery import Pusher, handed_over, push_group_sent, push_sent
from gateway.errors import ProtocolError
from gateway.events import Events
from gateway.groups.service import GroupService
from gateway.hooks.client import Hooks, send_vet
from gateway.hub import Client
from gateway.inbox.conversations import Conversations
from gateway.inbox.ops import MessageOps
from gateway.metrics import NodeMetrics
from gateway.moderation import CLOSED_BY_SERVER, Moderation
from gateway.rooms.service import LiveRooms
from gateway.ws import core as sc
from gateway.ws.expiry import ExpiryWheel
from gateway.ws.keepalive import Keepalive
from gateway.ws.registry import Registry

__all__ = ["Sessions"]

log = logging.getLogger("gateway.ws.session")
T = TypeVar("T")
YIELD_EVERY = 16  # frames read from one socket before the loop serves the others
_HANDSHAKE_DONE = Request("/ws", Headers())
TOKEN_EXPIRED = 4001  # docs/protocol.md: close codes 4000-4099 are the gateway's


class Sessions:
    """WebSocket entry points of a node."""

    def __init__(self, limits: sc.SessionLimits, conns: sc.ConnectionLimits, registry: Registry,
                 chat: ChatService,
                 groups: GroupService, conversations: Conversations, live: LiveRooms,
                 pusher: Pusher, metrics: NodeMetrics, draining: Callable[[], bool],
                 verifier: TokenVerifier, moderation: Moderation, ops: MessageOps,
                 events: Events | None = None, relations: Relations | None = None,
                 hooks: Hooks | None = None) -> None:
        self.conns = conns
        self.registry = registry
        self.chat = chat
        self.groups = groups
        self.conversations = conversations
        self.live = live
        self.pusher = pusher
        self.metrics = metrics
        self.draining = draining
        self.verifier = verifier
        self.moderation = moderation
        self.ops = ops
        self.events = events
        self.relations = relations  # who may send whom a 1:1 message (None: anyone)
        self.hooks = hooks  # the product's hooks (IM_HOOK_URL; None: none)
        self._tokens: weakref.WeakKeyDictionary[
            ServerConnection, tuple[Token, str, str | None, str]] = weakref.WeakKeyDictionary()
        self._proxies = Proxies.parse(conns.trusted_proxies)
        self._budgets = sc.UserBudgets(limits)  # each user's, over its connections here
        self._ips = IpLimits(conns.ip_handshake_rate, conns.ip_handshake_burst,
                             conns.max_conns_per_ip)
        self._user_handshakes = KeyedBuckets(conns.user_handshake_rate,
                                             conns.user_handshake_burst)
        self._expiries = ExpiryWheel(self._expired)
        self.keepalive = Keepalive(conns.keepalive_s, self._keepalive_timed_out) \
            if conns.keepalive_s > 0 else None
        self.limits = limits
        # Op name -> its handler, ``op_<name>`` (gateway.protocol.OPS): a row
        # without one fails here, at start, not at its first frame.
        self._handlers: dict[str, Callable[[Client, Any], Awaitable[None] | None]] = {
            name: getattr(self, f"op_{name}") for name, op in p.OPS.items() if op.run != "core"}

    # -- handshake -----------------------------------------------------------
    async def process_request(self, conn: ServerConnection, request: Request
                              ) -> Response | None:
        if request.path.split("?", 1)[0] != "/ws":
            return conn.respond(HTTPStatus.NOT_FOUND, "WebSocket endpoint is /ws\n")
        if self.draining():
            return conn.respond(HTTPStatus.SERVICE_UNAVAILABLE, "node is draining\n")
        ip = client_ip(str(conn.remote_address[0]) if conn.remote_address else "",
                       request.headers.get("X-Forwarded-For"), self._proxies)
        refused = self._ips.admit(ip, time.monotonic())
        if refused is not None:
            self.metrics.limit_refusals.labels(f"ip_{refused}").inc()
            what = ("handshakes per second" if refused == "handshakes"
                    else "open connections on a node")
            return conn.respond(HTTPStatus.TOO_MANY_REQUESTS,
                                f"too many {what} from this address\n")
        # (No new attribute on ``conn``: that would un-share its instance dict,
        # ~1.3 KB per idle connection. The token waits in a weak map instead.)
        query = parse_qs(urlsplit(request.path).query)
        try:  # ?device=ID&platform=P (core.devices): the login policy's slot
            device, platform = check_device(_first(query, "device"), _first(query, "platform"))
        except DeviceError as err:
            return conn.respond(HTTPStatus.BAD_REQUEST, f"{err}\n")
        token = bearer_token(request.headers.get("Authorization")) or _first(query, "token")
        try:
            checked = self.verifier.check(token)
            await self.moderation.admit(checked)  # one Redis read per handshake
        except ProtocolError as err:
            status = HTTPStatus.FORBIDDEN if err.code == "forbidden" else HTTPStatus.UNAUTHORIZED
            return conn.respond(status, err.message + "\n")
        except Unavailable:  # too many checks waiting (Redis down: admit skips the check)
            self.metrics.limit_refusals.labels("handshakes_waiting").inc()
            response = conn.respond(HTTPStatus.SERVICE_UNAVAILABLE,
                                    "the node is busy with other connections; retry\n")
            response.headers["Retry-After"] = "1"
            return response
        user = checked.user
        if not self._user_handshakes.take(user, time.monotonic()):
            self.metrics.limit_refusals.labels("user_handshakes").inc()
            response = conn.respond(HTTPStatus.TOO_MANY_REQUESTS,
                                    "too many connection attempts by this user on a node "
                                    "(IM_USER_HANDSHAKE_RATE); wait and retry\n")
            response.headers["Retry-After"] = str(
                max(1, math.ceil(1 / self.conns.user_handshake_rate)))
            return response
        if self.registry.connections_of(user) >= self.conns.max_conns_per_user:
            self.metrics.closed.labels("conn_cap").inc()
            return conn.respond(HTTPStatus.TOO_MANY_REQUESTS,
                                f"at most {self.conns.max_conns_per_user} connections "
                                "per user on a node\n")
        conn.username = user
        self._tokens[conn] = (checked, ip, device, platform)  # read once by handle
        return None

    # -- connection ----------------------------------------------------------
    async def handle(self, ws: ServerConnection) -> None:
        # The handshake's headers are never read again (~2.9 KB per idle connection,
        # kept alive by websockets' parser), nor two empty deques (wire.lighten).
        # (``request`` must stay set: websockets takes None for "handshake pending".)
        wire.lighten(ws)
        ws.request = _HANDSHAKE_DONE
        budget = self._budgets.acquire(ws.username, time.monotonic())  # the user's, shared
        core = sc.SessionCore(self.limits, time.monotonic(), budget)  # + bad frames
        client = Client(ws.username, ws)
        token, ip, device, platform = self._tokens.pop(ws)
        if token.device is not None or token.platform is not None:  # the backend's say wins
            device, platform = token.device or device, token.platform or platform
        client.device = device or f"d-{secrets.token_hex(6)}"  # none named: one of its own
        client.platform = platform
        client.iat = token.iat or 0.0
        self._expiries.set(client, token.exp)
        if self.keepalive is not None:
            self.keepalive.add(client)
        closing: asyncio.Task[None] | None = None
        self._ips.opened(ip)
        try:
            await self.registry.connected(client)
            if self.moderation.held_back(client):  # banned or revoked while it connected
                await ws.close(CLOSED_BY_SERVER, "banned or token revoked")
            frames = 0
            async for data in ws:
                # Once closed by policy the core answers nothing: frames are only
                # drained until the client's close frame arrives.
                for action in core.receive(data, time.monotonic()):
                    if isinstance(action, sc.Close):
                        # Not awaited here: the handshake needs the client's close
                        # frame, which comes behind the frames it already sent.
                        self.metrics.closed.labels(action.why).inc()
                        closing = asyncio.create_task(ws.close(action.code, action.reason))
                        break
                    await self._act(client, budget, action)
                # Not kept while the socket waits for its next frame: the last
                # action (its encoded reply) and frame would stay alive that long,
                # ~4.4 KB per connection that ever sent one (bench.many_conns).
                action = data = None  # type: ignore[assignment]
                if wire.is_closing(ws):  # aborted (reply backlog): stop reading
                    return
                frames += 1
                if frames % YIELD_EVERY == 0:
                    # Frames already buffered are handed over without a pause: give
                    # every other socket and timer its turn, whatever this one sends.
                    await asyncio.sleep(0)
        except ConnectionClosed:
            pass
        finally:
            self._budgets.release(client.user)
            self._ips.closed(ip)
            self._expiries.discard(client)
            if self.keepalive is not None:
                self.keepalive.discard(client)
            if closing is not None:
                await asyncio.gather(closing, return_exceptions=True)
            await self.registry.disconnected(client)

    async def _act(self, client: Client, budget: sc.UserBudget, action: sc.Action) -> None:
        if isinstance(action, sc.Accepted):
            self.metrics.frames_in.labels(action.op).inc()
        elif isinstance(action, sc.Reply):
            if action.error is not None:
                self.metrics.errors.labels(action.error).inc()
            self._send_bytes(client, action.data)
        elif isinstance(action, sc.Spawn):
            work = self._handlers[action.op](client, action.frame)
            assert work is not None  # a task op's handler is a coroutine function
            await self._spawn(client, budget, work)
        elif isinstance(action, sc.Inline):
            self._handlers[action.op](client, action.frame)

    async def _spawn(self, client: Client, budget: sc.UserBudget,
                     work: Awaitable[None]) -> None:
        """Run ``work`` once fewer than ``max_inflight`` ops of the user (on all
        its connections here) are in flight."""
        tasks = client.tasks
        if tasks is None:
            tasks = client.tasks = set()
        while len(budget.tasks) >= self.conns.max_inflight:
            await asyncio.wait(budget.tasks, return_when=asyncio.FIRST_COMPLETED)
        task = asyncio.ensure_future(work)
        for running in (tasks, budget.tasks):
            running.add(task)
            task.add_done_callback(running.discard)

    # -- ops -----------------------------------------------------------------
    async def op_send(self, client: Client, f: p.Send) -> None:
        started = time.perf_counter()
        body = [f.body]  # the hook's rewrite, if any, replaces it
        result = await self._guarded(client, f.id, lambda: self._send(client.user, f, body))
        if result is None:
            return
        confirms: list[asyncio.Future[None]] = []
        push_sent(self.pusher, self.events, client.user, f.to, result, body[0],
                  skip_conn=client.id, confirms=confirms)
        await handed_over(confirms, self.limits.push_confirm_s)
        self._send_bytes(client, frames.ack(f.id, f.cmid, result.mid, result.ts))
        self.metrics.send_latency.observe(time.perf_counter() - started)

    async def _send(self, sender: str, f: p.Send, body: list[bytes]) -> SendResult:
        """A 1:1 send its receiver's privacy settings and blocks allow (else
        ``forbidden``, nothing stored), then the hook's (if ``send`` is hooked:
        not for a resend already acked); the receiver becomes a contact."""
        vet = send_vet(self.hooks, sender, {"to": f.to}, f.cmid, body)
        if self.relations is None:
            return await self.chat.send(sender, f.to, f.cmid, f.body, vet=vet,
                                        reply_to=f.reply_to)
        if f.to != sender and not f.to.startswith("g:"):  # else chat.send says why not
            await self.relations.check_send(sender, f.to)
        result = await self.chat.send(sender, f.to, f.cmid, f.body, vet=vet,
                                      reply_to=f.reply_to)
        with contextlib.suppress(Unavailable):  # written again at the next send
            await self.relations.sent(sender, f.to)
        return result

    async def op_group_send(self, client: Client, f: p.GroupSend) -> None:
        body = [f.body]
        vet = send_vet(self.hooks, client.user, {"group": f.group}, f.cmid, body)
        result = await self._guarded(
            client, f.id, lambda: self.groups.send(client.user, f.group, f.cmid, f.body,
                                                   vet=vet, reply_to=f.reply_to))
        if result is None:
            return
        confirms: list[asyncio.Future[None]] = []
        push_group_sent(self.pusher, self.events, client.user, f.group, result, body[0],
                        skip_conn=client.id, confirms=confirms)
        await handed_over(confirms, self.limits.push_confirm_s)
        self._send_bytes(client, frames.ack(f.id, f.cmid, result.mid, result.ts, result.seq))

    async def op_read(self, client: Client, f: p.Read) -> None:
        done = await self._guarded(
            client, f.id, lambda: self.ops.read(client.user, f.conv, f.mid, client.id))
        if done is not None:
            self._send_bytes(client, frames.ok(f.id))

    async def op_recall(self, client: Client, f: p.Recall) -> None:
        async def recall() -> bool:
            await self.ops.recall(client.user, f.mid)
            return True

        if await self._guarded(client, f.id, recall):
            self._send_bytes(client, frames.ok(f.id))

    async def op_edit(self, client: Client, f: p.Edit) -> None:
        async def edit() -> bool:
            await self.ops.edit(client.user, f.mid, f.body)
            return True

        if await self._guarded(client, f.id, edit):
            self._send_bytes(client, frames.ok(f.id))

    async def op_react(self, client: Client, f: p.React) -> None:
        async def react() -> bool:
            await self.ops.react(client.user, f.mid, f.emoji, f.on)
            return True

        if await self._guarded(client, f.id, react):
            self._send_bytes(client, frames.ok(f.id))

    async def op_presence_sub(self, client: Client, f: p.PresenceSub) -> None:
        users = list(f.users)
        state = await self._guarded(client, f.id,
                                    lambda: self.ops.presence_sub(client, users, f.id))
        if state is not None:
            self._send_bytes(client, frames.presence(state, f.id))

    async def op_presence_unsub(self, client: Client, f: p.PresenceSub) -> None:
        await self.ops.presence_unsub(client, list(f.users))
        self._send_bytes(client, frames.ok(f.id))

    async def op_typing(self, client: Client, f: p.Typing) -> None:
        with contextlib.suppress(Unavailable):  # ephemeral: a lost one is no error
            await self.ops.typing(client.user, client.id, f.conv)

    async def op_recv_ack(self, client: Client, f: p.RecvAck) -> None:
        await self._guarded(client, f.id, lambda: self.chat.recv_ack(client.user, f.mids))

    async def op_join(self, client: Client, f: p.Join) -> None:
        async def join() -> Any:
            if self.hooks is not None:
                await self.hooks.join(client.user, f.room)
            return await self.live.join(client, f.room, f.history, f.since)

        got = await self._guarded(client, f.id, join)
        if got is not None:
            self._send_bytes(client, frames.joined(f.id, f.room, got))

    async def op_leave(self, client: Client, f: p.Leave) -> None:
        async def leave() -> bool:
            await self.live.leave(client, f.room)
            return True

        if await self._guarded(client, f.id, leave):
            self._send_bytes(client, frames.left(f.room, f.id))

    # -- token lifetime --------------------------------------------------------
    def _keepalive_timed_out(self, client: Client) -> None:
        """No pong for a whole keepalive interval: the peer is gone."""
        self.metrics.closed.labels("keepalive").inc()
        wire.abort(client.ws)

    def _expired(self, client: Client) -> None:
        """Its token expired (``ExpiryWheel``): close it with 4001."""
        if client.ws.protocol.state is State.OPEN:
            self.metrics.closed.labels("token_expired").inc()
            task = asyncio.ensure_future(client.ws.close(TOKEN_EXPIRED, "token expired"))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def op_refresh(self, client: Client, f: p.Refresh) -> None:
        """A new token for the same user moves the expiry; anything else (another
        user's, a revoked one) is refused and the old expiry stands."""

        async def check() -> Token:
            checked = self.verifier.check(f.token)
            if checked.user != client.user:
                raise ProtocolError("unauthorized", "the token is for another user")
            await self.moderation.admit(checked)
            return checked

        checked = await self._guarded(client, f.id, check)
        if checked is None:
            return
        self._expiries.set(client, checked.exp)
        client.iat = checked.iat or 0.0
        self._send_bytes(client, frames.ok(f.id))

    def op_room_send(self, client: Client, f: p.RoomSend) -> None:
        """No task per message: the reply is written when the broker confirms
        (a hooked ``room_send`` waits for its hook in a task of its own)."""
        if self.hooks is not None and self.hooks.on("room_send"):
            task = asyncio.ensure_future(self._hooked_room_send(client, f))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            return
        self._room_send(client, f)

    async def _hooked_room_send(self, client: Client, f: p.RoomSend) -> None:
        hooks = self.hooks
        assert hooks is not None
        body = await self._guarded(client, f.id,
                                   lambda: hooks.room_send(client.user, f.room, f.body))
        if body is not None:
            self._room_send(client, p.RoomSend(f.id, f.room, body, f.prio))

    def _room_send(self, client: Client, f: p.RoomSend) -> None:
        try:
            confirmed = self.live.send(client, f.room, f.body, f.prio)
        except ProtocolError as err:
            err.re = f.id
            self._error(client, err)
            return
        ok = frames.ok(f.id)

        def reply(fut: asyncio.Future[None]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                self.metrics.room_sends.labels("unavailable").inc()
                self._error(client, ProtocolError(
                    "unavailable", "the message was not taken (its position or the broker "
                    "failed); other members may not get it", f.id))
            else:
                self._send_bytes(client, ok)

        confirmed.add_done_callback(reply)

    async def _guarded(self, client: Client, rid: object,
                       call: Callable[[], Awaitable[T]]) -> T | None:
        """Run ``call``; turn every failure into a protocol error for the client.

        No timer per call: every stage is bounded by its driver's timeouts
        (``IM_DEP_TIMEOUT_S``), and a timer per send cost ~10% of node CPU.
        """
        try:
            return await call()
        except ProtocolError as err:
            err.re = rid
            self._error(client, err)
        except (Unavailable, TimeoutError) as exc:
            log.warning("unavailable for %s: %s", client.user, exc)
            self._error(client, ProtocolError(
                "unavailable", "a dependency is down; not acked, retry", rid))
        except Exception:
            log.exception("internal error")
            self._error(client, ProtocolError("internal", "internal error", rid))
        return None

    # -- replies (never awaited; bounded like pushes) ------------------------
    def _error(self, client: Client, err: ProtocolError) -> None:
        self.metrics.errors.labels(err.code).inc()
        self._send_bytes(client, frames.error(err))

    def _send_bytes(self, client: Client, data: bytes) -> None:
        """Queue a reply on the socket. A client that does not read while it
        keeps asking would grow the node's memory: past ``IM_REPLY_BUFFER_MAX``
        queued bytes its connection is dropped (it reconnects and syncs)."""
        if client.write(data, self.conns.reply_buffer_max):
            return
        ws = client.ws
        # Open but backed up (not a closed socket, nor one aborted a frame ago).
        if wire.is_open(ws):
            self.metrics.closed.labels("reply_backlog").inc()
            wire.abort(ws)


def _first(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None
