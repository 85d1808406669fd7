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
from store.feed_ports import CounterStore, Doc, FeedCache, FollowStore, PostStore, TimelineStore
from store.message_ports import ConvSettingStore, ReactionStore
from store.records import (
    Beat,
    ChatMessage,
    ConversationRow,
    Delivery,
    DeviceEntry,
    Erasure,
    GroupMessage,
    GroupState,
    Membership,
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
        """Edited messages' new frames in users' Redis views (never over a
        recall's tombstone or a later edit)."""
        ...

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

    async def release(self, user: str, conn: str) -> None: ...

    async def devices(self, user: str) -> list[DeviceEntry]:
        """Every entry, oldest first (a dead node's too: callers filter)."""
        ...


class SanctionStore(Protocol):
    """Bans and token revocations set by the server API (read at each handshake
    and HTTP call, never per frame)."""

    async def get(self, user: str) -> Sanctions: ...

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
                             forget: Sequence[str] = ()) -> dict[str, int]:
        """Publish ``node``'s oldest mid in flight, drop ``forget``'s, read all."""
        ...

    async def claim_dead(self, dead: str, node: str, ttl_s: float) -> bool:
        """Whether ``node`` now holds the claim on redelivering ``dead``'s sends
        (taken, or already its own); the claim lapses after ``ttl_s``."""
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


class GroupStore(Protocol):
    """Groups' durable truth: members, the seq counter, one copy per message."""

    async def create(self, group: str, name: str, owner: str, members: Sequence[str]
                     ) -> None: ...

    async def get(self, group: str) -> Doc | None: ...

    async def count_owned(self, owner: str) -> int:
        """Groups ``owner`` owns and has not dissolved."""
        ...

    async def add_members(self, group: str, users: Sequence[str]) -> tuple[list[str], int]: ...

    async def remove_member(self, group: str, user: str) -> bool: ...

    async def member_ids(self, group: str) -> list[str]: ...

    async def user_groups(self, user: str) -> dict[str, Membership]: ...

    async def memberships(self, group: str, users: Sequence[str]) -> dict[str, Membership]:
        """Current memberships of these users (non-members left out)."""
        ...

    async def page_members(self, group: str, after: str | None, limit: int) -> list[str]: ...

    async def former(self, group: str, user: str) -> Membership | None:
        """The membership ``user`` held in ``group`` when it was dissolved."""
        ...

    async def get_many(self, groups: Sequence[str]) -> dict[str, Doc]: ...

    async def lock(self, group: str, token: str, now_ms: int, ttl_ms: int) -> bool | None:
        """The group's administration lease: taken, held by another, no such group."""
        ...

    async def unlock(self, group: str, token: str) -> None: ...

    async def set_info(self, group: str, *, name: str | None = None,
                       owner: str | None = None) -> None: ...

    async def dissolve(self, group: str) -> None: ...

    async def retire_members(self, group: str) -> list[str]: ...

    async def set_reads(self, reads: Sequence[tuple[str, str, int]]) -> None: ...

    async def recall(self, mid: int, sender: str) -> GroupMessage | None:
        """Mark recalled, body dropped; None if ``sender`` sent no group message ``mid``."""
        ...

    async def sender_of(self, mid: int) -> str | None: ...

    async def by_mid(self, mid: int) -> GroupMessage | None:
        """The group message ``mid``, whatever its group."""

    async def edit(self, group: str, seq: int, sender: str, body: bytes, at_ms: int) -> bool:
        """As ``MessageStore.edit``."""

    async def mark_reacted(self, group: str, seq: int) -> None: ...

    async def reacted_among(self, mids: Sequence[int]) -> set[int]: ...

    async def recalled_seqs(self, group: str, limit: int) -> list[int]: ...

    async def allocate(self, group: str, n: int, lastmid: int, rdmid: int) -> int:
        """The group's new seq after taking ``n``; ``GroupGone`` once dissolved."""
        ...

    async def insert(self, msgs: Sequence[GroupMessage]
                     ) -> list[GroupMessage | BaseException]: ...

    async def fill(self, msgs: Sequence[GroupMessage]) -> None: ...

    async def page(self, group: str, *, from_seq: int, after: int | None = None,
                   before: int | None = None, limit: int = 50, only_rd: bool = False
                   ) -> list[GroupMessage]: ...

    async def message(self, group: str, mid: int) -> GroupMessage | None: ...

    # Stored messages of every group and node, ``low <= mid <= high``, mid order.
    async def between(self, low: int, high: int, limit: int) -> list[GroupMessage]: ...

    async def seq_of(self, group: str, mid: int) -> int | None: ...

    async def last(self, group: str, lastmid: int = 0) -> GroupMessage | None:
        """The group's newest stored message; ``lastmid`` (the group's document
        says so) is tried first with a point read."""
        ...

    async def rd_index(self, group: str, scan: int) -> tuple[list[tuple[int, int]], int]:
        """(mid, seq) of the read-diffused messages among the group's newest
        ``scan`` messages, and the floor: every read-diffused message above it
        is in the list (0: the list is the group's whole past)."""
        ...


