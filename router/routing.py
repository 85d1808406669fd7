"""Broker routing keys: the one place they are built and parsed.

A node's queue is bound, on the room exchange, to one key per room and per
group it holds a local member of. A room's key is the room id itself (ids
are ``[A-Za-z0-9_.:-]``); a group's is ``g|<group>``: ``|`` occurs in no id,
so the two never collide and a key tells which it is. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["KeyKind", "group_key", "parse_key", "room_key"]

KeyKind = Literal["room", "group"]

_GROUP = "g|"


def room_key(room: str) -> str:
    """The routing key of a room's traffic."""
    return room


def group_key(group: str) -> str:
    """The routing key of a group's pushes."""
    return _GROUP + group


def parse_key(key: str) -> tuple[KeyKind, str]:
    """What a routing key routes: ``("room", id)`` or ``("group", id)``."""
    if key.startswith(_GROUP):
        return "group", key[len(_GROUP):]
    return "room", key
