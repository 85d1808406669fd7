"""What a user does to messages already stored, and who is told: ``read``
(the reader's other devices follow, the 1:1 peer gets a ``receipt``),
``recall`` (a tombstone for both sides, ``recalled`` pushed), ``edit``
(``edited`` pushed), ``react`` (``reaction`` pushed), delete for me; and a
user's settings of a conversation (its devices get ``conv_settings``).

One route look-up for everyone told, then the router's batched push (one
envelope per node). The WebSocket ops and the HTTP calls share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from core.ids import mid_time_ms
from core.throttle import Throttle
from gateway import frames
from gateway.chat.service import ChatService, IdSource
from gateway.contacts.service import Relations
from gateway.errors import ProtocolError
from gateway.groups.service import GroupService
from gateway.hooks.client import Hooks
from gateway.hub import Client
from gateway.inbox.conversations import GROUP_PREFIX, Conversations
from gateway.inbox.edits import Edits
from gateway.inbox.reactions import Reactions
from gateway.presence.subs import PresenceSubs
from gateway.presence.watch import PresenceQuery
from store.ports import ChangeLog, ConvSettingStore, GroupCache
from store.records import ChatMessage, ConvSettings, GroupMessage

__all__ = ["MessageOps", "Notifier"]

TYPING_EVERY_S = 2.0


class Notifier(Protocol):
    """``router.Router``: pushes to users, and to a group's online members."""

    async def push_frames(self, items: Sequence[tuple[str, bytes]],
                          skip_conn: int | None = None) -> None: ...

    def publish_group(self, group: str, frame: bytes, skip_conn: int | None = None
                      ) -> None: ...


@dataclass(frozen=True, slots=True)
class Features:
    """Edit, reactions and conversation settings (``MessageOps``'s)."""

    edits: Edits
    reactions: Reactions
    settings: ConvSettingStore
    group_cache: GroupCache
    pinned_max: int
    changes: ChangeLog
    mids: IdSource  # a change's position in sync: a fresh mid
    hooks: Hooks | None = None


