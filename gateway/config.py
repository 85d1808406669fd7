"""Node settings, read from ``IM_*`` environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TypeVar

from core.client_ip import Proxies
from core.devices import PLATFORMS, POLICIES
from router.amqp_urls import AmqpUrlError, parse_amqp_urls
from store.redis_urls import cluster_seeds

__all__ = ["PUBLIC_SECRETS", "ConfigError", "Settings", "convert", "setting"]

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Secrets once shipped as defaults: public, so never accepted (nor verified).
T = TypeVar("T")
PUBLIC_SECRETS = frozenset({"dev-only-secret-change-me-0123456789"})


def setting(default: T, help: str) -> T:
    """A setting: its default and what it means (``python -m gateway serve
    --help``, ``python -m gateway config``, README's table, the example env file)."""
    return field(default=default, metadata={"help": help})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """Everything a node needs; defaults point at the local servers."""

    redis_url: str = setting("redis://127.0.0.1:6379/0",
        'Redis; with `IM_REDIS_CLUSTER=1`, the comma-separated seeds of a Redis Cluster '
        '(`redis://h1:p1,redis://h2:p2`)')
    redis_cluster: int = setting(0,
        '`1`: `IM_REDIS_URL` names a Redis Cluster (docs/scaling.md, "Redis Cluster")')
    amqp_url: str = setting("amqp://guest:guest@127.0.0.1:5672/",
        "RabbitMQ: one URL, or a comma-separated list of one cluster's nodes (the first "
        'that answers at start-up; on a lost link the next, round robin; docs/scaling.md, '
        '"RabbitMQ cluster"). `?heartbeat=5` on each URL notices a hung node in about 18 '
        's (default 60: about 3 min)')
    mongo_url: str = setting("mongodb://127.0.0.1:27017", 'MongoDB (or SecantusDB)')
    auth_secret: str = setting("",
        'HS256 secret of tokens, at least 32 bytes; unset: a random secret kept in '
        'IM_AUTH_SECRET_FILE (refused with IM_ENV=production)')
    node_id: int = setting(-1,
        'node number 0..255 (mid node bits); unset: the first free one is leased from '
        'Redis')
    host: str = setting("127.0.0.1", 'the address both listeners bind')
    ws_port: int = setting(8080, 'the WebSocket listener (/ws); 0: any free port')
    http_port: int = setting(8081, 'the HTTP API listener (also serves the demo); 0: any free port')
    keepalive_s: int = setting(20,
        'a keepalive ping to each connection this often (one timer for the node); a peer '
        'that has not answered by the next is closed. 0: none')
    workers: str = setting("1",
        'node processes on this host (`auto`: one per core): past 1, a supervisor runs them, '
        'sharing `IM_WS_PORT` and `IM_HTTP_PORT` (SO_REUSEPORT), each its own node, started '
        'again if it dies; `serve --workers` wins (docs/deploy.md, "Workers")')
    reuse_port: int = setting(0,
        '`1`: listen with SO_REUSEPORT, beside other processes on the same ports (the '
        'workers of `IM_WORKERS` do)')
    namespace: str = setting("im",
        'prefixes every Redis key and RabbitMQ name, names the Mongo database')
    broker: str = setting("rabbitmq", '`memory` runs a single node without RabbitMQ')
    mongo_w: str = setting("majority", 'write concern `w`; writes are always journaled (`j: true`)')
    max_body: int = setting(4096, 'bytes of a message body, encoded')
    max_frame: int = setting(65_536, 'bytes of a WebSocket frame (over: close 1009)')
    offline_max: int = setting(1000, 'offline store per user: the newest entries kept')
    offline_ttl_s: int = setting(7 * 86_400, 'offline store per user: entries this old at most')
    unread_cap: int = setting(9999, 'unread count per conversation saturates here')
    dedup_ttl_s: int = setting(86_400,
        'how long a `cmid` is remembered in Redis (MongoDB remembers for ever)')
    # A user's unread and conversation keys in Redis expire this long after their
    # last use and are rebuilt from MongoDB when next needed (a week, as the
    # offline store and the group caches: an active user never pays a rebuild,
    # and keys a sender made for ids nobody uses go within the week).
    user_key_ttl_s: int = setting(7 * 86_400,
        "a user's unread and conversation keys in Redis (and its following set) expire "
        'this long after their last use and are rebuilt from MongoDB when next needed '
        "(docs/reference/redis-keys.md: every key and its TTL)")
    dep_timeout_s: float = setting(2.0, 'per Redis / MongoDB operation')
    # At start-up a node waits this long for Redis and MongoDB to answer (a store
    # still starting, or too busy to prepare its indexes in one timeout) before
    # it gives up with a one-line error; 0: one try.
    startup_wait_s: float = setting(30.0,
        'at start-up, wait this long for Redis and MongoDB (a line logged per failed try) '
        'before exiting with `cannot reach ...`; 0: one try')
    sync_settle_ms: int = setting(1000, 'sync cursors do not pass messages younger than this')
    group_news_sync: int = setting(1,
        '0: a sync reads every group of its caller instead of its index of groups with '
        'news (the first step of a rollout from a release without that index: '
        'docs/deploy.md)')
    # A person sends a few messages a second at most; bots use the server API.
    send_rate: float = setting(20.0,
        'sends per second per user on a node, over all its connections (token bucket)')
    send_burst: int = setting(100, 'sends a user may save up (the bucket of IM_SEND_RATE)')
    max_inflight: int = setting(16, 'concurrent ops per user on a node, over all its connections')
    write_buffer_max: int = setting(1 << 20, 'bytes queued on a socket before pushes skip it')
    bad_frame_limit: int = setting(20, 'bad frames before close 1008')
    op_rate: float = setting(300.0,
        'frames per second per user on a node (all its connections), every op '
        '(`recv_ack`: 1 + one per 10 mids)')
    op_burst: int = setting(600, 'frames a user may save up (the bucket of IM_OP_RATE)')
    refuse_rate: float = setting(10.0,
        '`rate_limited` answers per second a connection may earn before close 1008')
    refuse_burst: int = setting(100,
        '`rate_limited` answers a connection may save up before close 1008')
    reply_buffer_max: int = setting(1 << 20,
        'bytes of replies queued on a socket before the connection is dropped')
    login_policy: str = setting("unlimited",
        'unlimited | one_per_platform (a new connection closes the user\'s older one of the '
        'same platform, on any node, with 4005) | one_mobile (as one_per_platform, ios and '
        'android sharing one slot); under every policy a device reconnecting replaces its '
        'own older connection')
    max_conns_per_user: int = setting(10,
        'WebSocket connections of one user on one node (over: 429)')
    # A user's handshakes on a node (0: no limit): a client closed for flooding
    # that reconnects at once, over and over, repeats a connect's work each time
    # (its groups loaded and joined, its presence told).
    user_handshake_rate: float = setting(5.0,
        'WebSocket handshakes per second of one user on a node (429 with Retry-After past '
        'it; 0: no limit): a client reconnecting in a loop cannot make the node repeat a '
        "connect's work")
    user_handshake_burst: int = setting(50,
        'handshakes of one user saved up (the bucket of IM_USER_HANDSHAKE_RATE)')
    batch_max: int = setting(256, 'documents per MongoDB batch, commands per Redis pipeline')
    mongo_linger_ms: float = setting(2.0, 'wait for a Mongo write batch to fill')
    mongo_inflight: int = setting(1, 'Mongo write batches in flight at once')
    pending_max: int = setting(20_000, 'sends queued in a node before new ones get `unavailable`')
    group_max_members: int = setting(100_000, 'members of one group')
    group_write_diffusion_max: int = setting(100,
        'groups up to this many members get a box and offline entry per member per '
        'message; bigger ones store one copy')
    # Per client address, at the WebSocket edge (0: no limit). Behind a proxy the
    # address comes from X-Forwarded-For, believed only from IM_TRUSTED_PROXIES.
    ip_handshake_rate: float = setting(50.0,
        'WebSocket handshakes per second per client address (429 past it; 0: no limit)')
    ip_handshake_burst: int = setting(200,
        'handshakes per client address saved up (the bucket of IM_IP_HANDSHAKE_RATE)')
    max_conns_per_ip: int = setting(2000,
        'open WebSocket connections per client address on a node (429 past it; 0: no '
        'limit)')
    trusted_proxies: str = setting("",
        'comma-separated addresses or CIDR blocks of your proxies: from them the client '
        'address is the right-most `X-Forwarded-For` entry that is not a trusted proxy; '
        'from anyone else the header is ignored')
    # Privacy defaults (a user's own settings override them): who may send a
    # user 1:1 messages, see its presence, add it to a group.
    privacy_dm: str = setting("everyone",
        "default of users' privacy setting: who may send them 1:1 messages (everyone | "
        'contacts)')
    privacy_presence: str = setting("contacts",
        "default of users' privacy setting: who sees their presence (everyone | contacts "
        '| nobody)')
    privacy_group_add: str = setting("everyone",
        "default of users' privacy setting: who may add them to groups (everyone | "
        'contacts)')
    max_new_convs_per_day: int = setting(500,
        '1:1 conversations a user may start per day with users who never wrote to it')
    relation_lookup_rate: float = setting(5.0,
        'users per second a user may have looked up by `typing`, receipts, `presence_sub` '
        'and `GET /v1/presence` when the node does not remember their settings (each a '
        'MongoDB read); past it typing and receipts are dropped and presence calls answer '
        '`rate_limited`; 0: no limit')
    relation_lookup_burst: int = setting(1000,
        'relation look-ups a user may save up (the bucket of IM_RELATION_LOOKUP_RATE)')
    push_confirm_ms: int = setting(500,
        "a send's `ack` waits at most this long for the broker to confirm its pushes' "
        'hand-off to the other nodes (0: it does not wait, and a node killed in between '
        'takes those pushes with it)')
    max_groups_owned: int = setting(200, 'groups one user owns (403 past it, also for a handover)')
    max_groups_joined: int = setting(2000,
        'groups one user is in: a create or add past it leaves that user out (`refused`)')
    group_creates_per_min: int = setting(10,
        'groups one user creates per wall-clock minute, counted in Redis across the nodes '
        '(429 past it)')
    feed_push_max: int = setting(5000,
        'authors with more followers are pulled at read time instead of pushed')
    feed_timeline_max: int = setting(800,
        "timeline entries kept per user (older pages come from the authors' posts)")
    feed_text_max: int = setting(2000, 'characters of a post')
    feed_queue_max: int = setting(10_000,
        'posts waiting for fan-out on a node before posting waits')
    listen_backlog: int = setting(4096,
        "the WebSocket listener's accept queue; the kernel caps it at "
        "`net.core.somaxconn` (asyncio's default of 100 overflowed under a connect storm: "
        'docs/benchmarks.md, "100,000 connections on one machine")')
    room_window_ms: float = setting(25.0,
        "a room's messages are coalesced into one `room_msgs` frame over this window")
    room_history: int = setting(100,
        'messages kept per room (Redis) for `join` with `history` / `since`; 0: no '
        'positions, no history')
    room_history_ttl_s: float = setting(300.0, 'a kept room message is dropped after this long')
    room_reorder_ms: float = setting(50.0,
        'a node waits this long, once, for a room position still crossing the broker '
        'before sending what follows')
    room_write_at_once: int = setting(1000,
        'a room with up to this many members on a node is written at once')
    room_write_chunk: int = setting(25,
        'a bigger room is written by a cursor, this many members per loop turn')
    room_rate_cap: float = setting(50.0,
        'room messages per second delivered to each member (above: sampled; `prio` 1 '
        'always); 0: no cap')
    room_buffer_max: int = setting(262_144, 'bytes queued on a socket before room frames skip it')
    room_pending_max: int = setting(10_000, 'room messages queued per room per window before drops')
    room_send_rate: float = setting(10.0, '`room_send` per second per user on a node (0: no limit)')
    room_send_burst: int = setting(20,
        'room sends a user may save up (the bucket of IM_ROOM_SEND_RATE)')
    room_max_per_conn: int = setting(16, 'rooms one connection may be in')
    room_unbind_delay_s: float = setting(30.0, 'an emptied room keeps its broker binding this long')
    room_report_s: float = setting(1.0,
        'room housekeeping tick: counts not written at join/leave are retried this often')
    room_refresh_s: float = setting(15.0, 'every local room count is rewritten this often')
    stuck_close_s: float = setting(30.0,
        'a connection whose writes are skipped for backlog this long is closed')
    heartbeat_s: float = setting(2.0, 'node heartbeat period')
    heartbeat_ttl_s: float = setting(6.0, 'a node whose heartbeat is this old counts as dead')
    drain_timeout_s: float = setting(10.0, 'bound on a SIGTERM drain')
    # -- HTTP edge and tokens --
    env: str = setting("development", '`production`: no start without `IM_AUTH_SECRET`')
    auth_secret_file: str = setting("",
        'where an unset IM_AUTH_SECRET is made and kept (mode 0600); unset: '
        '$XDG_STATE_HOME (~/.local/state)/imgate/auth_secret')
    auth_max_ttl_s: int = setting(30 * 86_400, 'longest token lifetime (exp - iat, and exp - now)')
    auth_leeway_s: int = setting(30, 'clock skew allowed on exp, iat, nbf (never past exp)')
    auth_public_key_file: str = setting("",
        'PEM RSA or EC public key: RS256 / ES256 tokens verify with it (HS256 ones with '
        'the secret)')
    auth_issuer: str = setting("", "when set, a token's `iss` must be this")
    auth_audience: str = setting("", "when set, a token's `aud` must name this")
    http_header_timeout_s: float = setting(10.0,
        'an HTTP request line and headers must arrive within this')
    http_body_timeout_s: float = setting(30.0,
        'an HTTP body must arrive within this after the headers')
    http_body_max: int = setting(65_536, 'bytes of an HTTP body (over: 413, before reading)')
    http_rate: float = setting(50.0,
        'HTTP calls per second per user on a node (0: no limit); a sync or conversation '
        "list costs one more per 1,000 of the caller's groups")
    http_burst: int = setting(100, 'HTTP calls a user may save up (the bucket of IM_HTTP_RATE)')
    feed_follow_max: int = setting(2000, "users one user may follow (Weibo's cap; over: 403)")
    metrics_host: str = setting("127.0.0.1",
        'the address of the /metrics listener, apart from the API')
    metrics_port: int = setting(9464, 'the /metrics listener (0: any free port, -1: none)')
    metrics_public: int = setting(0, '1: also serve `/metrics` on the API port')
    public_ws_url: str = setting("",
        'the WebSocket URL `GET /v1/info` tells clients and the demo (set it behind a '
        'proxy that serves `/ws` elsewhere); unset: derived from the request')
    cors_origins: str = setting("",
        'comma-separated origins (`https://app.example`, or `*`) whose browsers may call '
        'the HTTP API: preflights answered, `Access-Control-Allow-Origin` on answers; '
        'unset: no CORS')
    api_keys: str = setting("",
        'comma-separated keys (24+ characters each) of the server API, `/v1/server/*` '
        '(docs/protocol.md, "Server API"); unset: no server API')
    events: str = setting("offline,presence",
        'event types (or prefixes) published to the durable topic exchange {ns}.events '
        '(docs/protocol.md, "Events out"); none: no events')
    offline_push_platforms: str = setting("",
        'comma-separated platforms (ios, android, web, desktop, other): offline.msg is '
        'also made for a 1:1 message whose receiver is connected on none of them (a '
        'phone to wake while only a desktop is open); unset: only when no device is '
        'connected')
    events_pending_max: int = setting(10_000, 'events waiting for the broker before new ones drop')
    events_pending_per_user: int = setting(500,
        'of those, entries caused by one user (the outbox serves users in turn)')
    hook_url: str = setting("",
        'the product\'s hook endpoint: before a hooked call is done it is POSTed there '
        '(JSON, signed with IM_HOOK_SECRET as the webhook relay signs) and the answer '
        'allows it, rewrites its body or rejects it (docs/protocol.md, "Hooks"); unset: no hooks')
    hook_secret: str = setting("", 'HMAC-SHA256 key of the hook requests, at least 16 bytes')
    hooks: str = setting("send",
        'comma-separated calls IM_HOOK_URL decides: send (1:1 and group, WebSocket and '
        'server API), room_send, join')
    hook_timeout_ms: int = setting(500, 'a hook call answers within this or has failed')
    hook_failure: str = setting("closed",
        'closed: a hook that failed or timed out makes the call unavailable (nothing '
        'stored); open: the call is allowed')
    hook_max_inflight: int = setting(64,
        'hook calls in flight at once on a node (pooled connections); more wait, '
        'within their timeout')
    recall_window_s: float = setting(120.0,
        'a sender may recall a 1:1 message this long after sending it')
    edit_window_s: float = setting(900.0,
        'a sender may edit a message (1:1 or group) this long after sending it')
    reaction_emoji_max: int = setting(20,
        'distinct emoji one message may carry; a reaction with another one is `forbidden`')
    reaction_shards: int = setting(4,
        "Redis keys each message's reaction counts are spread over (by reacting user), "
        'so a popular message is no hot key')
    pinned_max: int = setting(20,
        'conversations one user may pin; pinning one more is `forbidden`')
    presence_subs_max: int = setting(1000,
        'users one user may watch with `presence_sub`, across all its connections and '
        'nodes (a user watched twice counts once; `forbidden` past it)')
    presence_grace_s: float = setting(5.0,
        '`presence.offline` only once no device of the user was back for this long (a '
        'reconnect within it makes no event)')
    register_grace_s: float = setting(30.0,
        'a device whose registration could not complete (its route or its groups, with '
        'Redis down) is retried every 0.25 s (then what came for it meanwhile is pushed '
        'again); past this long it is closed with 1012 so that it reconnects, never left '
        'connected and deaf')


    @property
    def event_types(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.events.split(",")
                     if t.strip() and t.strip() != "none")

    @property
    def offline_push_platform_set(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.offline_push_platforms.split(",")
                         if p.strip())

    @property
    def hook_kinds(self) -> frozenset[str]:
        return frozenset(k.strip() for k in self.hooks.split(",") if k.strip())

    @property
    def api_key_list(self) -> tuple[str, ...]:
        return tuple(k.strip() for k in self.api_keys.split(",") if k.strip())

    @property
    def cors_origin_list(self) -> tuple[str, ...]:
        return tuple(o.strip() for o in self.cors_origins.split(",") if o.strip())

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        env = os.environ if env is None else env
        values: dict[str, object] = {}
        for f in fields(cls):
            raw = env.get("IM_" + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = convert(f.name, raw, type(getattr(cls, f.name)))
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """ConfigError naming the first setting that cannot be used."""
        for problem in self.problems():
            raise ConfigError(problem)

    def problems(self) -> Iterator[str]:
        """One line per setting that cannot be used (``python -m gateway config``)."""
        if not _NAMESPACE.fullmatch(self.namespace):
            yield "IM_NAMESPACE must be 1-32 characters of [A-Za-z0-9_-]"
        if not -1 <= self.node_id <= 255:
            yield "IM_NODE_ID must be in 0..255 (or unset to lease one)"
        try:
            workers = parse_workers(self.workers)
        except ValueError:
            yield f"IM_WORKERS must be a positive number or auto, not {self.workers!r}"
            workers = 1
        if workers > 1 and self.node_id >= 0:
            yield "IM_NODE_ID cannot be set with IM_WORKERS above 1 (each worker leases its own)"
        if self.broker not in ("rabbitmq", "memory"):
            yield "IM_BROKER must be rabbitmq or memory"
        if self.broker == "rabbitmq":
            try:
                parse_amqp_urls(self.amqp_url)
            except AmqpUrlError as exc:
                yield str(exc)
        if self.redis_cluster:
            try:
                cluster_seeds(self.redis_url)
            except ValueError as exc:
                yield f"IM_REDIS_URL: {exc}"
        if self.auth_secret and len(self.auth_secret.encode()) < 32:
            yield "IM_AUTH_SECRET must be at least 32 bytes (RFC 7518 3.2 for HS256)"
        for name in ("max_body", "max_frame", "offline_max", "batch_max", "pending_max",
                     "user_key_ttl_s",
                     "op_rate", "op_burst", "refuse_rate", "refuse_burst", "reply_buffer_max",
                     "max_conns_per_user",
                     "room_window_ms", "room_buffer_max", "room_pending_max",
                     "room_max_per_conn", "room_report_s", "room_refresh_s", "stuck_close_s",
                     "feed_timeline_max", "feed_text_max", "feed_queue_max",
                     "events_pending_max", "events_pending_per_user", "presence_grace_s",
                     "register_grace_s",
                     "recall_window_s", "edit_window_s", "reaction_emoji_max",
                     "reaction_shards", "pinned_max",
                     "presence_subs_max", "room_history_ttl_s", "room_reorder_ms",
                     "room_write_chunk", "room_write_at_once", "listen_backlog",
                     "max_groups_owned", "max_groups_joined", "group_creates_per_min",
                     "max_new_convs_per_day", "hook_timeout_ms", "hook_max_inflight"):
            if getattr(self, name) <= 0:
                yield f"IM_{name.upper()} must be positive"
        for name in ("room_rate_cap", "room_send_rate", "room_unbind_delay_s", "room_history",
                     "group_write_diffusion_max", "group_max_members", "feed_push_max",
                     "ip_handshake_rate", "ip_handshake_burst", "max_conns_per_ip",
                     "push_confirm_ms", "relation_lookup_rate", "relation_lookup_burst",
                     "user_handshake_rate", "user_handshake_burst"):
            if getattr(self, name) < 0:
                yield f"IM_{name.upper()} must not be negative"
        yield from self._edge_problems()

    def _edge_problems(self) -> Iterator[str]:
        """The HTTP edge and token settings."""
        if self.hook_url:
            if not re.fullmatch(r"https?://[^/\s]+(/\S*)?", self.hook_url):
                yield "IM_HOOK_URL must be an http:// or https:// URL"
            if len(self.hook_secret.encode()) < 16:
                yield "IM_HOOK_URL needs IM_HOOK_SECRET, at least 16 bytes"
        if wrong := sorted(self.offline_push_platform_set - set(PLATFORMS)):
            yield (f"IM_OFFLINE_PUSH_PLATFORMS: {', '.join(wrong)}: each must be one of "
                   f"{', '.join(PLATFORMS)}")
        if unknown := [k for k in self.hook_kinds if k not in ("send", "room_send", "join")]:
            yield f"IM_HOOKS: {', '.join(unknown)}: each must be send, room_send or join"
        for name, choices in (("hook_failure", ("closed", "open")),
                              ("login_policy", POLICIES),
                              ("privacy_dm", ("everyone", "contacts")),
                              ("privacy_presence", ("everyone", "contacts", "nobody")),
                              ("privacy_group_add", ("everyone", "contacts"))):
            if getattr(self, name) not in choices:
                yield f"IM_{name.upper()} must be one of {', '.join(choices)}"
        try:
            Proxies.parse(self.trusted_proxies)
        except ValueError as exc:
            yield f"IM_TRUSTED_PROXIES: {exc}"
        if self.env not in ("development", "production"):
            yield "IM_ENV must be development or production"
        if self.auth_secret in PUBLIC_SECRETS:
            yield ("IM_AUTH_SECRET is a published development value; "
                              "set a secret of your own")
        if self.env == "production" and not self.auth_secret:
            yield ("IM_ENV=production needs IM_AUTH_SECRET (at least 32 bytes); "
                              "refusing to start on a generated secret")
        for name in ("auth_max_ttl_s", "http_header_timeout_s", "http_body_timeout_s",
                     "http_body_max", "http_burst", "feed_follow_max"):
            if getattr(self, name) <= 0:
                yield f"IM_{name.upper()} must be positive"
        for name in ("auth_leeway_s", "http_rate"):
            if getattr(self, name) < 0:
                yield f"IM_{name.upper()} must not be negative"
        if not -1 <= self.metrics_port <= 65_535:
            yield "IM_METRICS_PORT must be a port, 0 (any free one) or -1 (none)"
        if self.redis_cluster not in (0, 1):
            yield "IM_REDIS_CLUSTER must be 0 or 1"
        if self.metrics_public not in (0, 1):
            yield "IM_METRICS_PUBLIC must be 0 or 1"
        if self.group_news_sync not in (0, 1):
            yield "IM_GROUP_NEWS_SYNC must be 0 or 1"
        if any(len(k) < 24 for k in self.api_key_list):
            yield "IM_API_KEYS: each key must be at least 24 characters"
        for origin in self.cors_origin_list:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s,]+", origin):
                yield (f"IM_CORS_ORIGINS: {origin!r} is not an origin "
                                  "(scheme://host[:port], or *)")


def convert(name: str, raw: str, kind: type) -> object:
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"IM_{name.upper()}={raw!r} is not a {kind.__name__}") from None
    return raw


def parse_workers(value: str) -> int:
    """``auto``: the host's cores (the ones this process may run on); else a
    positive number."""
    if value.strip().lower() == "auto":
        return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                   else os.cpu_count() or 1)
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"workers must be a positive number or 'auto', not {value!r}")
    return n
