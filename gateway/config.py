"""Node settings, read from ``IM_*`` environment variables."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

__all__ = ["ConfigError", "Settings"]

_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,32}")


class ConfigError(ValueError):
    """A setting that cannot be used; the message names the variable."""


@dataclass(frozen=True)
class Settings:
    """Everything a node needs; defaults point at the local servers."""

    redis_url: str = "redis://127.0.0.1:6379/0"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/"
    mongo_url: str = "mongodb://127.0.0.1:27017"
    auth_secret: str = "dev-only-secret-change-me-0123456789"
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
    dep_timeout_s: float = 2.0  # per Redis / Mongo operation
    sync_settle_ms: int = 1000  # sync cursors do not pass in-flight sends
    send_rate: float = 200.0  # sends per second per connection (token bucket)
    send_burst: int = 400
    max_inflight: int = 64  # concurrent sends per connection
    write_buffer_max: int = 1 << 20  # bytes queued on a socket before pushes skip it
    bad_frame_limit: int = 20  # bad frames per connection before close 1008
    batch_max: int = 256  # documents per Mongo batch / commands per Redis pipeline
    mongo_linger_ms: float = 2.0  # wait this long for a Mongo write batch to fill
    mongo_inflight: int = 1  # Mongo write batches in flight at once
    pending_max: int = 20_000  # sends queued in a node before new ones get unavailable
    group_max_members: int = 100_000
    group_write_diffusion_max: int = 100  # groups up to this size: a box entry per member
    feed_push_max: int = 5000  # authors with more followers are pulled at read time
    feed_timeline_max: int = 800  # timeline entries kept per user
    feed_text_max: int = 2000  # characters of a post
    feed_queue_max: int = 10_000  # posts waiting for fan-out before posting waits
    room_window_ms: float = 25.0  # a room's messages are coalesced over this window
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
        if len(self.auth_secret.encode()) < 32:
            raise ConfigError("IM_AUTH_SECRET must be at least 32 bytes (RFC 7518 3.2 for HS256)")
        for name in ("max_body", "max_frame", "offline_max", "batch_max", "pending_max",
                     "room_window_ms", "room_buffer_max", "room_pending_max",
                     "room_max_per_conn", "room_report_s", "room_refresh_s", "stuck_close_s",
                     "feed_timeline_max", "feed_text_max", "feed_queue_max"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"IM_{name.upper()} must be positive")
        for name in ("room_rate_cap", "room_send_rate", "room_unbind_delay_s",
                     "group_write_diffusion_max", "group_max_members", "feed_push_max"):
            if getattr(self, name) < 0:
                raise ConfigError(f"IM_{name.upper()} must not be negative")


def _convert(name: str, raw: str, kind: type) -> object:
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
    except ValueError:
        raise ConfigError(f"IM_{name.upper()}={raw!r} is not a {kind.__name__}") from None
    return raw
