"""The client processes of ``bench.conn_memory``: idle WebSocket clients
(``testkit.lean``: no task per socket), started as

    python -m bench.idle_clients --url ws://127.0.0.1:PORT/ws --prefix P

No protocol is spoken beyond the handshake (its token: the SDK core's
``with_token``); each socket is a bare ``testkit.lean`` one, not an SDK
``Client`` (that holds a task and state per connection: this measures the
node's memory per idle connection, with as little client as possible).
They read the token secret from ``CONN_MEM_SECRET`` and commands from
stdin, one per line, answering each with one JSON line on stdout:

- ``open K``: open K more connections (``--concurrency`` handshakes at once,
  each tried up to 3 times); answers how many are open and what failed.
- ``ping S``: ping S of the open connections, spread evenly; answers how many
  ponged within 10 s (proof the server still serves them).
- ``state``: how many connections are still in the OPEN state.
- ``close``: abort every connection and exit.

The clients send no keepalive pings and answer the server's pings, so a
connection stays idle but alive. The bare server
they are compared against is ``bench.room_baselines idle``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from imgate_client.core import with_token

from bench.common import emit, raise_fd_limit, run_loop, stdin_lines
from testkit.lean import LeanSocket, open_lean
from testkit.tokens import issue_token

SECRET_ENV = "CONN_MEM_SECRET"


class Clients:
    """The connections of one client process."""

    def __init__(self, url: str, prefix: str, secret: str, concurrency: int) -> None:
        self.url = urlsplit(url)
        self.prefix = prefix
        self.secret = secret
        self.slots = asyncio.Semaphore(concurrency)
        self.conns: list[LeanSocket] = []
        self.next_index = 0

    async def _dial(self, index: int, errors: Counter[str]) -> LeanSocket | None:
        u, token = self.url, issue_token(self.secret, f"{self.prefix}-{index}")
        async with self.slots:
            try:
                return await open_lean(lambda: LeanSocket(
                    u.hostname or "127.0.0.1", u.port or 80, with_token(u.path, token)),
                    tries=3, on_retry=lambda: errors.update(["retried"]))
            except ConnectionError as exc:  # counted; the run reports failures
                errors[type(exc.__cause__ or exc).__name__] += 1
        return None

    async def open(self, count: int) -> dict[str, Any]:
        started = time.perf_counter()
        first, self.next_index = self.next_index, self.next_index + count
        errors: Counter[str] = Counter()
        got = await asyncio.gather(*(self._dial(i, errors) for i in range(first, first + count)))
        new = [c for c in got if c is not None]
        self.conns += new
        return {"open": len(self.conns), "opened": len(new), "failed": count - len(new),
                "attempt_errors": dict(errors),
                "seconds": round(time.perf_counter() - started, 2)}

    async def ping(self, sample: int) -> dict[str, Any]:
        live = [c for c in self.conns if not c.closed]
        step = max(1, len(live) // max(1, sample))
        chosen = live[::step][:sample]

        async def one(c: LeanSocket) -> float | None:
            started = time.perf_counter()
            try:
                await asyncio.wait_for(c.ping(), 10)
            except Exception:  # noqa: BLE001 - a missing pong is the finding
                return None
            return time.perf_counter() - started

        times = sorted(t for t in await asyncio.gather(*(one(c) for c in chosen))
                       if t is not None)
        return {"sampled": len(chosen), "ponged": len(times),
                "p50_ms": round(times[len(times) // 2] * 1000, 2) if times else None,
                "max_ms": round(times[-1] * 1000, 2) if times else None}

    def state(self) -> dict[str, Any]:
        closed = sum(c.closed for c in self.conns)
        return {"open": len(self.conns) - closed, "states": {"closed": closed}}

    def close(self) -> None:
        for c in self.conns:
            c.abort()


async def clients_main(args: argparse.Namespace) -> int:
    fd_limit = raise_fd_limit()
    clients = Clients(args.url, args.prefix, os.environ[SECRET_ENV], args.concurrency)
    emit({"ready": True, "pid": os.getpid(), "fd_limit": fd_limit})
    async for line in stdin_lines():
        cmd, _, arg = line.decode().strip().partition(" ")
        if cmd == "open":
            emit(await clients.open(int(arg)))
        elif cmd == "ping":
            emit(await clients.ping(int(arg)))
        elif cmd == "state":
            emit(clients.state())
        elif cmd == "close":
            clients.close()
            emit({"closed": len(clients.conns)})
            return 0
        else:
            emit({"error": f"unknown command {line.strip()!r}"})
    clients.close()  # EOF: the parent went away
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_clients",
                                description="idle client connections, driven from stdin")
    p.add_argument("--url", required=True)
    p.add_argument("--prefix", required=True, help="user ids are PREFIX-<index>")
    p.add_argument("--concurrency", type=int, default=100, help="handshakes at once")
    return int(run_loop(clients_main(p.parse_args(argv))))


if __name__ == "__main__":
    sys.exit(main())
