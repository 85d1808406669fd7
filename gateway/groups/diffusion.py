"""Write diffusion of small groups: where a stored group message goes besides
its one copy. For groups up to ``IM_GROUP_WRITE_DIFFUSION_MAX``
members each member gets a box entry (MongoDB) and an offline entry (Redis),
so their sync and unread see it like a 1:1 message; bigger groups are read
by their members (read diffusion) and cost nothing here.

Live pushes of group messages are ``Router.publish_group``'s: one envelope
per node bound to the group, never one per member.
"""

from __future__ import annotations

from collections.abc import Sequence

from store.ports import GroupCache, MessageStore, OfflineStore
from store.records import Delivery, GroupMessage

__all__ = ["GroupDiffusion"]


class GroupDiffusion:
    def __init__(self, cache: GroupCache, messages: MessageStore, offline: OfflineStore
                 ) -> None:
        self.cache = cache
        self.messages = messages
        self.offline = offline

    async def diffuse(self, msgs: Sequence[tuple[GroupMessage, bytes]]) -> None:
        """A box entry and an offline entry per member for each (message, frame)."""
        if not msgs:
            return
        members = await self.cache.members({m.group for m, _ in msgs})
        await self.messages.add_group_boxes([(m, members[m.group]) for m, _ in msgs])
        await self.offline.deliver([
            Delivery(u, f"g:{m.group}", m.mid, frame, unread=False, conv_list=False)
            for m, frame in msgs for u in members[m.group]], [], routes=False)
