"""Broker routing keys: the one place they are built and parsed.

A node's queue is bound, on the room exchange, to one key per room and per
group it holds a local member of, and per user a local device watches the
presence of. A room's key is the room id itself (ids are
``[A-Za-z0-9_.:-]``); a group's is ``g|<group>``, a watched user's
``p|<user>``: ``|`` occurs in no id, so they never collide and a key tells
which it is. Pure: no I/O.
"""

from __future__ import annotations

from typing import Literal

__all__ = ["KeyKind", "group_key", "parse_key", "presence_key", "room_key"]

KeyKind = Literal["room", "group", "presence"]

_GROUP = "g|"
_PRESENCE = "p|"


def room_key(room: str) -> str:
    """The routing key of a room's traffic."""
    return room


def group_key(group: str) -> str:
    """The routing key of a group's pushes."""
    return _GROUP + group


def presence_key(user: str) -> str:
    """The routing key of a user's presence changes (bound by nodes with a
    device subscribed to that user)."""
    return _PRESENCE + user


def parse_key(key: str) -> tuple[KeyKind, str]:
    """What a routing key routes: ``("room", id)``, ``("group", id)`` or
    ``("presence", user)``."""
    if key.startswith(_GROUP):
        return "group", key[len(_GROUP):]
    if key.startswith(_PRESENCE):
        return "presence", key[len(_PRESENCE):]
    return "room", key
