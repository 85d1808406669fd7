"""One small Protocol per store boundary; the services see only these.

Implementations are named by suffix (``offline_redis.py``, ``messages_mongo.py``,
...) and built by ``store.open_stores``. Every method raises
``core.errors.Unavailable`` when its server cannot answer: nothing was stored.
Unit tests build services from fakes of these Protocols; integration tests
use the real implementations.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from core.errors import Unavailable
from core.room_history import RoomLog
from store.feed_ports import (
    CounterStore,
    FeedCache,
    FollowStore,
    LikeRow,
    PostStore,
    TimelineStore,
)
from store.group_ports import GroupCache, GroupNews, GroupStore
from store.message_ports import ChangeLog, ConvSettingStore, ReactionStore
from store.records import (
    Beat,
    ChatMessage,
    ConversationRow,
    Delivery,
    DeviceClaim,
    DeviceEntry,
    Erasure,
    GroupMessage,
    OfflinePage,
    Rewrite,
    Sanctions,
    StoredMessage,
)

__all__ = [
    "CounterStore",
    "DedupStore",
    "FeedCache",
    "FollowStore",
    "GroupCache",
    "GroupNews",
    "GroupStore",
    "LeaseKeeper",
    "LikeRow",
    "MessageStore",
    "NodeDirectory",
    "NodeLease",
    "OfflineStore",
    "PostStore",
    "RoomCountStore",
    "RouteStore",
    "SanctionStore",
    "TimelineStore",
    "WatchStore",
    "ReactionStore",
    "ConvSettingStore",
    "ChangeLog",
]



class DedupStore(Protocol):
    """(sender, cmid) -> the mid it was first stored under (``core.dedup`` values)."""

    async def claim(self, claims: Sequence[tuple[str, str, int]]) -> list[str | None]:
        """For each (sender, cmid, new mid): None if new, else the stored value."""
        ...


class OfflineStore(Protocol):
    """Per-user fast state: offline entries, unread counts, conversation list."""

    async def deliver(self, deliveries: Sequence[Delivery],
                      acked: Sequence[tuple[str, str, str]], *, routes: bool = True
                      ) -> list[dict[str, str]]:
        """Record the deliveries, set each (sender, cmid) dedup value (acked), and
        read each owner's routes, in one round trip; one routes dict per delivery."""
        ...

    async def mark_read(self, user: str, conv: str, mid: int) -> int: ...

    async def erase(self, erasures: Sequence[Erasure]) -> None:
        """Recalled or deleted messages out of users' Redis views (unread fixed)."""
        ...

    async def rewrite(self, rewrites: Sequence[Rewrite]) -> None:
        """Edited messages' new frames (never over a tombstone or a later edit)."""

    async def ack(self, user: str, *, mids: Sequence[int] = (), upto: int = -1) -> None: ...

    async def page(self, user: str, since: int, count: int) -> OfflinePage: ...

    # A page MongoDB answered after ``since`` (``whole``: all it had), kept.
    async def fill(self, user: str, since: int, version: str,
                   rows: Sequence[tuple[int, bytes]], whole: bool) -> bool: ...

    async def recent(self, users: Sequence[str], since: int, count: int
                     ) -> list[list[bytes]]: ...

    async def conversations(self, user: str, count: int, upto: int | None = None
                            ) -> tuple[int, list[ConversationRow]]:
        """(total unread, the ``count`` newest conversations with a last mid of
        at most ``upto``)."""
        ...

    async def conversations_of(self, user: str, convs: Sequence[str]
                               ) -> list[ConversationRow]:
        """The rows of these conversations of ``user`` (those in its list)."""
        ...

    async def ping(self) -> None: ...


