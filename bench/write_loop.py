"""The fan-out's member loop alone: what a write costs the node's process, with
the loop in Python and in C (``gateway/_fanout.c``), in the same run.

Run from the repository root (no servers needed)::

    .venv/bin/python -m bench.write_loop                  # 5,000 sockets, 60 passes
    .venv/bin/python -m bench.write_loop --sockets 10000 --passes 40

One process, on uvloop (the node's event loop): a TCP server on 127.0.0.1
accepts ``--sockets`` connections from plain sockets of the same process,
which never read while a pass runs (so no reader competes for the CPU, and
the kernel's receive work is the same for both loops); each accepted
transport becomes a peer as the node keeps one (``proto.state``, the
transport, its socket's ``fd``, ``stuck_since``). A pass is what a big room's
cursor does: ``SocketWriter.write_each`` on the members 25 at a time, one
frame of ``--frame`` bytes each. The loops alternate, ``--rounds`` times
each, every round ``--passes`` passes; between rounds the sockets are read
empty. Reported per write: wall time, and the process's user and system CPU
(``getrusage``). Output: a markdown table on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import socket
import statistics
import time
from dataclasses import dataclass
from typing import Any

import uvloop
from websockets.protocol import State

from gateway import wire
from gateway.wire import SocketWriter, socket_fd, ws_text_frame

CHUNK = 25  # members per loop turn, as a big room's ring (IM_ROOM_WRITE_CHUNK)


class _Count:
    def inc(self, amount: float = 1) -> None:
        pass


class _Proto:
    """websockets' protocol as the loop reads it: ``state``, a property."""

    def __init__(self) -> None:
        self._state = State.OPEN

    @property
    def state(self) -> State:
        return self._state


@dataclass(eq=False, slots=True)
class _Peer:
    id: int
    user: str
    ws: Any
    proto: Any
    transport: Any
    fd: int
    stuck_since: float = 0.0


class _Accept(asyncio.Protocol):
    def __init__(self, accepted: list[asyncio.Transport], n: int, all_in: asyncio.Event) -> None:
        self.accepted, self.n, self.all_in = accepted, n, all_in

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.accepted.append(transport)  # type: ignore[arg-type]
        if len(self.accepted) >= self.n:
            self.all_in.set()


async def _open(n: int) -> tuple[list[_Peer], list[socket.socket], Any]:
    accepted: list[asyncio.Transport] = []
    all_in = asyncio.Event()
    server = await asyncio.get_running_loop().create_server(
        lambda: _Accept(accepted, n, all_in), "127.0.0.1", 0, backlog=4096)
    port = server.sockets[0].getsockname()[1]
    clients = []
    for i in range(n):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        clients.append(sock)
        if i % 500 == 499:
            await asyncio.sleep(0.01)
    async with asyncio.timeout(60):
        await all_in.wait()
    peers = [_Peer(i, "u", None, _Proto(), t, socket_fd(t)) for i, t in enumerate(accepted)]
    return peers, clients, server


def _drain(clients: list[socket.socket]) -> None:
    for sock in clients:
        try:
            while sock.recv(1 << 20):
                pass
        except BlockingIOError:
            pass


async def _round(writer: SocketWriter, peers: list[_Peer], frame: bytes,
                 passes: int) -> tuple[float, float, float]:
    wires = [frame]
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(passes):
        for k in range(0, len(peers), CHUNK):
            writer.write_each(peers[k:k + CHUNK], wires, 1 << 30)
            await asyncio.sleep(0)  # a loop turn, as the ring takes between chunks
    after, ended = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    writes = len(peers) * passes
    return ((ended - started) / writes * 1e6, (after.ru_utime - before.ru_utime) / writes * 1e6,
            (after.ru_stime - before.ru_stime) / writes * 1e6)


async def main(args: argparse.Namespace) -> None:
    if wire.FANOUT != "c":
        raise SystemExit("the C loop is not built here: pip install -e . where a C compiler is")
    peers, clients, server = await _open(args.sockets)
    frame = ws_text_frame(b"x" * args.payload)
    loops = {"python": SocketWriter(_Count(), _Count(), in_c=False),
             "c": SocketWriter(_Count(), _Count())}
    got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in loops}
    try:
        for _ in range(args.rounds):
            for name, writer in loops.items():
                got[name].append(await _round(writer, peers, frame, args.passes))
                _drain(clients)
    finally:
        for sock in clients:
            sock.close()
        server.close()
    print(f"{args.sockets:,} sockets, {args.passes} passes a round, {args.rounds} rounds a loop, "
          f"{len(frame)}-byte frames; per write, median of the rounds (min-max):\n")
    print("| loop | wall (us) | user CPU (us) | system CPU (us) |")
    print("|---|---|---|---|")
    for name, rows in got.items():
        cells = []
        for col in range(3):
            vals = [r[col] for r in rows]
            cells.append(f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sockets", type=int, default=5000)
    p.add_argument("--passes", type=int, default=60)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--payload", type=int, default=120, help="bytes of each frame's payload")
    args = p.parse_args()
    uvloop.run(main(args))


if __name__ == "__main__":
    cli()
