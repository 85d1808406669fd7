"""Node settings, read from ``IM_*`` environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from core.client_ip import Proxies
from router.amqp_urls import AmqpUrlError, parse_amqp_urls
from store.redis_urls import cluster_seeds

__all__ = ["PUBLIC_SECRETS", "ConfigError", "Settings"]

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,32}")
# Secrets once shipped as defaults: public, so never accepted (nor verified).
PUBLIC_SECRETS = frozenset({"dev-only-secret-change-me-0123456789"})


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """Everything a node needs; defaults point at the local servers."""

    redis_url: str = "redis://127.0.0.1:6379/0"  # with IM_REDIS_CLUSTER=1: comma-separated seeds
    redis_cluster: int = 0  # 1: IM_REDIS_URL names a Redis Cluster
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    mongo_url: str = "mongodb://127.0.0.1:27017"
    auth_secret: str = ""  # unset: a random secret kept in IM_AUTH_SECRET_FILE (gateway.auth)
    node_id: int = -1  # -1: lease a free id from Redis at start-up
    host: str = "127.0.0.1"
    ws_port: int = 8080
    http_port: int = 8081
    namespace: str = "im"
    broker: str = "rabbitmq"  # or "memory": a single node without RabbitMQ
    mongo_w: str = "majority"  # write concern w; writes are always journaled (j: true)
    max_body: int = 4096  # bytes of encoded body
    max_frame: int = 65_536  # bytes; larger frames close the socket with 1009
    offline_max: int = 1000  # newest entries kept per user
    offline_ttl_s: int = 7 * 86_400
    unread_cap: int = 9999  # per conversation; counts saturate here
    dedup_ttl_s: int = 86_400
    # A user's unread and conversation keys in Redis expire this long after their
    # last use and are rebuilt from MongoDB when next needed (a week, as the
    # offline store and the group caches: an active user never pays a rebuild,
    # and keys a sender made for ids nobody uses go within the week).
    user_key_ttl_s: int = 7 * 86_400
    dep_timeout_s: float = 2.0  # per Redis / Mongo operation
    # At start-up a node waits this long for Redis and MongoDB to answer (a store
    # still starting, or too busy to prepare its indexes in one timeout) before
    # it gives up with a one-line error; 0: one try.
    startup_wait_s: float = 30.0
    sync_settle_ms: int = 1000  # sync cursors do not pass in-flight sends
    group_news_sync: int = 1  # 0: syncs read all the caller's groups (the index is still kept)
    # A person sends a few messages a second at most; bots use the server API.
    send_rate: float = 20.0  # sends per second per user on a node (token bucket)
    send_burst: int = 100
    max_inflight: int = 16  # concurrent ops per user on a node
    write_buffer_max: int = 1 << 20  # bytes queued on a socket before pushes skip it
    bad_frame_limit: int = 20  # bad frames per connection before close 1008
    op_rate: float = 300.0  # frames per second per user on a node, every op (recv_ack costs more)
    op_burst: int = 600
    refuse_rate: float = 10.0  # rate_limited refusals per second a connection may earn...
    refuse_burst: int = 100  # ...before it is closed with 1008 (it keeps flooding)
    reply_buffer_max: int = 1 << 20  # bytes queued on a socket before a reply closes it
    max_conns_per_user: int = 10  # WebSocket connections of one user on one node
    # A user's handshakes on a node (0: no limit): a client closed for flooding
    # that reconnects at once, over and over, repeats a connect's work each time
    # (its groups loaded and joined, its presence told).
    user_handshake_rate: float = 5.0  # handshakes per second per user on a node...
    user_handshake_burst: int = 50  # ... with this many saved up
    batch_max: int = 256  # documents per Mongo batch / commands per Redis pipeline
    mongo_linger_ms: float = 2.0  # wait this long for a Mongo write batch to fill
    mongo_inflight: int = 1  # Mongo write batches in flight at once
    pending_max: int = 20_000  # sends queued in a node before new ones get unavailable
    group_max_members: int = 100_000
    group_write_diffusion_max: int = 100  # groups up to this size: a box entry per member
    # Per client address, at the WebSocket edge (0: no limit). Behind a proxy the
    # address comes from X-Forwarded-For, believed only from IM_TRUSTED_PROXIES.
    ip_handshake_rate: float = 50.0  # handshakes per second per address...
    ip_handshake_burst: int = 200  # ... with this many saved up
    max_conns_per_ip: int = 2000  # open connections per address on a node
    trusted_proxies: str = ""  # comma-separated addresses or CIDR blocks
    # Privacy defaults (a user's own settings override them): who may send a
    # user 1:1 messages, see its presence, add it to a group.
    privacy_dm: str = "everyone"  # everyone | contacts
    privacy_presence: str = "contacts"  # everyone | contacts | nobody
    privacy_group_add: str = "everyone"  # everyone | contacts
    max_new_convs_per_day: int = 500  # 1:1 conversations started with users who never wrote
    relation_lookup_rate: float = 5.0  # users looked up per second per user (typing,
    relation_lookup_burst: int = 1000  # receipts, presence) when not remembered; 0: none
    push_confirm_ms: int = 500  # an ack waits this long at most for its pushes' hand-off (0: not)
    max_groups_owned: int = 200  # groups one user owns
    max_groups_joined: int = 2000  # groups one user is a member of (an add past it: refused)
    group_creates_per_min: int = 10  # groups one user creates per minute, across the nodes
    feed_push_max: int = 5000  # authors with more followers are pulled at read time
    feed_timeline_max: int = 800  # timeline entries kept per user
    feed_text_max: int = 2000  # characters of a post
    feed_queue_max: int = 10_000  # posts waiting for fan-out before posting waits
    listen_backlog: int = 4096  # the WebSocket listener's accept queue (asyncio's default: 100)
    room_window_ms: float = 25.0  # a room's messages are coalesced over this window
    room_history: int = 100  # messages kept per room for join history and recovery; 0: off
    room_history_ttl_s: float = 300.0  # ...kept at most this long
    room_reorder_ms: float = 50.0  # a gap in a room's positions is waited for this long
    room_write_at_once: int = 1000  # rooms up to this many members here: written at once
    room_write_chunk: int = 100  # a bigger room is written this many members per loop turn
    room_rate_cap: float = 50.0  # room messages/s delivered to each member; 0: no cap
    room_buffer_max: int = 262_144  # bytes queued on a socket before room frames skip it
    room_pending_max: int = 10_000  # room messages queued per window before drops
    room_send_rate: float = 10.0  # room_send per second per user on a node
    room_send_burst: int = 20
    room_max_per_conn: int = 16  # rooms one connection may be in
    room_unbind_delay_s: float = 30.0  # an empty room keeps its broker binding this long
    room_report_s: float = 1.0  # counts not written at join/leave are retried this often
    room_refresh_s: float = 15.0  # every local room count is rewritten this often
    stuck_close_s: float = 30.0  # a socket skipped for backlog this long is closed
    heartbeat_s: float = 2.0
    heartbeat_ttl_s: float = 6.0
    drain_timeout_s: float = 10.0
    # -- HTTP edge and tokens --
    env: str = "development"  # "production": no start without IM_AUTH_SECRET
    auth_secret_file: str = ""  # "": $XDG_STATE_HOME (~/.local/state)/imgate/auth_secret
    auth_max_ttl_s: int = 30 * 86_400  # longest token lifetime: exp - iat, exp - now
    auth_leeway_s: int = 30  # clock skew allowed on exp, iat, nbf
    auth_public_key_file: str = ""  # PEM: also verify RS256 / ES256 tokens with it
    auth_issuer: str = ""  # required iss claim ("": not checked)
    auth_audience: str = ""  # required aud claim ("": not checked)
    http_header_timeout_s: float = 10.0  # request line + headers must arrive within this
    http_body_timeout_s: float = 30.0  # the body must arrive within this after the headers
    http_body_max: int = 65_536  # bytes of a request body (over: 413, unread)
    http_rate: float = 50.0  # HTTP calls per second per user on a node; 0: no limit
    http_burst: int = 100
    feed_follow_max: int = 2000  # users one user may follow (Weibo's cap)
    metrics_host: str = "127.0.0.1"  # /metrics listener, apart from the API
    metrics_port: int = 9464  # 0: any free port; -1: no separate listener
    metrics_public: int = 0  # 1: also serve /metrics on the API port
    public_ws_url: str = ""  # the WebSocket URL clients are told (GET /v1/info); "": derived
    cors_origins: str = ""  # comma-separated origins whose browsers may call the HTTP API
    api_keys: str = ""  # comma-separated keys of the server API (/v1/server/*); "": off
    events: str = "offline,presence"  # event types (or prefixes) to {ns}.events; none: no events
    events_pending_max: int = 10_000  # events waiting for the broker before new ones drop
    events_pending_per_user: int = 500  # ... and of those, caused by one user
    recall_window_s: float = 120.0  # a sender may recall a message this long after sending
    presence_subs_max: int = 1000  # users one user may watch (presence_sub), all its connections
    presence_grace_s: float = 5.0  # a user is offline once no device was back for this long
    register_grace_s: float = 30.0  # a device not fully registered (Redis down) this long: 1012

    @property
    def event_types(self) -> tuple[str, ...]:
        return tuple(t.strip() for t in self.events.split(",")
                     if t.strip() and t.strip() != "none")

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
            values[f.name] = _convert(f.name, raw, type(getattr(cls, f.name)))
        values.update(overrides)
        settings = cls(**values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        if not _NAMESPACE.fullmatch(self.namespace):
            raise ConfigError("IM_NAMESPACE must be 1-32 characters of [A-Za-z0-9_-]")
        if not -1 <= self.node_id <= 255:
            raise ConfigError("IM_NODE_ID must be in 0..255 (or unset to lease one)")
        if self.broker not in ("rabbitmq", "memory"):
            raise ConfigError("IM_BROKER must be rabbitmq or memory")
        if self.broker == "rabbitmq":
            try:
                parse_amqp_urls(self.amqp_url)
            except AmqpUrlError as exc:
                raise ConfigError(str(exc)) from None
        if self.redis_cluster:
            try:
                cluster_seeds(self.redis_url)
            except ValueError as exc:
                raise ConfigError(f"IM_REDIS_URL: {exc}") from None
        if self.auth_secret and len(self.auth_secret.encode()) < 32:
            raise ConfigError("IM_AUTH_SECRET must be at least 32 bytes (RFC 7518 3.2 for HS256)")
        for name in ("max_body", "max_frame", "offline_max", "batch_max", "pending_max",
                     "user_key_ttl_s",
                     "op_rate", "op_burst", "refuse_rate", "refuse_burst", "reply_buffer_max",
                     "max_conns_per_user",
                     "room_window_ms", "room_buffer_max", "room_pending_max",
                     "room_max_per_conn", "room_report_s", "room_refresh_s", "stuck_close_s",
                     "feed_timeline_max", "feed_text_max", "feed_queue_max",
                     "events_pending_max", "events_pending_per_user", "presence_grace_s",
                     "register_grace_s",
                     "recall_window_s",
                     "presence_subs_max", "room_history_ttl_s", "room_reorder_ms",
                     "room_write_chunk", "room_write_at_once", "listen_backlog",
                     "max_groups_owned", "max_groups_joined", "group_creates_per_min",
                     "max_new_convs_per_day"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"IM_{name.upper()} must be positive")
        for name in ("room_rate_cap", "room_send_rate", "room_unbind_delay_s", "room_history",
                     "group_write_diffusion_max", "group_max_members", "feed_push_max",
                     "ip_handshake_rate", "ip_handshake_burst", "max_conns_per_ip",
                     "push_confirm_ms", "relation_lookup_rate", "relation_lookup_burst",
                     "user_handshake_rate", "user_handshake_burst"):
            if getattr(self, name) < 0:
                raise ConfigError(f"IM_{name.upper()} must not be negative")
        self._validate_edge()

    def _validate_edge(self) -> None:
        """The HTTP edge and token settings."""
        for name, choices in (("privacy_dm", ("everyone", "contacts")),
                              ("privacy_presence", ("everyone", "contacts", "nobody")),
                              ("privacy_group_add", ("everyone", "contacts"))):
            if getattr(self, name) not in choices:
                raise ConfigError(f"IM_{name.upper()} must be one of {', '.join(choices)}")
        try:
            Proxies.parse(self.trusted_proxies)
        except ValueError as exc:
            raise ConfigError(f"IM_TRUSTED_PROXIES: {exc}") from None
        if self.env not in ("development", "production"):
            raise ConfigError("IM_ENV must be development or production")
        if self.auth_secret in PUBLIC_SECRETS:
            raise ConfigError("IM_AUTH_SECRET is a published development value; "
                              "set a secret of your own")
        if self.env == "production" and not self.auth_secret:
            raise ConfigError("IM_ENV=production needs IM_AUTH_SECRET (at least 32 bytes); "
                              "refusing to start on a generated secret")
        for name in ("auth_max_ttl_s", "http_header_timeout_s", "http_body_timeout_s",
                     "http_body_max", "http_burst", "feed_follow_max"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"IM_{name.upper()} must be positive")
        for name in ("auth_leeway_s", "http_rate"):
            if getattr(self, name) < 0:
                raise ConfigError(f"IM_{name.upper()} must not be negative")
        if not -1 <= self.metrics_port <= 65_535:
            raise ConfigError("IM_METRICS_PORT must be a port, 0 (any free one) or -1 (none)")
        if self.redis_cluster not in (0, 1):
            raise ConfigError("IM_REDIS_CLUSTER must be 0 or 1")
        if self.metrics_public not in (0, 1):
            raise ConfigError("IM_METRICS_PUBLIC must be 0 or 1")
        if self.group_news_sync not in (0, 1):
            raise ConfigError("IM_GROUP_NEWS_SYNC must be 0 or 1")
        if any(len(k) < 24 for k in self.api_key_list):
            raise ConfigError("IM_API_KEYS: each key must be at least 24 characters")
        for origin in self.cors_origin_list:
            if origin != "*" and not re.fullmatch(r"https?://[^/\s,]+", origin):
                raise ConfigError(f"IM_CORS_ORIGINS: {origin!r} is not an origin "
                                  "(scheme://host[:port], or *)")


def _convert(name: str, raw: str, kind: type) -> object:
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"IM_{name.upper()}={raw!r} is not a {kind.__name__}") from None
    return raw
