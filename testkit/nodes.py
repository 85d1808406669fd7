"""Gateway nodes as real processes (``python -m gateway serve``), for tests that
kill them with SIGKILL or drain them with SIGTERM, and for the benchmarks.

A node runs this repository's code, or that of another checkout (``tree``: a
``git worktree`` of another commit, say): its process then starts in that
directory with it first on ``PYTHONPATH``, so ``gateway``, ``router``, ``store``
and ``core`` come from there, while the caller keeps running from here."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

__all__ = ["NodeProcess", "node_env"]

REPO = Path(__file__).resolve().parent.parent
_READY = re.compile(rb"gateway: node (\S+) ws://([^:/]+):(\d+)/ws http://[^:/]+:(\d+)")
_KEEP_LINES = 2000  # output kept in memory when there is no log file


def node_env(**settings: Any) -> dict[str, str]:
    """``IM_*`` variables for the given settings: ``node_env(ws_port=0)`` ->
    ``{"IM_WS_PORT": "0"}``."""
    return {f"IM_{k.upper()}": str(v) for k, v in settings.items()}


class NodeProcess:
    """One node process. ``env`` (``IM_*`` variables) goes over this process's
    environment. Its log goes to ``log_path`` if given (nothing read here, so a
    busy node costs this process no CPU), else into ``output`` (the last lines).
    ``tree``: the checkout whose code it runs (default: this one).
    ``name``, ports and URLs are known once ``start`` returns."""

    def __init__(self, env: dict[str, str], log_path: Path | None = None,
                 tree: Path | str | None = None) -> None:
        self.env = env
        self.log_path = log_path
        self.tree = Path(tree).resolve() if tree else REPO
        self.proc: asyncio.subprocess.Process | None = None
        self.name = ""
        self.host = "127.0.0.1"
        self.ws_port = 0
        self.http_port = 0
        self.output: collections.deque[bytes] = collections.deque(maxlen=_KEEP_LINES)
        self._reader: asyncio.Task[None] | None = None

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.ws_port}/ws"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def start(self, timeout: float = 30) -> NodeProcess:
        """Start and wait for the ready line; RuntimeError (with the log's tail)
        if the node exits first."""
        err: Any = asyncio.subprocess.STDOUT
        log = open(self.log_path, "ab") if self.log_path else None
        env = {**os.environ, **self.env}
        if self.tree != REPO:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(self.tree), *filter(None, [os.environ.get("PYTHONPATH")])])
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "serve", cwd=self.tree, env=env,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=log or err)
        finally:
            if log is not None:
                log.close()
        try:
            async with asyncio.timeout(timeout):
                await self._wait_ready()
        except BaseException:
            await self.stop(grace_s=0)
            raise
        self._reader = asyncio.create_task(self._collect())
        return self

    async def _wait_ready(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"node exited before it was ready:\n{self.log_tail()}")
            self.output.append(line)
            if m := _READY.search(line):
                self.name, self.host = m.group(1).decode(), m.group(2).decode()
                self.ws_port, self.http_port = int(m.group(3)), int(m.group(4))
                return

    async def _collect(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.output.append(line)

    def log_tail(self, chars: int = 2000) -> str:
        if self.log_path is not None and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-chars:]
        return b"".join(self.output).decode(errors="replace")[-chars:]

    def kill(self) -> None:
        """SIGKILL at once (no drain): what a crashed node looks like to the others."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()

    def term(self) -> None:
        """SIGTERM: the node drains (tells clients to reconnect, then exits)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    async def wait(self, timeout: float = 30) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), timeout)

    async def stop(self, grace_s: float = 15) -> int | None:
        """SIGTERM, SIGKILL after ``grace_s``; returns the exit code (None if never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None and grace_s > 0:
            with contextlib.suppress(ProcessLookupError):
                self.term()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), grace_s)
        if self.proc.returncode is None:
            self.kill()
            await self.proc.wait()
        if self._reader is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._reader, 2)  # the pipe's rest, then EOF
            self._reader.cancel()
        return self.proc.returncode
