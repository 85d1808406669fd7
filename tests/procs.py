"""Gateway nodes as real processes (``python -m gateway serve``), for tests that
kill them with SIGKILL or drain them with SIGTERM."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from typing import Any

_READY = re.compile(rb"gateway: node (\S+) ws://[^:]+:(\d+)/ws http://[^:]+:(\d+)")


class NodeProcess:
    """One node process; ``ws_port``/``http_port`` are known once it is ready."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.proc: asyncio.subprocess.Process | None = None
        self.name = ""
        self.ws_port = 0
        self.http_port = 0
        self.output: list[bytes] = []

    async def start(self, timeout: float = 30) -> NodeProcess:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", env=self.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while True:
                line = await self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(b"node exited: " + b"".join(self.output[-20:]))
                self.output.append(line)
                if m := _READY.search(line):
                    self.name = m.group(1).decode()
                    self.ws_port, self.http_port = int(m.group(2)), int(m.group(3))
                    break
        self._drain_task = asyncio.create_task(self._collect())
        return self

    async def _collect(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output.append(line)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    def term(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


def node_env(**settings: Any) -> dict[str, str]:
    env = dict(os.environ)
    env.update({f"IM_{k.upper()}": str(v) for k, v in settings.items()})
    return env
