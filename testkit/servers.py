"""Private, killable servers for failure tests: a real redis-server and a real
SecantusDB (MongoDB-compatible) on free ports, owned by one test; and the free
ports themselves (one, or a block from one base for the cluster scripts)."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["PrivateServer", "free_port", "free_port_base", "port_free", "wait_port"]


def free_port() -> int:
    """A TCP port of 127.0.0.1 nobody uses (at the time of asking), below the
    kernel's range of ephemeral ports: a server started on it later, or started
    again after a kill, cannot find it taken as the local port of some outgoing
    connection, as a port the kernel hands out for port 0 can be on a busy
    machine (a fault-schedule node once could not restart for it). Picked at
    random, so runs side by side rarely try the same one."""
    low = _ephemeral_low()
    pick = random.SystemRandom()
    for _ in range(500):
        port = pick.randrange(max(1024, low - 20_000), low)
        if port_free(port):
            return port
    with socket.socket() as s:  # (the range below is full: any free one)
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where unknown)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Whether ``port`` of 127.0.0.1 can be bound (nobody listens on it, on
    127.0.0.1 or on every address, at the time of asking)."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_base(offsets: Iterable[int], low: int, high: int, tries: int = 500) -> int:
    """A base ``B`` in ``[low, high)`` whose ports ``B + o`` (``o`` in ``offsets``)
    of 127.0.0.1 are all free at the time of asking, for servers that take a
    block of ports from one base (``scripts/redis_cluster.sh``'s
    REDIS_CLUSTER_PORT_BASE, ``scripts/rabbitmq_cluster.sh``'s
    RMQ_CLUSTER_PORT_BASE). Picked at random, so two runs side by side rarely
    try the same one. RuntimeError if none was found in ``tries`` picks."""
    wanted = sorted(set(offsets))
    pick = random.SystemRandom()
    for _ in range(tries):
        base = pick.randrange(low, high)
        if all(port_free(base + o) for o in wanted):
            return base
    raise RuntimeError(f"no free port base in [{low}, {high}) for offsets {wanted}")


async def wait_port(port: int, timeout: float = 30, host: str = "127.0.0.1") -> None:
    """Until ``host:port`` accepts a TCP connection; TimeoutError after ``timeout``."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            _, w = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
            w.close()
            return
        except (OSError, TimeoutError):
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"nothing listening on {host}:{port}") from None
            await asyncio.sleep(0.1)


class PrivateServer:
    """A server process a test starts, kills and starts again on the same port
    (``kind``: "redis" or "mongo")."""

    def __init__(self, kind: str) -> None:
        if kind not in ("redis", "mongo"):
            raise ValueError(f"unknown server kind {kind!r}")
        self.kind = kind
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"im-{kind}-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        if self.kind == "redis":
            return f"redis://127.0.0.1:{self.port}/0"
        return f"mongodb://127.0.0.1:{self.port}"

    def _argv(self) -> list[str]:
        if self.kind == "redis":
            return ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        exe = Path(sys.executable).with_name("secantusd-py")
        return [str(exe), "--port", str(self.port), "--storage-path", str(self.dir / "data")]

    async def start(self, timeout: float = 30) -> PrivateServer:
        with open(self.dir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(self._argv(), stdout=log, stderr=log,
                                         stdin=subprocess.DEVNULL, env=os.environ.copy())
        await wait_port(self.port, timeout)
        return self

    def pause(self) -> None:
        """SIGSTOP: the port stays open, nothing answers (data kept)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    async def kill(self) -> None:
        """SIGKILL: what a crash looks like to its clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            await asyncio.to_thread(self.proc.wait, 10)
        self.proc = None

    async def stop_and_clean(self) -> None:
        await self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