class MessageStore(Protocol):
    """Durable message bodies and per-user boxes (the truth sync falls back on)."""

    async def store_batch(self, msgs: Sequence[ChatMessage]) -> list[int | BaseException]:
        """Per message the authoritative mid (its own, or the original one)."""
        ...

    async def box_page(self, owner: str, *, conv: str | None = None,
                       after: int | None = None, before: int | None = None,
                       limit: int = 50) -> list[StoredMessage]: ...

    async def recall(self, mid: int, sender: str) -> ChatMessage | None:
        """Mark recalled, body dropped; None if ``sender`` sent no 1:1 message ``mid``."""
        ...

    async def sender_of(self, mid: int) -> str | None: ...

    async def edit(self, mid: int, sender: str, body: bytes, at_ms: int) -> bool:
        """The sender's new body, unless recalled or edited later meanwhile."""

    async def mark_reacted(self, mid: int) -> None:
        """The message has had reactions (their counts are the reaction store's)."""

    async def reacted_among(self, mids: Sequence[int]) -> set[int]: ...

    async def in_box(self, owner: str, mids: Sequence[int]) -> set[int]: ...

    async def get_many(self, mids: Sequence[int]) -> dict[int, ChatMessage]: ...

    async def get(self, mid: int) -> ChatMessage | None:
        """The 1:1 message ``mid`` (recalled: without body), or None."""
        ...

    async def between(self, node: int, low: int, high: int, limit: int) -> list[ChatMessage]:
        """1:1 messages whose mids node ``node`` issued with ``low <= mid <=
        high``, in mid order, at most ``limit``."""
        ...

    async def forget(self, owner: str, mid: int) -> str | None:
        """Remove from ``owner``'s box only; the entry's conversation, or None."""
        ...

    async def add_missing_boxes(self, msgs: Sequence[ChatMessage]) -> int:
        """Both box entries of each stored message that has neither (its body
        was written, its boxes not: the node died or the write failed between
        the two); a message with one entry left (the other side deleted its
        copy) is left as it is. Returns how many got theirs."""
        ...

    async def add_group_boxes(self, entries: Sequence[tuple[GroupMessage, Sequence[str]]]
                              ) -> None:
        """A box entry per (message, member) of write-diffused groups; idempotent."""
        ...

    async def set_read_marks(self, marks: Sequence[tuple[str, str, int]]) -> None:
        """(user, conv, mid) read marks, each only ever moving up; one round trip."""
        ...

    async def peer_read_marks(self, user: str, peers: Sequence[str]) -> dict[str, int]:
        """peer -> how far that peer has read its 1:1 conversation with ``user``
        (its read mark), for those of ``peers`` with one; one round trip."""
        ...

    async def ping(self) -> None: ...

    async def ensure_indexes(self) -> None: ...


class InboxSource(Protocol):
    """What a user's 1:1 conversation list and unread are rebuilt from once
    their Redis keys expired (``OfflineStore``'s, reading ``MessageStore``'s
    collections)."""

    async def inbox_entries(self, owner: str, limit: int) -> list[tuple[int, str, bool]]:
        """The newest ``limit`` box entries: (mid, conv, sent by the owner)."""
        ...

    async def read_marks(self, user: str, convs: Sequence[str]) -> dict[str, int]:
        """conv -> highest mid read, for those of ``convs`` with a mark."""
        ...

    async def set_read_marks(self, marks: Sequence[tuple[str, str, int]]) -> None:
        """(user, conv, mid) marks, each raised to at least ``mid``."""
        ...

    async def recalled_among(self, to: str, mids: Sequence[int]) -> set[int]: ...

    async def get_many(self, mids: Sequence[int]) -> dict[int, ChatMessage]:
        """The 1:1 messages among ``mids`` (recalled ones without body)."""
        ...


class RouteStore(Protocol):
    """user -> {connection: node} for every connected device."""

    async def add(self, routes: Sequence[tuple[str, str, int]]) -> None: ...

    async def remove(self, routes: Sequence[tuple[str, str, int]]) -> None: ...

    async def lookup(self, users: Sequence[str]) -> list[dict[str, str]]: ...

    async def last_seen(self, users: Sequence[str]) -> list[int | None]:
        """When each user's device last disconnected (unix s), if known."""
        ...

    async def purge_many(self, dead: Mapping[str, Iterable[str]]) -> None: ...


