"""The node's local group map: group -> this node's connections of its members.

Filled when a device connects (from the user's memberships) and changed by
membership updates (``gadd`` / ``gdel`` controls from whichever node took
them). A group message reaches a node once (the node's queue is bound to the
group's routing key, ``router.routing.group_key``, while it holds a member)
and is written here to every local device of every member: framed once, the
same bytes, through the node's socket writer, without awaiting.
"""

from __future__ import annotations

from gateway.hub import Client, ConnectionIndex, Hub
from router.routing import group_key

# ``group_key`` is re-exported for modules that still import it from here.
__all__ = ["GroupHub", "group_key"]


class GroupHub:
    """Group -> local devices of its members (a ``ConnectionIndex``)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.members: ConnectionIndex[str] = ConnectionIndex("groups")

    def add(self, client: Client, group: str) -> bool:
        """True if ``client`` is the group's first local device."""
        return self.members.add(group, client)

    def remove(self, client: Client, group: str) -> bool:
        """True if that emptied the group here."""
        return self.members.remove(group, client)

    def remove_all(self, client: Client) -> list[str]:
        """Take ``client`` out of every group; returns the groups that emptied."""
        return self.members.remove_all(client)[1]

    def user_devices(self, user: str) -> list[Client]:
        return list(self.hub.users.get(user, {}).values())

    def deliver_group(self, group: str, frame: bytes, skip_conn: int | None = None) -> int:
        devices = self.members.get(group)
        return self.hub.write_each(devices.values(), frame, skip_conn) if devices else 0
