"""Private local clusters for failure tests, driven by the project's scripts
(``scripts/redis_cluster.sh``, ``scripts/rabbitmq_cluster.sh``): own ports
(free ones picked here unless given), own data dir, stopped by the test."""

from __future__ import annotations

import asyncio
import os
import subprocess
import tempfile
from pathlib import Path

from testkit.poll import until
from testkit.servers import free_port_base

__all__ = ["LocalRabbit", "LocalRedisCluster", "free_rabbit_port_base",
           "free_redis_cluster_port_base"]

ROOT = Path(__file__).resolve().parent.parent


def free_redis_cluster_port_base() -> int:
    """A REDIS_CLUSTER_PORT_BASE whose 3 ports (base+1..3) and their cluster bus
    ports (+10000) are free: from 14000-15999, so 14001-16002 and 24001-26002,
    below the kernel's ephemeral range and clear of the RabbitMQ bases below."""
    return free_port_base([1, 2, 3, 10_001, 10_002, 10_003], 14_000, 16_000)


def free_rabbit_port_base() -> int:
    """An RMQ_CLUSTER_PORT_BASE whose AMQP ports (base+1..3), Erlang distribution
    ports (AMQP + 20000) and CLI distribution ports (base+40000..+40010) are
    free: from 10000-12699 (the script allows at most 25525)."""
    return free_port_base([1, 2, 3, 20_001, 20_002, 20_003, *range(40_000, 40_011)],
                          10_000, 12_700)


class LocalRedisCluster:
    """3 masters on ``port_base + 1..3`` (default: a free base; never the shared 6379)."""

    def __init__(self, port_base: int | None = None) -> None:
        self.port_base = free_redis_cluster_port_base() if port_base is None else port_base
        self.dir = tempfile.mkdtemp(prefix="imgate-rc-")
        self.ports = [self.port_base + i for i in (1, 2, 3)]
        self.seeds = ",".join(f"redis://127.0.0.1:{p}" for p in self.ports)

    async def _script(self, *args: str) -> str:
        env = {**os.environ, "REDIS_CLUSTER_PORT_BASE": str(self.port_base)}
        proc = await asyncio.create_subprocess_exec(
            "bash", str(ROOT / "scripts" / "redis_cluster.sh"), *args, self.dir, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        if proc.returncode != 0:
            raise RuntimeError(f"redis_cluster.sh {' '.join(args)}: {out.decode()[-2000:]}")
        return out.decode()

    async def start(self, timeout: float = 30) -> LocalRedisCluster:
        """Start; return once every master says ``cluster_state:ok`` (the script
        waits for the first one only, and a client's first command may go to
        another, which answers CLUSTERDOWN until it agrees)."""
        await self._script("start")
        await self.wait_ok(timeout)
        return self

    async def wait_ok(self, timeout: float = 30) -> None:
        """Until all 3 masters report ``cluster_state:ok``; TimeoutError after ``timeout``."""
        async def all_ok() -> bool:
            return [await self.state(n) for n in (1, 2, 3)] == ["ok"] * 3

        if not await until(all_ok, timeout=timeout, every=0.1):
            raise TimeoutError(f"redis cluster {self.seeds}: not ok on every master "
                               f"after {timeout}s")

    async def stop(self) -> None:
        await self._script("stop")

    async def stop_node(self, n: int) -> None:
        """Kill master ``n`` (1..3): its slots have no other copy (no replicas)."""
        await self._script("stop-node", str(n))

    async def start_node(self, n: int) -> None:
        """Bring master ``n`` back and wait for ``cluster_state:ok`` on every master."""
        await self._script("start-node", str(n))
        await self.wait_ok()

    @staticmethod
    def owns(n: int, slot: int) -> bool:
        """Whether master ``n`` holds ``slot`` as ``redis-cli --cluster create``
        splits them among 3 masters (0-5460, 5461-10922, 10923-16383)."""
        return (0, 5461, 10923, 16384)[n - 1] <= slot < (0, 5461, 10923, 16384)[n]

    async def state(self, n: int) -> str:
        """``cluster_state`` as master ``n`` reports it ("" if it does not answer)."""
        proc = await asyncio.create_subprocess_exec(
            "redis-cli", "-p", str(self.ports[n - 1]), "cluster", "info",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        out, _ = await proc.communicate()
        for line in out.decode().splitlines():
            if line.startswith("cluster_state:"):
                return line.split(":", 1)[1].strip()
        return ""


class LocalRabbit:
    """A private RabbitMQ node or cluster (``scripts/rabbitmq_cluster.sh``, its own
    directory and Erlang cookie; never the shared broker on 5672). ``env``:
    the script's settings (``RMQ_CLUSTER_SIZE``, ``RMQ_CLUSTER_PORT_BASE``;
    without a port base, a free one is picked: ``port_base``).
    ``urls[N-1]`` is node N's AMQP URL once ``start`` returned."""

    SCRIPT = ROOT / "scripts" / "rabbitmq_cluster.sh"

    def __init__(self, path: Path, env: dict[str, str] | None = None) -> None:
        self.path = path
        self.env = dict(env or {})
        self.env.setdefault("RMQ_CLUSTER_PORT_BASE", str(free_rabbit_port_base()))
        self.port_base = int(self.env["RMQ_CLUSTER_PORT_BASE"])
        self.urls: list[str] = []

    def _run(self, *args: str, timeout: float) -> tuple[int, str]:
        done = subprocess.run(["bash", str(self.SCRIPT), *args, str(self.path)],
                              capture_output=True, text=True, timeout=timeout, check=False,
                              env={**os.environ, **self.env, "HARD": "0"})
        return done.returncode, done.stdout + done.stderr

    def start(self, timeout: float = 240) -> LocalRabbit:
        code, out = self._run("start", timeout=timeout)
        if code != 0:
            raise RuntimeError(f"RabbitMQ did not start:\n{out}")
        code, out = self._run("urls", timeout=30)
        self.urls = out.strip().split(",") if code == 0 else []
        return self

    def stop(self, timeout: float = 240) -> None:
        self._run("stop", timeout=timeout)

    async def script(self, *args: str, hard: bool = False, timeout: float = 90) -> str:
        """``stop-node N`` (``hard``: SIGKILL), ``start-node N``... on the running one."""
        proc = await asyncio.create_subprocess_exec(
            "bash", str(self.SCRIPT), *args, str(self.path), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.env, "HARD": "1" if hard else "0"})
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"rabbitmq_cluster.sh {' '.join(args)}:\n{out.decode()}")
        return out.decode()

    def rotated(self, first: int) -> str:
        """IM_AMQP_URL starting at node ``first`` (1-based), then round the list."""
        i = first - 1
        return ",".join(self.urls[i:] + self.urls[:i])
