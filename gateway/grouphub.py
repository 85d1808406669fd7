"""The node's local group map: group -> this node's connections of its members.

Filled when a device connects (from the user's memberships) and changed by
membership updates (``gadd`` / ``gdel`` controls from whichever node took
them). A group message reaches a node once (the node's queue is bound to
``g|<group>`` while it holds a member) and is written here to every local
device of every member, the same bytes, without awaiting.
"""

from __future__ import annotations

from gateway.hub import Client, Hub

__all__ = ["GroupHub", "group_key"]


def group_key(group: str) -> str:
    """The broker routing key of a group (``|`` never occurs in an id)."""
    return f"g|{group}"


class GroupHub:
    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.members: dict[str, dict[int, Client]] = {}

    def add(self, client: Client, group: str) -> bool:
        """True if ``client`` is the group's first local device."""
        devices = self.members.get(group)
        first = devices is None
        if devices is None:
            devices = self.members[group] = {}
        devices[client.id] = client
        if client.groups is None:
            client.groups = set()
        client.groups.add(group)
        return first

    def remove(self, client: Client, group: str) -> bool:
        """True if that emptied the group here."""
        devices = self.members.get(group)
        if devices is None or devices.pop(client.id, None) is None:
            return False
        if client.groups is not None:
            client.groups.discard(group)
        if not devices:
            del self.members[group]
            return True
        return False

    def remove_all(self, client: Client) -> list[str]:
        return [g for g in list(client.groups or ()) if self.remove(client, g)]

    def user_devices(self, user: str) -> list[Client]:
        return list(self.hub.users.get(user, {}).values())

    def deliver_group(self, group: str, frame: bytes, skip_conn: int | None = None) -> int:
        devices = self.members.get(group)
        return self.hub.write_each(devices.values(), frame, skip_conn) if devices else 0
