"""A big room's frames, written by a cursor a chunk of members per loop turn.

Writing one frame to 10,000 loopback sockets takes ~90 ms here (most of it
the kernel's TCP work for each write). Done in one go it holds the loop that
long; done frame after frame, a message waits for the frame before it to
reach every member and then for its own: two passes. A ``RoomRing`` keeps
the room's recent frames and its members in a list; a cursor walks the
list, a chunk per loop turn, and writes each member every frame it has not
had yet in one write (one system call however many frames). A frame added
mid-pass reaches the members ahead of the cursor in this pass and those
behind it in the next, so a message waits at most one pass, and a member
gets one write per pass however many frames came: the room's effective
window widens to the time a pass takes when the room is big and busy, and
narrows by itself when it quiets (adaptive coalescing).

What each member has had is kept as runs, not per member: the cursor gives
every member it passes everything up to the newest frame, so along the list
"the last frame had" only steps up where a frame came mid-pass, and where
members joined. A pass costs the writes and little per member besides: a
dict lookup and a dict store per member, as kept before, were each a cache
miss at 10,000 members, and a good part of a worker's CPU.

Order holds: frames are added in order and a member is written a contiguous
run of them, oldest first. A member that joins while the ring runs is put
at the end of the list and starts after the newest frame; one that leaves
leaves a hole (``None``) that is written nothing, and the list is compacted
between passes once holes are many. A pass drops the frames every member
had before it began; a pass that found nothing new ends the ring. Pure
bookkeeping: the writes go through ``SocketWriter`` (skip and stuck rules).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from gateway.hub import Client

__all__ = ["RoomRing", "first_pass"]

# members (``None``: a hole), their wires, frames' messages -> how many took them
WriteRun = Callable[[Sequence[Client | None], list[bytes], int], int]


class _Runs:
    """What members had, along the list: ``lasts[k]`` for indexes from
    ``starts[k]`` up to the next start (the last run to the end)."""

    __slots__ = ("starts", "lasts")

    def __init__(self, start: int = 0, last: int | None = None) -> None:
        self.starts: list[int] = [] if last is None else [start]
        self.lasts: list[int] = [] if last is None else [last]

    def mark(self, start: int, last: int) -> None:
        """From ``start`` on (past every run's start), members had ``last``."""
        if not self.lasts or self.lasts[-1] != last:
            self.starts.append(start)
            self.lasts.append(last)


class RoomRing:
    __slots__ = ("frames", "frags", "added", "base", "clients", "index", "holes", "todo",
                 "done", "run", "next", "pass_head")

    def __init__(self, clients: list[Client]) -> None:
        self.frames: list[list[bytes]] = []  # each frame's wire bytes; seq = base + index
        self.frags: list[int] = []  # messages in each frame
        self.added: list[float] = []  # time.monotonic() each frame came
        self.base = 1  # seq of frames[0]
        self.clients: list[Client | None] = list(clients)  # None: a member that left
        self.index: dict[int, int] | None = None  # conn id -> place; built at the first leave
        self.holes = 0
        self.todo = _Runs(0, 0)  # what members ahead of the cursor had (nothing yet)
        self.done = _Runs()  # what members behind it had: all up to the head then
        self.run = 0  # the run of ``todo`` the cursor is in
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

    def joined(self, client: Client) -> None:
        """A member that joins now gets what comes after (it goes at the end)."""
        if self.index is not None:
            self.index[client.id] = len(self.clients)
        self.todo.mark(len(self.clients), self.head)
        self.clients.append(client)

    def left(self, conn_id: int) -> None:
        """Not written again."""
        if self.index is None:
            self.index = {c.id: i for i, c in enumerate(self.clients) if c is not None}
        i = self.index.pop(conn_id, None)
        if i is not None:
            self.clients[i] = None
            self.holes += 1

    def step(self, chunk: int, write: WriteRun) -> tuple[int, int, bool]:
        """Write the next ``chunk`` members what they lack: (writes, messages
        delivered, whether the pass is over)."""
        head, base, clients = self.head, self.base, self.clients
        starts, lasts = self.todo.starts, self.todo.lasts
        pos = self.next
        end = min(pos + chunk, len(clients))
        writes = delivered = 0
        k = self.run
        while pos < end:
            while k + 1 < len(starts) and starts[k + 1] <= pos:
                k += 1
            stop = min(starts[k + 1], end) if k + 1 < len(starts) else end
            last = lasts[k]
            if last < head:
                i = max(last + 1, base) - base
                wires = [w for frame in self.frames[i:] for w in frame]
                msgs = sum(self.frags[i:])
                took = write(clients[pos:stop], wires, msgs)
                writes += took * len(wires)
                delivered += took * msgs
            pos = stop
        self.done.mark(self.next, head)  # written, skipped for backlog, or closed: done
        self.run, self.next = k, end
        return writes, delivered, end >= len(clients)

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

    def new_pass(self) -> bool:
        """Start the next pass if a frame came during the last one; False when
        every member has had everything (the ring is done)."""
        if self.head <= self.pass_head:
            return False
        self.todo, self.done = self.done, _Runs()
        if self.holes * 8 > len(self.clients):
            self._compact()
        self.run, self.next, self.pass_head = 0, 0, self.head
        return True

    def _compact(self) -> None:
        """Close the holes, keeping each member's run (between passes)."""
        starts, lasts = self.todo.starts, self.todo.lasts
        kept: list[Client | None] = []
        runs = _Runs()
        k = 0
        for i, client in enumerate(self.clients):
            while k + 1 < len(starts) and starts[k + 1] <= i:
                k += 1
            if client is not None:
                runs.mark(len(kept), lasts[k])
                kept.append(client)
        self.clients, self.todo, self.holes, self.index = kept, runs, 0, None


def first_pass(clients: list[Client], wires: list[bytes], frags: int) -> RoomRing:
    """A ring whose first pass writes its first frame."""
    ring = RoomRing(clients)
    ring.add(wires, frags, time.monotonic())
    ring.pass_head = ring.head
    return ring
