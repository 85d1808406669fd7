"""Private local clusters for failure tests, driven by the project's scripts
(``scripts/redis_cluster.sh``): own ports, own data dir, stopped by the test."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

__all__ = ["LocalRedisCluster"]

ROOT = Path(__file__).resolve().parent.parent


class LocalRedisCluster:
    """3 masters on ``port_base + 1..3`` (never the shared 6379)."""

    def __init__(self, port_base: int) -> None:
        self.port_base = port_base
        self.dir = tempfile.mkdtemp(prefix="imgate-rc-")
        self.ports = [port_base + i for i in (1, 2, 3)]
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

    async def start(self) -> LocalRedisCluster:
        await self._script("start")
        return self

    async def stop(self) -> None:
        await self._script("stop")

    async def stop_node(self, n: int) -> None:
        """Kill master ``n`` (1..3): its slots have no other copy (no replicas)."""
        await self._script("stop-node", str(n))

    async def start_node(self, n: int) -> None:
        """Bring master ``n`` back and wait for ``cluster_state:ok``."""
        await self._script("start-node", str(n))

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
