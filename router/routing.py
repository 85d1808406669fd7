"""Broker routing keys: the one place they are built and parsed.

A node's queue is bound, on the room exchange, to one key per room and per
group it holds a local member of, and per presence shard holding a user a
local device watches. A room's key is the room id itself (ids are
``[A-Za-z0-9_.:-]``); a group's is ``g|<group>``; a presence shard's
``p|<shard>``, where a user's shard is ``crc32(user) % PRESENCE_SHARDS``:
``|`` occurs in no id, so they never collide and a key tells which it is.
Presence is sharded so that a node binds at most ``PRESENCE_SHARDS`` keys for
it however many users its devices watch; a change is published to its user's
shard, and the nodes bound to the shard keep it only for users they watch.
Every node must use the same shard count. Pure: no I/O.
"""

from __future__ import annotations

import zlib
from typing import Literal

__all__ = ["PRESENCE_SHARDS", "KeyKind", "group_key", "parse_key", "presence_key",
           "presence_shard", "presence_shard_key", "room_key"]

KeyKind = Literal["room", "group", "presence"]

PRESENCE_SHARDS = 256  # presence keys a node may bind, at most

_GROUP = "g|"
_PRESENCE = "p|"


def room_key(room: str) -> str:
    """The routing key of a room's traffic."""
    return room


def group_key(group: str) -> str:
    """The routing key of a group's pushes."""
    return _GROUP + group


def presence_shard(user: str) -> int:
    """The presence shard of ``user`` (0 .. PRESENCE_SHARDS - 1)."""
    return zlib.crc32(user.encode()) % PRESENCE_SHARDS


def presence_shard_key(shard: int) -> str:
    """The routing key of a presence shard (bound by nodes with a device
    watching a user of it)."""
    return f"{_PRESENCE}{shard}"


def presence_key(user: str) -> str:
    """The routing key ``user``'s presence changes are published to: its shard's."""
    return presence_shard_key(presence_shard(user))


def parse_key(key: str) -> tuple[KeyKind, str]:
    """What a routing key routes: ``("room", id)``, ``("group", id)`` or
    ``("presence", shard)``."""
    if key.startswith(_GROUP):
        return "group", key[len(_GROUP):]
    if key.startswith(_PRESENCE):
        return "presence", key[len(_PRESENCE):]
    return "room", key