class GroupCache(Protocol):
    """The groups' hot state in Redis, rebuilt from ``GroupStore`` when incomplete."""

    async def is_member(self, group: str, user: str) -> bool: ...

    async def members(self, groups: Iterable[str]) -> dict[str, list[str]]: ...

    async def sizes(self, groups: Iterable[str]) -> dict[str, int]: ...

    async def added(self, group: str, users: Sequence[str], from_seq: int,
                    complete: bool = False) -> None: ...

    async def removed(self, group: str, user: str) -> None: ...

    async def dissolved(self, group: str, users: Sequence[str]) -> None:
        """The group leaves its members' group lists; its member set is emptied."""
        ...

    async def memberships(self, group: str, users: Sequence[str]) -> dict[str, Membership]:
        """(from seq, read seq) of each of these users who is a member."""
        ...

    async def user_groups(self, user: str) -> dict[str, Membership]: ...

    async def user_groups_among(self, user: str, groups: Sequence[str]
                                ) -> dict[str, Membership]:
        """Those of ``groups`` the user is in (work in their number only)."""
        ...

    async def groups_of(self, users: Sequence[str]) -> list[list[str]]: ...

    async def set_read(self, user: str, group: str, seq: int) -> int | None: ...

    async def states(self, groups: Iterable[str], *, last: bool = True
                     ) -> dict[str, GroupState]:
        """Each group's state; ``last=False`` leaves the newest message out
        (``last`` None: a list of many groups reads only their numbers)."""
        ...

    async def recalled(self, group: str, seq: int, mid: int, tombstone: bytes) -> None:
        """A recalled message leaves members' unread (and the state's last)."""
        ...

    async def edited(self, group: str, seq: int, mid: int, frame: bytes, at_ms: int) -> None:
        """An edited message's kept frame goes; the state's last, if it is it,
        becomes ``frame``."""
        ...

    async def created(self, group: str) -> None: ...

    async def record(self, updates: Sequence[tuple[str, int, int, bytes, int]],
                     senders: Sequence[tuple[str, str, int]] = (),
                     rd: Sequence[tuple[str, int, int, bytes]] = ()) -> None:
        """After a batch: the groups' state, the senders' read seqs, and
        (group, mid, seq, client frame) of each read-diffused message for the
        groups' indexes and kept frames."""
        ...

    async def rd_frames(self, wanted: Mapping[str, Sequence[int]]
                        ) -> dict[str, list[bytes] | None]:
        """Per group, the client frames of these seqs as kept in Redis, in their
        order; None for a group missing any (too old, too big, or gone)."""
        ...

    async def rd_after(self, groups: Mapping[str, int], since: int, count: int
                       ) -> dict[str, list[tuple[int, int]] | None]:
        """Per group (-> the member's from_seq), (mid, seq) of its first
        ``count`` read-diffused messages after ``since`` with a seq above
        from_seq, from its index; None where the index does not reach back to
        ``since`` (or is gone): MongoDB must be asked."""
        ...

    async def rebuild_rd(self, group: str) -> None:
        """The group's index of read-diffused messages, from MongoDB."""
        ...

    async def info_versions(self, groups: Sequence[str]) -> dict[str, int]:
        """How often each group's name, owner or size changed (0: never, or not
        known): a node's copy of a group's document is good while it matches."""
        ...

    async def info_changed(self, group: str) -> None: ...


class GroupNews(Protocol):
    """Each user's groups with news (read-diffused messages) since a point."""

    async def due(self, newest: Mapping[str, int]) -> list[str]:
        """Groups (-> newest read-diffused message time, ms) to ``mark`` now."""
        ...

    async def mark(self, scores: Mapping[str, int], members: Mapping[str, Sequence[str]]
                   ) -> None: ...

    async def joined(self, group: str, users: Sequence[str], now_ms: int) -> None: ...

    async def news(self, user: str, since_ms: int) -> list[str] | None:
        """Groups that may have news after ``since_ms``; None: not known (the
        caller reads all its groups and ``seed``s the index)."""
        ...

    async def seed(self, user: str, scores: Mapping[str, int]) -> None: ...
