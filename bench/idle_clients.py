"""Subprocesses of ``bench.conn_memory``: idle WebSocket clients, and the bare
``websockets`` server it compares the node with.

    python -m bench.idle_clients clients --url ws://127.0.0.1:PORT/ws --prefix P
    python -m bench.idle_clients bare-server

``clients`` reads the token secret from ``CONN_MEM_SECRET`` and commands from
stdin, one per line, answering each with one JSON line on stdout:

- ``open K``: open K more connections (``--concurrency`` handshakes at once,
  each tried up to 3 times); answers how many are open and what failed.
- ``ping S``: ping S of the open connections, spread evenly; answers how many
  ponged within 10 s (proof the server still serves them).
- ``state``: how many connections are still in the OPEN state.
- ``close``: abort every connection and exit.

The clients send no keepalive pings and answer the server's pings (websockets
does that by itself), so a connection stays idle but alive.

``bare-server`` prints ``bare ws://127.0.0.1:PORT/ws`` once it listens and serves
until SIGTERM: websockets' ``serve`` with compression off and its default
keepalive (ping every 20 s); the handler only awaits ``wait_closed()``. It runs
on uvloop when installed, as the node does, so the two differ only in what
the node adds per connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import State

from bench.common import REPO, run_loop
from gateway.auth import issue_token

SECRET_ENV = "CONN_MEM_SECRET"
PYTHON = str(REPO / ".venv" / "bin" / "python") \
    if (REPO / ".venv" / "bin" / "python").exists() else sys.executable


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit; returns the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def reply(obj: dict[str, Any]) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
    sys.stdout.flush()


class Clients:
    """The connections of one client process."""

    def __init__(self, url: str, prefix: str, secret: str, concurrency: int) -> None:
        self.url = url
        self.prefix = prefix
        self.secret = secret
        self.slots = asyncio.Semaphore(concurrency)
        self.conns: list[ClientConnection] = []
        self.next_index = 0

    async def _dial(self, index: int, errors: Counter[str]) -> ClientConnection | None:
        token = issue_token(self.secret, f"{self.prefix}-{index}", 3600)
        async with self.slots:
            for attempt in range(3):
                try:
                    return await connect(f"{self.url}?token={token}", compression=None,
                                         proxy=None, ping_interval=None, open_timeout=30,
                                         close_timeout=2)
                except Exception as exc:  # noqa: BLE001 - counted; the run reports failures
                    errors[type(exc).__name__] += 1
                    if attempt < 2:
                        await asyncio.sleep(0.5 * (attempt + 1))
        return None

    async def open(self, count: int) -> dict[str, Any]:
        started = time.perf_counter()
        first, self.next_index = self.next_index, self.next_index + count
        errors: Counter[str] = Counter()
        got = await asyncio.gather(*(self._dial(i, errors) for i in range(first, first + count)))
        new = [ws for ws in got if ws is not None]
        self.conns += new
        return {"open": len(self.conns), "opened": len(new), "failed": count - len(new),
                "attempt_errors": dict(errors),
                "seconds": round(time.perf_counter() - started, 2)}

    async def ping(self, sample: int) -> dict[str, Any]:
        live = [ws for ws in self.conns if ws.state is State.OPEN]
        step = max(1, len(live) // max(1, sample))
        chosen = live[::step][:sample]

        async def one(ws: ClientConnection) -> float | None:
            started = time.perf_counter()
            try:
                waiter = await ws.ping()
                await asyncio.wait_for(waiter, 10)
            except Exception:  # noqa: BLE001 - a missing pong is the finding
                return None
            return time.perf_counter() - started

        times = sorted(t for t in await asyncio.gather(*(one(ws) for ws in chosen))
                       if t is not None)
        return {"sampled": len(chosen), "ponged": len(times),
                "p50_ms": round(times[len(times) // 2] * 1000, 2) if times else None,
                "max_ms": round(times[-1] * 1000, 2) if times else None}

    def state(self) -> dict[str, Any]:
        states = Counter(ws.state.name for ws in self.conns)
        return {"open": states.get("OPEN", 0), "states": dict(states)}

    def close(self) -> None:
        for ws in self.conns:
            with contextlib.suppress(Exception):
                ws.transport.abort()


async def clients_main(args: argparse.Namespace) -> int:
    fd_limit = raise_fd_limit()
    clients = Clients(args.url, args.prefix, os.environ[SECRET_ENV], args.concurrency)
    reply({"ready": True, "pid": os.getpid(), "fd_limit": fd_limit})
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        cmd, _, arg = line.strip().partition(" ")
        if cmd == "open":
            reply(await clients.open(int(arg)))
        elif cmd == "ping":
            reply(await clients.ping(int(arg)))
        elif cmd == "state":
            reply(clients.state())
        elif cmd in ("close", ""):  # "" is EOF: the parent went away
            clients.close()
            if cmd:
                reply({"closed": len(clients.conns)})
            return 0
        else:
            reply({"error": f"unknown command {line.strip()!r}"})


async def bare_server_main(args: argparse.Namespace) -> int:
    raise_fd_limit()

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async def orphaned() -> None:  # the parent died without stopping us
        parent = os.getppid()
        while True:
            await asyncio.sleep(1)
            if os.getppid() != parent:
                stop.set()
                return

    watch = asyncio.create_task(orphaned())
    async with serve(handler, "127.0.0.1", args.port, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        print(f"bare ws://127.0.0.1:{port}/ws", flush=True)
        await stop.wait()
    watch.cancel()
    return 0


class BareServer:
    """``bench.idle_clients bare-server`` in a subprocess."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.ws_url = ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                PYTHON, "-m", "bench.idle_clients", "bare-server", cwd=REPO,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=log)
        assert self.proc.stdout is not None
        line = (await asyncio.wait_for(self.proc.stdout.readline(), 30)).decode()
        if not line.startswith("bare "):
            raise RuntimeError(f"bare server did not start; see {self.log_path}")
        self.ws_url = line.split()[1]

    async def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 15)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        return self.proc.returncode


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_clients")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("clients", help="idle client connections, driven from stdin")
    c.add_argument("--url", required=True)
    c.add_argument("--prefix", required=True, help="user ids are PREFIX-<index>")
    c.add_argument("--concurrency", type=int, default=100, help="handshakes at once")
    b = sub.add_parser("bare-server", help="websockets serve(), handler awaits wait_closed()")
    b.add_argument("--port", type=int, default=0)
    args = p.parse_args(argv)
    main_coro = clients_main(args) if args.cmd == "clients" else bare_server_main(args)
    return int(run_loop(main_coro))


if __name__ == "__main__":
    sys.exit(main())
