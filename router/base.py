"""The router's boundaries: what it needs from the node and from a broker.
(The routes it reads are ``store.ports.RouteStore``.)"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Protocol

__all__ = ["Binder", "Broker", "BrokerStatus", "GroupDelivery", "LocalDelivery",
           "RoomDelivery"]


@dataclass(frozen=True)
class BrokerStatus:
    """The broker link, as ``/healthz`` and the metrics report it (no I/O)."""

    connected: bool
    node_index: int  # the IM_AMQP_URL entry in use (0: a broker of one); -1: none
    reconnects: int  # links restored after a loss
    failovers: int  # of which to another URL of IM_AMQP_URL


class LocalDelivery(Protocol):
    """The node's connection map, as the router sees it."""

    def deliver_to_user(self, user: str, frame: bytes, skip_conn: int | None) -> int:
        """Write ``frame`` to every local connection of ``user`` but ``skip_conn``.

        Never awaits; returns how many sockets took it.
        """
        ...


class RoomDelivery(Protocol):
    """The node's room maps, as the router sees them."""

    def deliver_room(self, room: str, fragment: bytes, prio: int, pos: int = 0,
                     epoch: str | None = None) -> None:
        """Queue one encoded room message for this node's members of ``room``
        (``pos`` / ``epoch``: its position, when rooms keep history).

        Never awaits; a room without local members drops it (counted).
        """
        ...


class GroupDelivery(Protocol):
    """The node's group map, as the router sees it."""

    def deliver_group(self, group: str, frame: bytes, skip_conn: int | None) -> int:
        """Write ``frame`` to every local device of the group's members; never awaits."""
        ...


class PresenceDelivery(Protocol):
    """The node's presence subscriptions, as the router sees them."""

    def deliver_presence(self, user: str, frame: bytes) -> int:
        """Write ``frame`` to every local device watching ``user``; never awaits."""
        ...


class Binder(Protocol):
    """Binds this node's queue to a room's or group's routing key (``routing.py``)."""

    async def bind_key(self, key: str) -> None:
        """Receive ``key``'s envelopes from now on (kept across reconnects)."""
        ...

    async def unbind_key(self, key: str) -> None: ...

    def bound_keys(self) -> AbstractSet[str]:
        """The keys this node's queue is bound to (or being bound to); a new
        broker link binds every one of them again before it carries anything."""
        ...


class Broker(Binder, Protocol):
    """Carries envelopes between nodes. Implementations: ``broker_*.py``."""

    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None: ...

    async def publish(self, node: str, envelope: bytes) -> None:
        """Raise ``BrokerUnavailable`` if the broker did not take it."""
        ...

    async def publish_key(self, key: str, envelope: bytes) -> None:
        """To every other node bound to ``key`` (never back to this one)."""
        ...

    async def publish_event(self, key: str, body: bytes, event_id: str) -> None:
        """One event to the durable topic exchange ``{ns}.events``, persistent,
        ``event_id`` its AMQP message id; returns once the broker confirmed it;
        ``BrokerUnavailable`` otherwise."""
        ...

    def status(self) -> BrokerStatus:
        """The link's state now, from what the broker watches (no I/O)."""
        ...

    async def close(self) -> None: ...
