"""In-process broker: a single node without RabbitMQ (``IM_BROKER=memory``)."""

from __future__ import annotations

from collections.abc import Callable

from router.base import BrokerStatus

__all__ = ["MemoryBroker"]


class MemoryBroker:
    """One node's broker that talks only to itself: pushes to its own name
    arrive, room envelopes (never sent back to their origin) go nowhere."""

    def __init__(self) -> None:
        self._nodes: dict[str, Callable[[bytes], None]] = {}
        self._keys: dict[str, set[str]] = {}  # routing key -> bound nodes
        self.node = ""
        self.binds = 0
        self.unbinds = 0
        self.events_dropped = 0

    @property
    def is_connected(self) -> bool:
        """Always: there is no link to lose."""
        return True

    async def publish_event(self, key: str, body: bytes, event_id: str) -> None:
        """No broker, no one to tell: events of a memory-broker node go nowhere."""
        self.events_dropped += 1

    def status(self) -> BrokerStatus:
        return BrokerStatus(connected=True, node_index=0, reconnects=0, failovers=0)

    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None:
        self.node = node
        self._nodes[node] = on_envelope

    async def publish(self, node: str, envelope: bytes) -> None:
        handler = self._nodes.get(node)
        if handler is not None:
            handler(envelope)

    async def publish_key(self, key: str, envelope: bytes) -> None:
        for node in self._keys.get(key, ()):
            handler = self._nodes.get(node)
            if node != self.node and handler is not None:
                handler(envelope)

    async def bind_key(self, key: str) -> None:
        self._keys.setdefault(key, set()).add(self.node)
        self.binds += 1

    def bound_keys(self) -> set[str]:
        return {k for k, nodes in self._keys.items() if self.node in nodes}

    async def unbind_key(self, key: str) -> None:
        nodes = self._keys.get(key)
        if nodes is not None:
            nodes.discard(self.node)
            if not nodes:
                del self._keys[key]
        self.unbinds += 1

    async def close(self) -> None:
        self._nodes.pop(self.node, None)
        for key in [k for k, nodes in self._keys.items() if self.node in nodes]:
            await self.unbind_key(key)