class MessageOps:
    def __init__(self, conversations: Conversations, chat: ChatService, groups: GroupService,
                 notifier: Notifier,
                 recall_window_s: float, in_group_here: Callable[[str, int], bool],
                 watchers: PresenceSubs, presence: PresenceQuery,
                 relations: Relations | None = None,
                 features: Features | None = None) -> None:
        self.conversations = conversations
        self.chat = chat
        self.groups = groups
        self.notifier = notifier
        self.recall_window_ms = int(recall_window_s * 1000)
        self.in_group_here = in_group_here  # (group, connection): bound on this node
        self._typing = Throttle(TYPING_EVERY_S)
        self.watchers = watchers
        self.presence = presence
        self.relations = relations  # who may reach whom (None: everyone, everyone)
        self.features = features

    async def presence_sub(self, client: Client, users: list[str], rid: object
                           ) -> dict[str, dict[str, object]]:
        """Watch ``users`` (changes come as ``presence`` frames); their state now.
        A user whose presence the caller may not see is ``{"hidden": true}`` and
        not watched: no change of it is ever pushed to the caller."""
        await self.watchers.precheck(client, users, rid)  # at the cap: refused before any read
        if self.relations is not None and not self.relations.afford(client.user, users):
            raise ProtocolError("rate_limited", "too many users looked up; slow down "
                                "(IM_RELATION_LOOKUP_RATE)")
        shown = await self.visible(client.user, users)
        await self.watchers.watch(client, [u for u in users if u in shown], rid)
        return await self.presence_state(client.user, users, shown)

    async def visible(self, watcher: str, users: list[str]) -> set[str]:
        if self.relations is None:
            return set(users)
        return await self.relations.visible(watcher, users)

    async def presence_state(self, watcher: str, users: list[str],
                             shown: set[str] | None = None) -> dict[str, dict[str, object]]:
        """Each user's presence as ``watcher`` may see it (``hidden`` otherwise)."""
        if shown is None:
            shown = await self.visible(watcher, users)
        state = await self.presence.state([u for u in users if u in shown])
        return {u: state[u] if u in shown else {"hidden": True} for u in users}

    async def presence_unsub(self, client: Client, users: list[str]) -> None:
        await self.watchers.unwatch(client, users)

    async def recheck_watches(self, users: list[str]) -> None:
        """``users``' relations changed (settings, blocks, contacts): the watches
        of them here whose watcher may no longer see them end, so no change of
        them is pushed to it from now on (a ``presence_sub`` again answers
        ``hidden``). Who sees U depends on U's side only, so the watches of
        ``users`` are the ones to check."""
        if self.relations is None:
            return
        for watcher, watched in self.watchers.watching(users).items():
            shown = await self.visible(watcher, sorted(watched))
            if hidden := sorted(watched - shown):
                await self.watchers.drop(watcher, hidden)

    async def typing(self, user: str, conn: int, conv: str) -> None:
        """Ephemeral: at most one per conversation per 2 s per user on this node
        (extras dropped), never stored; a group's goes through its broker
        binding to the members online, from a connection bound to the group."""
        if conv == user:
            return
        if not conv.startswith(GROUP_PREFIX) and self.relations is not None and (
                not self.relations.afford(user, [conv])
                or not await self.relations.may_reach(user, conv)):
            return  # dropped silently, as a send there would be refused
        if not self._typing.allow((user, conv), time.monotonic()):
            return
        if conv.startswith(GROUP_PREFIX):
            group = conv[len(GROUP_PREFIX):]
            if self.in_group_here(group, conn):
                self.notifier.publish_group(
                    group, frames.typing(conv, user), conn)
            return
        await self.notifier.push_frames(
            [(conv, frames.typing(user, user))])

    async def read(self, user: str, conv: str, mid: int, skip_conn: int | None = None) -> int:
        """Read up to ``mid``; the reader's other devices get ``read`` with the new
        count, a 1:1 peer's devices a ``receipt``. Returns the count."""
        unread = await self.conversations.mark_read(user, conv, mid)
        told = [(user, frames.read(conv, mid, unread))]
        if not conv.startswith(GROUP_PREFIX) and (
                self.relations is None or (self.relations.afford(user, [conv])
                                           and await self.relations.may_reach(user, conv))):
            told.append((conv, frames.receipt(user, mid)))
        await self.notifier.push_frames(told, skip_conn)
        return unread

    async def recall(self, user: str, mid: int) -> None:
        """The sender takes back a 1:1 or group message within ``IM_RECALL_WINDOW_S``:
        both users' devices, or the group's members online, get ``recalled``."""
        if mid_time_ms(mid) + self.recall_window_ms < time.time() * 1000:
            raise ProtocolError("forbidden", "the recall window has passed")
        try:
            m = await self.chat.recall(user, mid)
        except ProtocolError as err:
            if err.code != "not_found":
                raise
            g = await self.groups.recall(user, mid)  # not a 1:1 message: a group's?
            await self._changed(g)
            conv = f"g:{g.group}"
            self.notifier.publish_group(
                g.group, frames.recalled(mid, conv, user))
            return
        await self._changed(m)
        await self.notifier.push_frames([
            (m.sender, frames.recalled(mid, m.to, user)),
            (m.to, frames.recalled(mid, m.sender, user))])

    async def forget(self, user: str, mid: int) -> None:
        """Delete for me: out of the caller's box, sync and history only."""
        await self.chat.forget(user, mid)

    # -- edit, react, conversation settings ------------------------------------------
    def _features(self) -> Features:
        if self.features is None:
            raise ProtocolError("bad_request", "not served by this node")
        return self.features

    async def edit(self, user: str, mid: int, body: bytes) -> None:
        """The sender's new body (the ``send`` hook vets it first): both users'
        devices, or the group's members online, get ``edited``."""
        f = self._features()
        hooks = f.hooks if f.hooks is not None and f.hooks.on("send") else None

        async def vet(m: ChatMessage | GroupMessage, given: bytes) -> bytes:
            assert hooks is not None
            target = {"to": m.to} if isinstance(m, ChatMessage) else {"group": m.group}
            return await hooks.edit(user, target, m.cmid, m.mid, given)

        done = await f.edits.edit(user, mid, body, vet if hooks is not None else None)
        m, at = done.msg, done.at_ms
        await self._changed(m)
        new = m.body if isinstance(m.body, bytes) else body
        if isinstance(m, ChatMessage):
            await self.notifier.push_frames([
                (m.sender, frames.edited(mid, m.to, new, at)),
                (m.to, frames.edited(mid, m.sender, new, at))])
        else:
            self.notifier.publish_group(m.group, frames.edited(mid, f"g:{m.group}", new, at))

    async def react(self, user: str, mid: int, emoji: str, on: bool) -> None:
        """Add or remove ``user``'s ``emoji``: if that changed anything, both
        users' devices (or the group's members online) get ``reaction``."""
        done = await self._features().reactions.react(user, mid, emoji, on)
        if not done.changed:
            return
        m = done.msg
        await self._changed(m)
        if isinstance(m, ChatMessage):
            await self.notifier.push_frames([
                (m.sender, frames.reaction(mid, m.to, user, emoji, on)),
                (m.to, frames.reaction(mid, m.sender, user, emoji, on))])
        else:
            self.notifier.publish_group(
                m.group, frames.reaction(mid, f"g:{m.group}", user, emoji, on))

    async def _changed(self, m: ChatMessage | GroupMessage) -> None:
        """``m`` changed (before the caller is answered): a device that already
        had it finds it again in its next sync (``ChangeLog``)."""
        f = self.features
        if f is None:
            return
        if isinstance(m, ChatMessage):
            await f.changes.note(m.mid, f.mids.next(), users=[m.sender, m.to])
        else:
            await f.changes.note(m.mid, f.mids.next(), group=m.group)

    async def reaction_users(self, user: str, mid: int, emoji: str, after: str | None,
                             limit: int) -> list[str]:
        return await self._features().reactions.users(user, mid, emoji, after, limit)

    async def set_conversation(self, user: str, conv: str, changes: Mapping[str, bool]
                               ) -> ConvSettings:
        """Change some of ``user``'s settings of ``conv``; all its devices get
        ``conv_settings`` with the three of them."""
        f = self._features()
        if conv == user:
            raise ProtocolError("bad_request", "conv must be another user or g:GROUP")
        if conv.startswith(GROUP_PREFIX) and not await f.group_cache.is_member(
                conv[len(GROUP_PREFIX):], user):
            raise ProtocolError("forbidden", "not a member of this group")
        mine = await f.settings.of_user(user)
        old = mine.get(conv, ConvSettings())
        new = replace(old, **changes)
        if new.pinned and not old.pinned and \
                sum(1 for v in mine.values() if v.pinned) >= f.pinned_max:
            raise ProtocolError("forbidden", f"at most {f.pinned_max} conversations may be "
                                "pinned (IM_PINNED_MAX)")
        if new != old:
            await f.settings.put(user, conv, new)
        await self.notifier.push_frames([(user, frames.conv_settings(conv, {
            "muted": new.muted, "pinned": new.pinned, "archived": new.archived}))])
        return new
