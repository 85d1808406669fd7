"""``python -m gateway serve --workers N``: one supervisor and N worker
processes on one host, sharing its WebSocket and HTTP ports.

One node process uses one core (one event loop). The supervisor binds the
two ports with ``SO_REUSEPORT`` (without listening: it holds the numbers,
and takes no connection), then starts N ``python -m gateway serve``
processes that listen on the same ports with ``SO_REUSEPORT``
(``IM_REUSE_PORT=1``): the kernel spreads new connections over the
listening workers. Each worker is a whole node: its own leased node number,
its own name, its own broker queue; a room or group whose members are on
several workers gets one envelope per worker, as across hosts. Each has its
own metrics listener, ``IM_METRICS_PORT`` + its index (0: any free port
each; -1: none): Prometheus scrapes each (docs/deploy.md).

A worker that exits unexpectedly is started again after a backoff (1 s,
doubling to 30 s; back to 1 s once it stayed up a minute): its clients
reconnect (to any worker) and sync. SIGTERM or SIGINT drains every worker
(each tells its clients to reconnect and finishes what it stored) and the
supervisor exits once they have. A supervisor that dies without draining
them (SIGKILL, the OOM killer) does not leave them serving on their own: the
kernel sends each worker SIGTERM as its parent goes (Linux's
``PR_SET_PDEATHSIG``), and they drain. A worker's output goes to the
supervisor's, each line prefixed with the worker's index.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

__all__ = ["supervise"]

log = logging.getLogger("gateway.workers")
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_S = 60.0  # a worker up this long starts its next backoff from the first step
READY = b"gateway: node "


def hold_port(host: str, port: int, setting: str) -> socket.socket:
    """A socket bound to ``host:port`` with ``SO_REUSEPORT`` that does not
    listen: it keeps the port number for the workers (0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({setting}): {exc.strerror}; set "
                      f"{setting} to a free port (0: any free one)") from None
    return sock


@dataclass
class Worker:
    index: int
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    started: float = 0.0
    backoff: float = BACKOFF_FIRST_S
    restarts: int = 0
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    name: str = ""


class Supervisor:
    def __init__(self, n: int, env: Mapping[str, str], host: str, ws_port: int,
                 http_port: int, metrics_host: str, metrics_port: int) -> None:
        self.host, self.ws_port, self.http_port = host, ws_port, http_port
        self.stopping = asyncio.Event()
        self.workers = [Worker(i, {
            **env, "IM_WORKERS": "1", "IM_REUSE_PORT": "1", "IM_WS_PORT": str(ws_port),
            "IM_HTTP_PORT": str(http_port), "IM_METRICS_HOST": metrics_host,
            "IM_METRICS_PORT": str(metrics_port + i if metrics_port > 0 else metrics_port),
        }) for i in range(n)]

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        keepers = [asyncio.create_task(self._keep(w)) for w in self.workers]
        async def all_ready() -> None:
            await asyncio.gather(*(w.ready.wait() for w in self.workers))

        async def stopped() -> None:
            await self.stopping.wait()

        ready, stop = asyncio.create_task(all_ready()), asyncio.create_task(stopped())
        await asyncio.wait([ready, stop], return_when=asyncio.FIRST_COMPLETED)
        if not self.stopping.is_set():
            # testkit/nodes.py parses this line's start (as a single node's).
            print(f"gateway: node workers-{os.getpid()} ws://{self.host}:{self.ws_port}/ws "
                  f"http://{self.host}:{self.http_port} ({len(self.workers)} workers: "
                  f"{', '.join(w.name for w in self.workers)})", flush=True)
        await self.stopping.wait()
        log.info("draining %d workers", len(self.workers))
        for w in self.workers:
            _signal(w, signal.SIGTERM)
        await asyncio.gather(*keepers)
        ready.cancel()
        stop.cancel()
        log.info("stopped")
        return 0

    async def _keep(self, w: Worker) -> None:
        """Run worker ``w`` until the supervisor stops, starting it again when
        it exits on its own."""
        while not self.stopping.is_set():
            w.started = time.monotonic()
            w.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "serve", env=w.env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, preexec_fn=_with_parent(os.getpid()))
            log.info("worker %d started (pid %d)", w.index, w.proc.pid)
            await self._relay(w)
            code = await w.proc.wait()
            if self.stopping.is_set():
                log.info("worker %d stopped (exit %d)", w.index, code)
                return
            if time.monotonic() - w.started >= STABLE_S:
                w.backoff = BACKOFF_FIRST_S
            w.restarts += 1
            log.warning("worker %d exited (code %d); starting it again in %.0f s", w.index,
                        code, w.backoff)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(w.backoff):
                    await self.stopping.wait()
            w.backoff = min(BACKOFF_MAX_S, w.backoff * 2)

    async def _relay(self, w: Worker) -> None:
        """The worker's output to ours, prefixed; its ready line marks it ready."""
        assert w.proc is not None and w.proc.stdout is not None
        out = sys.stdout.buffer
        async for line in w.proc.stdout:
            if line.startswith(READY) and not w.ready.is_set():
                w.name = line[len(READY):].split(b" ", 1)[0].decode(errors="replace")
                w.ready.set()
            out.write(b"[worker %d] " % w.index + line.replace(READY, b"gateway: worker "))
            out.flush()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _with_parent(parent: int) -> Callable[[], None] | None:
    """Run in each worker between fork and exec: SIGTERM when the supervisor
    dies (a worker whose parent is already gone exits at once). None where
    the C library has no ``prctl`` (not Linux)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return arm


def _signal(w: Worker, sig: int) -> None:
    if w.proc is not None and w.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            w.proc.send_signal(sig)


def supervise(n: int, env: Mapping[str, str], host: str, ws_port: int, http_port: int,
              metrics_host: str, metrics_port: int) -> int:
    """Hold the ports, run the workers until SIGTERM / SIGINT; the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        held = [hold_port(host, ws_port, "IM_WS_PORT"), hold_port(host, http_port, "IM_HTTP_PORT")]
    except OSError as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 1
    try:
        ws, http = (s.getsockname()[1] for s in held)
        return asyncio.run(Supervisor(n, env, host, ws, http, metrics_host, metrics_port).run())
    finally:
        for s in held:
            s.close()