class PresenceStore(Protocol):
    """Announced presence across nodes (``presence.online`` / ``offline`` once each)."""

    async def arrive(self, node: str, users: Sequence[str], *, announce: bool = True
                     ) -> list[str]:
        """Those of ``users`` whose presence is new (to announce online)."""
        ...

    async def depart(self, users: Sequence[str], dead_nodes: Sequence[str], *,
                     node: str | None = None) -> list[str]:
        """Those whose presence ended (no device on a live node): announce offline."""
        ...

    async def take(self, node: str, n: int) -> list[str]:
        """Users a dead node answered for, each to one caller only."""
        ...


class WatchStore(Protocol):
    """The users each user watches the presence of, counted once across its
    connections and nodes (``IM_PRESENCE_SUBS_MAX``). A node's entries lapse
    ``lease_s`` after it last wrote or renewed them, and at once when a caller
    names the node dead."""

    lease_s: float

    async def add(self, watcher: str, node: str, users: Sequence[str], cap: int,
                  dead_nodes: Sequence[str]) -> tuple[bool, int]:
        """``node`` holds ``users`` for ``watcher``, unless that would make the
        watcher watch more than ``cap`` users (then nothing is added):
        (added, users watched now)."""
        ...

    async def count(self, watcher: str, dead_nodes: Sequence[str]) -> int:
        """The users ``watcher`` watches now (the dead nodes' entries forgotten)."""
        ...

    async def restore(self, watcher: str, node: str, users: Sequence[str]) -> None:
        """``node``'s entries for ``watcher`` again, uncapped (they lapsed, or Redis
        lost them, while its connections still watch them)."""
        ...

    async def remove(self, watcher: str, node: str, users: Sequence[str]) -> int:
        """``node`` holds ``users`` for ``watcher`` no more: the users it watches now."""
        ...

    async def renew(self, node: str, watchers: Sequence[str]) -> list[str]:
        """Renew ``node``'s lease for each of ``watchers``: those whose entries
        were gone (to ``restore``)."""
        ...


class DeviceStore(Protocol):
    """Each user's connected devices across the nodes, and the login policy's
    slots (``core.devices``)."""

    async def claim(self, user: str, conn: str, device: str, platform: str, slot: str,
                    since_ms: int) -> list[str]:
        """``conn`` takes ``slot``; returned: the user's other connections that
        held it or are of the same device (removed: the caller closes them).
        Atomic: of two claims of one slot at once, the later one keeps it."""
        ...

    async def claim_many(self, claims: Sequence[DeviceClaim]) -> list[list[str]]:
        """Each ``claim``, in one round trip (a connect storm's batch)."""
        ...

    async def release(self, user: str, conn: str) -> None: ...

    async def release_many(self, pairs: Sequence[tuple[str, str]]) -> None:
        """(user, connection) entries dropped, in one round trip."""
        ...

    async def devices(self, user: str) -> list[DeviceEntry]:
        """Every entry, oldest first (a dead node's too: callers filter)."""
        ...

    async def devices_many(self, users: Sequence[str]) -> list[list[DeviceEntry]]: ...


class SanctionStore(Protocol):
    """Bans and token revocations set by the server API (read at each handshake
    and HTTP call, never per frame)."""

    async def get(self, user: str) -> Sanctions: ...

    async def get_many(self, users: Sequence[str]) -> list[Sanctions]:
        """Each user's, in one round trip (the handshakes of a batch)."""
        ...

    async def ban(self, user: str, until: float) -> None: ...

    async def unban(self, user: str) -> None: ...

    async def revoke(self, user: str, before: float, keep_s: float) -> None: ...

    async def room_muted(self, room: str, user: str) -> float:
        """Unix time ``user``'s mute in ``room`` ends; 0 if not muted."""
        ...

    async def mute(self, room: str, user: str, until: float) -> None: ...

    async def unmute(self, room: str, user: str) -> None: ...


