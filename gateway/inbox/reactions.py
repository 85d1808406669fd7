"""Reactions: one emoji per user, on or off, on a message of a conversation
the user is in (1:1: its two users; a group: its members), at most
``IM_REACTION_EMOJI_MAX`` distinct emoji per message, none on a recalled one.

What a reaction costs does not grow with the conversation: one document in
MongoDB and one script on one shard of the message's counts in Redis
(``store/reactions_redis.py``), then one push (both users' devices, or one
envelope per node bound to the group). Counts are not written into stored
frames: sync and history add them to the messages that have some as they
answer (``attach``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from core.errors import Unavailable
from gateway.errors import ProtocolError
from gateway.inbox.edits import locate
from store.ports import GroupCache, GroupStore, MessageStore, ReactionStore
from store.records import ChatMessage, GroupMessage

__all__ = ["Reacted", "Reactions"]


@dataclass(frozen=True, slots=True)
class Reacted:
    msg: ChatMessage | GroupMessage
    changed: bool  # False: it already was so (nothing pushed)


class Reactions:
    def __init__(self, store: ReactionStore, messages: MessageStore, groups: GroupStore,
                 group_cache: GroupCache, emoji_max: int) -> None:
        self.store = store
        self.messages = messages
        self.groups = groups
        self.group_cache = group_cache
        self.emoji_max = emoji_max

    async def _reachable(self, user: str, mid: int) -> ChatMessage | GroupMessage:
        """Message ``mid`` if ``user`` is in its conversation, else ``not_found``
        (a stranger learns nothing of it)."""
        m = await locate(self.messages, self.groups, mid)
        if m is not None:
            if isinstance(m, ChatMessage):
                if user in (m.sender, m.to):
                    return m
            elif await self.group_cache.is_member(m.group, user):
                return m
        raise ProtocolError("not_found", "no such message in your conversations")

    async def react(self, user: str, mid: int, emoji: str, on: bool) -> Reacted:
        m = await self._reachable(user, mid)
        if m.recalled:
            raise ProtocolError("forbidden", "a recalled message takes no reactions")
        if on:
            have = await self.store.emoji_of(mid)
            if emoji not in have and len(have) >= self.emoji_max:
                raise ProtocolError("forbidden", f"a message carries at most {self.emoji_max} "
                                    "distinct emoji (IM_REACTION_EMOJI_MAX)")
        changed, built = await self.store.apply(mid, user, emoji, on, int(time.time() * 1000))
        if built and not m.reacted:  # sync and history know to look its counts up
            if isinstance(m, ChatMessage):
                await self.messages.mark_reacted(mid)
            else:
                await self.groups.mark_reacted(m.group, m.seq)
        return Reacted(m, changed)

    async def users(self, user: str, mid: int, emoji: str, after: str | None, limit: int
                    ) -> list[str]:
        await self._reachable(user, mid)
        return await self.store.users(mid, emoji, after, limit)

    async def attach(self, msgs: Sequence[Any], mids: Sequence[int]) -> list[Any]:
        """Sync and history entries (``mids[i]`` is ``msgs[i]``'s) with
        ``"reactions": {EMOJI: COUNT}`` added to the messages that have some.
        An entry is a dict (read from MongoDB, or a kept group frame) or the
        bytes kept in Redis (returned as ``orjson.Fragment``, parsed only when
        counts are added). One pipelined read of the messages' shards; a
        message whose shards are all missing is looked up in MongoDB only if
        its entry is a dict (its ``rx`` flag: the shards expired or were lost)."""
        wanted = [mid for entry, mid in zip(msgs, mids, strict=True) if _message(entry)]
        try:
            counts = await self.store.counts(wanted) if wanted else {}
        except Unavailable:  # Redis is down: MongoDB's reactions, counted here
            counts = {}
            unsure = wanted
        else:
            unsure = [mid for entry, mid in zip(msgs, mids, strict=True)
                      if isinstance(entry, dict) and mid not in counts and _message(entry)]
        if unsure:
            # Each kind of message asked of its own collection only (a page of
            # 1:1 messages costs one query, not two).
            group_msgs = {mid for entry, mid in zip(msgs, mids, strict=True)
                          if _is_group(entry)}
            direct = [m for m in unsure if m not in group_msgs]
            grouped = [m for m in unsure if m in group_msgs]
            flagged = {*(await self.messages.reacted_among(direct) if direct else ()),
                       *(await self.groups.reacted_among(grouped) if grouped else ())}
            if flagged:
                try:
                    counts.update(await self.store.counts(sorted(flagged),
                                                          dict.fromkeys(flagged, True)))
                except Unavailable:
                    counts.update(await self.store.tally(sorted(flagged)))
        out: list[Any] = []
        for entry, mid in zip(msgs, mids, strict=True):
            got = counts.get(mid)
            if isinstance(entry, bytes):
                if got:
                    frame = orjson.loads(entry)
                    frame["reactions"] = got
                    out.append(frame)
                else:
                    out.append(orjson.Fragment(entry))
                continue
            if got and isinstance(entry, dict):
                entry["reactions"] = got
            out.append(entry)
        return out


def _is_group(entry: Any) -> bool:
    if isinstance(entry, dict):
        return entry.get("op") == "group_msg"
    return isinstance(entry, bytes) and entry.startswith(b'{"op":"group_msg"')


def _message(entry: Any) -> bool:
    """A message entry not recalled (a stored frame looked into, not parsed:
    a tombstone's last field is ``"recalled":true``)."""
    if isinstance(entry, dict):
        return entry.get("op") in ("msg", "group_msg") and not entry.get("recalled")
    return isinstance(entry, bytes) and not entry.endswith(b'"recalled":true}')
