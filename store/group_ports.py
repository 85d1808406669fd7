"""The boundaries of groups: their documents, members and messages in MongoDB
(``GroupStore``), their state kept in Redis (``GroupCache``), and each user's
groups with news (``GroupNews``). Re-exported by ``store.ports``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from store.feed_ports import Doc
from store.records import GroupMessage, GroupState, Membership

__all__ = ["GroupCache", "GroupNews", "GroupStore"]


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

    async def user_groups_many(self, users: Sequence[str]
                               ) -> dict[str, dict[str, Membership]]: ...

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

    async def by_mids(self, mids: Sequence[int]) -> dict[int, GroupMessage]: ...

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
        """An edited message's kept frame goes; the state's last becomes ``frame``."""

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
