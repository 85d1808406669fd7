"""The router's boundaries: what it needs from the node, a broker, the routes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

__all__ = ["Broker", "GroupDelivery", "LocalDelivery", "RoomDelivery", "RoutePurger"]


class LocalDelivery(Protocol):
    """The node's connection map, as the router sees it."""

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        """Write ``frame`` to every local connection of ``user`` but ``skip_conn``.

        Never awaits; returns how many sockets took it.
        """
        ...


class RoomDelivery(Protocol):
    """The node's room maps, as the router sees them."""

    def deliver_room(self, room: str, fragment: bytes, prio: int) -> None:
        """Queue one encoded room message for this node's members of ``room``.

        Never awaits; a room without local members drops it (counted).
        """
        ...


class GroupDelivery(Protocol):
    """The node's group map, as the router sees it."""

    def deliver_group(self, group: str, frame: bytes, skip_conn: int | None) -> int:
        """Write ``frame`` to every local device of the group's members; never awaits."""
        ...


class Broker(Protocol):
    """Carries envelopes between nodes. Implementations: ``broker_*.py``."""

    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None: ...

    async def publish(self, node: str, envelope: bytes) -> None:
        """Raise ``BrokerUnavailable`` if the broker did not take it."""
        ...

    async def publish_room(self, room: str, envelope: bytes) -> None:
        """To every other node bound to ``room`` (never back to this one)."""
        ...

    async def bind_room(self, room: str) -> None:
        """Receive ``room``'s envelopes from now on (kept across reconnects)."""
        ...

    async def unbind_room(self, room: str) -> None: ...

    async def close(self) -> None: ...


class RoutePurger(Protocol):
    """Deletes routes that point at dead nodes."""

    async def purge_many(self, dead: Mapping[str, Iterable[str]]) -> None:
        """``dead``: user -> route fields to delete; one round trip."""
        ...
