"""The boundaries of what users add to messages and conversations: reactions
and per-conversation settings (re-exported by ``store.ports``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from store.records import ConvSettings

__all__ = ["ChangeLog", "ConvSettingStore", "ReactionStore"]


class ReactionStore(Protocol):
    """Who reacted to a message with which emoji, and the counts."""

    async def apply(self, mid: int, user: str, emoji: str, on: bool, at_ms: int
                  ) -> tuple[bool, bool]:
        """(changed, built): the message's counts were built now (a first reaction)."""
        ...

    async def counts(self, mids: Sequence[int], reacted: Mapping[int, bool] | None = None
                     ) -> dict[int, dict[str, int]]:
        """Each message's counts by emoji (messages without reactions left out)."""
        ...

    async def tally(self, mids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Counts from MongoDB alone (while Redis is down)."""
        ...

    async def emoji_of(self, mid: int) -> set[str]: ...

    async def users(self, mid: int, emoji: str, after: str | None, limit: int) -> list[str]:
        ...


class ConvSettingStore(Protocol):
    """Each user's settings of its conversations (muted, pinned, archived)."""

    async def put(self, user: str, conv: str, value: ConvSettings) -> None: ...

    async def of_user(self, user: str) -> dict[str, ConvSettings]:
        """The user's conversations with a setting on."""
        ...

    async def of_users(self, users: Sequence[str]) -> dict[str, dict[str, ConvSettings]]: ...

    async def muted_by(self, conv: str, limit: int) -> list[str]: ...


class ChangeLog(Protocol):
    """The messages changed (edited, reacted to, recalled) by position."""

    async def note(self, mid: int, position: int, *, users: Sequence[str] = (),
                   group: str | None = None) -> None:
        """``mid`` changed at ``position``: in these users' 1:1 logs, or the group's."""
        ...

    async def since(self, user: str, groups: Mapping[str, int], after: int, limit: int
                    ) -> list[tuple[int, int, str | None]]:
        """(position, mid, group or None) after ``after``, oldest first."""
        ...
