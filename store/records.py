"""What crosses the store boundary: plain records, no driver types, no client frames.

The gateway turns records into client frames (``gateway/frames.py``); the
stores turn them into documents and keys. Encoded frames cross as opaque
``bytes`` (the offline store keeps the bytes that were pushed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "Beat",
    "Sanctions",
    "ChatMessage",
    "ConvSettings",
    "ConversationRow",
    "Delivery",
    "GroupMessage",
    "GroupState",
    "InboxLimits",
    "Membership",
    "OfflinePage",
    "Rewrite",
    "StoredMessage",
]


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """A 1:1 message as the send path hands it to the store."""

    mid: int
    sender: str
    to: str
    cmid: str
    body: Any  # None once recalled
    recalled: bool = False
    reply_to: int = 0  # the mid of the message of this conversation it answers (0: none)
    edited: int = 0  # unix ms of its last edit (0: never edited)
    reacted: bool = False  # it has had reactions (their counts are the reaction store's)


@dataclass(frozen=True, slots=True)
class Erasure:
    """One message leaving one user's Redis view (``OfflineStore.erase``)."""

    user: str
    conv: str  # as the user names it
    mid: int
    recall: bool  # True: ``frame`` (a tombstone) takes its place; False: deleted
    frame: bytes = b""  # forget: the conversation's newest message left, if any
    frame_mid: int = 0


@dataclass(frozen=True, slots=True)
class GroupMessage:
    group: str
    seq: int
    mid: int
    sender: str
    cmid: str
    body: Any  # None once recalled
    wd: bool  # also written to every member's box (write diffusion)
    recalled: bool = False
    reply_to: int = 0
    edited: int = 0
    reacted: bool = False


StoredMessage = ChatMessage | GroupMessage  # what a box page holds


@dataclass(frozen=True, slots=True)
class InboxLimits:
    offline_max: int = 1000
    offline_ttl_s: int = 7 * 86_400
    unread_cap: int = 9999
    convs_max: int = 1000
    dedup_ttl_s: int = 86_400
    pending_ttl_s: int = 60
    user_key_ttl_s: int = 7 * 86_400  # the inbox keys (unread, conversations), refreshed on use


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message to record for one user (the receiver, or the sender's copy)."""

    owner: str
    conv: str
    mid: int
    frame: bytes
    unread: bool
    conv_list: bool = True  # False: a group message (the group's row has its own state)
    preview: bytes = b""  # what the conversation list keeps as its last message (b"": frame)


@dataclass(frozen=True, slots=True)
class OfflinePage:
    """``complete`` False: the store cannot vouch for (since, ...]; ask MongoDB.
    ``version``: how many erasures (recalls, deletions) the store had seen, for a
    ``fill`` from what MongoDB answered instead."""

    complete: bool
    rows: list[tuple[int, bytes]]
    version: str = ""


@dataclass(frozen=True, slots=True)
class ConversationRow:
    conv: str
    mid: int  # of the last message
    unread: int
    last: bytes | None


@dataclass(frozen=True, slots=True)
class GroupState:
    seq: int
    lastmid: int
    last: bytes | None
    rdmid: int
    recalled: tuple[int, ...] = ()  # recalled seqs (the newest RECALLED_KEPT): not unread


@dataclass(frozen=True, slots=True)
class Membership:
    from_seq: int
    read_seq: int


@dataclass(frozen=True, slots=True)
class Beat:
    """One lease renewal and heartbeat of a node."""

    held: bool  # the node holds its number (it may mint mids)
    retaken: bool  # the lease had vanished (Redis lost its data) and was taken again
    live: dict[str, float]  # every node seen lately -> heartbeat expiry (unix s)
    lost: bool = False  # a master of a Redis Cluster lost its data (a canary vanished)
    read_at: float = 0.0  # when ``live`` was read (unix s): a lapse it shows was seen then


@dataclass(frozen=True, slots=True)
class Sanctions:
    """A user's ban and token revocation (unix seconds; 0: none)."""

    banned_until: float = 0.0
    revoked_before: float = 0.0


@dataclass(frozen=True, slots=True)
class Rewrite:
    """An edited message's new frame in one user's Redis view
    (``OfflineStore.rewrite``): its offline entry and, where it is the
    conversation's last message, the list's preview. ``edited`` (unix ms)
    orders rewrites: an older one never replaces a newer, and none replaces a
    recalled message's tombstone."""

    user: str
    conv: str  # as the user names it
    mid: int
    frame: bytes
    preview: bytes
    edited: int


@dataclass(frozen=True, slots=True)
class ConvSettings:
    """A user's settings of one conversation (all False: none stored)."""

    muted: bool = False
    pinned: bool = False
    archived: bool = False


@dataclass(frozen=True, slots=True)
class DeviceClaim:
    """A connection taking its device's slot (``DeviceStore.claim_many``)."""

    user: str
    conn: str
    device: str
    platform: str
    slot: str
    since_ms: int


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """A connected device of a user: its connection ("node:id"), device id,
    platform and since when (unix ms)."""

    conn: str
    device: str
    platform: str
    since_ms: int

    @property
    def node(self) -> str:
        return self.conn.rsplit(":", 1)[0]
