"""A big room's frames, written by a cursor a chunk of members per loop turn.

Writing one frame to 10,000 loopback sockets takes ~90 ms here (most of it
the kernel's TCP work for each write). Done in one go it holds the loop that
long; done frame after frame, a message waits for the frame before it to
reach every member and then for its own: two passes. A ``RoomRing`` keeps
the room's recent frames and, per member, the last one written to it. A
cursor walks the members (a snapshot taken when its pass starts), a chunk per
loop turn, and writes each member every frame it has not had yet in one
write (``writelines``: one system call however many frames). A frame added
mid-pass reaches the members ahead of the cursor in this pass and those
behind it in the next, so a message waits at most one pass, and a member
gets one write per pass however many frames came: the room's effective
window widens to the time a pass takes when the room is big and busy, and
narrows by itself when it quiets (adaptive coalescing).

Order holds: frames are added in order and a member is written a contiguous
run of them, oldest first. A member that joins while the ring runs starts
after the newest frame; one that leaves is written nothing more, even if the
pass's snapshot still holds it. A pass drops the frames
every member had before it began; a pass that found nothing new ends the ring.
Pure bookkeeping: the writes go through ``SocketWriter`` (skip and stuck rules).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gateway.hub import Client

__all__ = ["RoomRing"]

# clients, their wires, frames' messages -> how many took them
WriteGroup = Callable[[Sequence[Client], list[bytes], int], int]
_GONE = 1 << 62  # ``seen`` of a member that left: past any frame


class RoomRing:
    __slots__ = ("frames", "frags", "added", "base", "start", "seen", "clients", "next",
                 "pass_head")

    def __init__(self, clients: list[Client]) -> None:
        self.frames: list[list[bytes]] = []  # each frame's wire bytes; seq = base + index
        self.frags: list[int] = []  # messages in each frame
        self.added: list[float] = []  # time.monotonic() each frame came
        self.base = 1  # seq of frames[0]
        self.start = 0  # what a member with no entry in ``seen`` has had
        self.seen: dict[int, int] = {}  # conn id -> seq of the last frame it was written
        self.clients = clients  # this pass's members
        self.next = 0  # the cursor: index in ``clients``
        self.pass_head = 0  # the newest frame when this pass began

    @property
    def head(self) -> int:
        """Seq of the newest frame (``base - 1`` when none is kept)."""
        return self.base + len(self.frames) - 1

    def add(self, wires: list[bytes], frags: int, now: float) -> None:
        self.frames.append(wires)
        self.frags.append(frags)
        self.added.append(now)

    def joined(self, conn_id: int) -> None:
        """A member that joins now gets what comes after."""
        self.seen[conn_id] = self.head

    def left(self, conn_id: int) -> None:
        """Not written again (it may still be in this pass's snapshot)."""
        self.seen[conn_id] = _GONE

    def step(self, chunk: int, write: WriteGroup) -> tuple[int, int, bool]:
        """Write the next ``chunk`` members what they lack: (writes, messages
        delivered, whether the pass is over)."""
        head, base, start, seen = self.head, self.base, self.start, self.seen
        end = min(self.next + chunk, len(self.clients))
        groups: dict[int, list[Client]] = {}  # last frame had -> members
        for client in self.clients[self.next:end]:
            last = seen.get(client.id, start)
            if last < head:
                group = groups.get(last)
                if group is None:
                    groups[last] = [client]
                else:
                    group.append(client)
                seen[client.id] = head  # written, skipped for backlog, or closed: done
        writes = delivered = 0
        for last, members in groups.items():
            i = max(last + 1, base) - base
            wires = [w for frame in self.frames[i:] for w in frame]
            msgs = sum(self.frags[i:])
            took = write(members, wires, msgs)
            writes += took * len(wires)
            delivered += took * msgs
        self.next = end
        return writes, delivered, end >= len(self.clients)

    def end_pass(self, now: float) -> list[float]:
        """A pass is over: drop the frames every member had before it began;
        returns how long each dropped frame took to reach every member (s)."""
        k = self.pass_head - self.base + 1
        if k <= 0:
            return []
        took = [now - t for t in self.added[:k]]
        del self.frames[:k], self.frags[:k], self.added[:k]
        self.base += k
        return took

    def new_pass(self, clients: list[Client]) -> bool:
        """Start the next pass over ``clients`` if a frame came during the last
        one; False when every member has had everything (the ring is done)."""
        if self.head <= self.pass_head:
            return False
        seen, start = self.seen, self.start
        self.seen = {c.id: seen.get(c.id, start) for c in clients}  # the gone are forgotten
        self.clients, self.next, self.pass_head = clients, 0, self.head
        return True


def first_pass(clients: list[Client], wires: list[bytes], frags: int) -> RoomRing:
    """A ring whose first pass writes its first frame."""
    ring = RoomRing(clients)
    ring.add(wires, frags, time.monotonic())
    ring.pass_head = ring.head
    return ring