class NodeDirectory(Protocol):
    """Which nodes are alive (heartbeats, written by the ``LeaseKeeper``)."""

    async def leave(self, node: str) -> None: ...

    async def share_inflight(self, node: str, oldest: int | None,
                             forget: Sequence[str] = (), live: int | None = None
                             ) -> tuple[dict[str, int], dict[str, int]]:
        """Publish ``node``'s oldest mid that may still land and its oldest of
        sends under way (``live``), drop ``forget``'s, read all: (oldest, live)."""
        ...

    async def claim_dead(self, dead: str, node: str, ttl_s: float) -> bool:
        """Whether ``node`` now holds the claim on redelivering ``dead``'s sends
        (taken, or already its own); the claim lapses after ``ttl_s``."""
        ...

    async def release_dead(self, dead: str, node: str) -> None:
        """``node`` gives up its claim on ``dead`` (it stops before it is done):
        another live node may take it at once, not when it lapses."""
        ...

    async def forget_marks(self, nodes: Sequence[str]) -> None:
        """Drop these (dead, redelivered) nodes' in-flight marks now."""
        ...


class LeaseKeeper(Protocol):
    """Renews the lease and the heartbeat from a thread of its own, so nothing
    on the event loop can delay them; reports each beat."""

    def start(self, report: Callable[[Beat | Unavailable], None]) -> None: ...

    def beat_once(self) -> Beat | Unavailable:
        """One beat now (blocking: run it off the event loop)."""
        ...

    def stop(self) -> None: ...


class NodeLease(Protocol):
    """The node number (mid node bits) a node holds while it lives."""

    token: str
    number: int

    async def acquire(self, wanted: int = -1) -> int: ...

    async def release(self) -> None: ...


class RoomCountStore(Protocol):
    """Live-room member counts per node."""

    async def report(self, node: str, counts: Mapping[str, tuple[int, int]]
                     ) -> dict[str, tuple[int, int]]:
        """Write this node's (connections, distinct users) per room; read the
        rooms' totals across live nodes."""
        ...

    async def totals(self, rooms: Iterable[str]) -> dict[str, tuple[int, int]]: ...

    async def forget_node(self, node: str, rooms: Iterable[str]) -> None: ...


class RoomHistoryStore(Protocol):
    """Live rooms' message positions and recent history."""

    async def append(self, batches: Sequence[tuple[str, Sequence[bytes]]], new_epoch: str
                     ) -> list[tuple[str, int]]: ...

    async def read(self, rooms: Sequence[tuple[str, bool]]) -> list[RoomLog]: ...


class RelationStore(Protocol):
    """Privacy settings, blocks, and the "has sent to" half of contacts."""

    async def privacy_of(self, users: Sequence[str]) -> dict[str, dict[str, str]]:
        """The settings each user changed (absent: none)."""
        ...

    async def set_privacy(self, user: str, changes: Mapping[str, str]) -> dict[str, str]: ...

    async def block(self, a: str, b: str) -> None: ...

    async def unblock(self, a: str, b: str) -> None: ...

    async def blocks_page(self, a: str, after: str | None, limit: int) -> list[str]: ...

    async def blocking(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which of these (a blocked b) pairs exist."""
        ...

    async def note_sent(self, pairs: Sequence[tuple[str, str]]) -> None: ...

    async def contacts(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        """Which (owner, other) pairs are contacts: a follow or a 1:1 message sent."""
        ...


class QuotaStore(Protocol):
    """Per-user counts over fixed windows, shared by every node."""

    async def take(self, user: str, what: str, limit: int, window_s: int) -> bool:
        """Count one; False when the window already held ``limit``."""
        ...
