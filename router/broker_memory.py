"""In-process broker: single-node mode, and nodes sharing one process."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["MemoryBroker"]


class MemoryBroker:
    """Delivers an envelope to nodes started in the same process (same instance)."""

    def __init__(self) -> None:
        self._nodes: dict[str, Callable[[bytes], None]] = {}

    async def start(self, node: str, on_envelope: Callable[[bytes], None],
                    on_resume: Callable[[float], None] | None = None) -> None:
        self._nodes[node] = on_envelope

    async def publish(self, node: str, envelope: bytes) -> None:
        handler = self._nodes.get(node)
        if handler is not None:
            handler(envelope)

    async def close(self) -> None:
        self._nodes.clear()
