"""Editing a message already stored (1:1 or group): the sender only, within
``IM_EDIT_WINDOW_S``, never a recalled one.

MongoDB first (the truth sync and history read; an update that loses to a
recall or to a later edit changes nothing), then every Redis copy of the
message's frame: both users' offline entries and conversation previews for
1:1, each member's for a write-diffused group, the group's kept frame and
last message for a read-diffused one (``rewrite.lua`` / ``group_edit.lua``:
a recall's tombstone or a later edit is never overwritten, whatever order
they reach Redis in). Only then is the edit answered ``ok`` and pushed, so a
sync or history after the answer never shows the old body.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from core.ids import mid_time_ms
from gateway.errors import ProtocolError
from gateway.frames import conversation_last, encode, encode_group, msg_frame
from store.ports import GroupCache, GroupStore, MessageStore, OfflineStore
from store.records import ChatMessage, GroupMessage, Rewrite

__all__ = ["Edited", "Edits", "locate"]

# The product's hook on the new body (gateway.hooks: the send hook), or None.
EditVet = Callable[[ChatMessage | GroupMessage, bytes], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Edited:
    """An edit done: the message as it is now, and when it was edited."""

    msg: ChatMessage | GroupMessage
    at_ms: int


async def locate(messages: MessageStore, groups: GroupStore, mid: int
                 ) -> ChatMessage | GroupMessage | None:
    """The 1:1 or group message ``mid`` (two point reads at most)."""
    m = await messages.get(mid)
    if m is not None:
        return m
    return await groups.by_mid(mid)


class Edits:
    def __init__(self, messages: MessageStore, offline: OfflineStore, groups: GroupStore,
                 group_cache: GroupCache, window_s: float) -> None:
        self.messages = messages
        self.offline = offline
        self.groups = groups
        self.group_cache = group_cache
        self.window_ms = int(window_s * 1000)
        self._last_ms = 0

    def _now_ms(self) -> int:
        """Edit times, strictly increasing on this node (two edits of one
        message a millisecond apart are still ordered)."""
        self._last_ms = max(int(time.time() * 1000), self._last_ms + 1)
        return self._last_ms

    async def edit(self, user: str, mid: int, body: bytes, vet: EditVet | None = None
                   ) -> Edited:
        m = await locate(self.messages, self.groups, mid)
        if m is None:
            raise ProtocolError("not_found", "no such message")
        if m.sender != user:
            raise ProtocolError("forbidden", "only the sender may edit a message")
        if m.recalled:
            raise ProtocolError("forbidden", "a recalled message cannot be edited")
        if mid_time_ms(mid) + self.window_ms < time.time() * 1000:
            raise ProtocolError("forbidden", "the edit window has passed")
        if isinstance(m, GroupMessage) and not await self.group_cache.is_member(m.group, user):
            raise ProtocolError("forbidden", "not a member of this group")
        if vet is not None:
            body = await vet(m, body)
        # After the edit read (another node's clock may be ahead of this one's).
        at = max(self._now_ms(), m.edited + 1)
        if isinstance(m, ChatMessage):
            if not await self.messages.edit(mid, user, body, at):
                raise _lost()
            new = replace(m, body=body, edited=at)
            await self.offline.rewrite([self._rewrite(new, m.sender, m.to, at),
                                        self._rewrite(new, m.to, m.sender, at)])
            return Edited(new, at)
        if not await self.groups.edit(m.group, m.seq, user, body, at):
            raise _lost()
        g = replace(m, body=body, edited=at)
        frame = encode_group(g)
        await self.group_cache.edited(g.group, g.seq, g.mid, frame, at)
        if g.wd:
            members = (await self.group_cache.members([g.group])).get(g.group, [])
            await self.offline.rewrite([Rewrite(u, f"g:{g.group}", mid, frame, frame, at)
                                        for u in members])
        return Edited(g, at)

    @staticmethod
    def _rewrite(m: ChatMessage, owner: str, conv: str, at: int) -> Rewrite:
        return Rewrite(owner, conv, m.mid, encode(msg_frame(m)), conversation_last(m, owner), at)


def _lost() -> ProtocolError:
    return ProtocolError("forbidden", "the message was recalled, or edited again, meanwhile")
