"""Where a message goes: the node(s) holding its receiver.

The gateway calls ``push_to_user`` and never awaits: local sockets get the
frame at once; remote nodes get an envelope through the broker (added by the
multi-node work). A push is best effort by design: the message is already in
the receiver's offline store, so a push that fails is recovered by sync.
"""

from __future__ import annotations

from router.base import LocalDelivery

__all__ = ["Router"]


class Router:
    """Fan-out decisions for one node."""

    def __init__(self, node: str, local: LocalDelivery) -> None:
        self.node = node
        self.local = local
        self.pushed = 0

    def push_to_user(self, user: str, frame: bytes, skip_conn: int | None = None) -> None:
        self.pushed += self.local.deliver_to_user(user, frame, skip_conn)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
