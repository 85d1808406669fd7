"""What the nodes waited on MongoDB for during a run: each node process's
``im_store_command_seconds`` read every few seconds (a process killed with
SIGKILL keeps its last reading), summed by command and collection. A store
that drowns shows here which reads drowned it."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Callable
from typing import Any

import httpx

__all__ = ["StoreLoad", "top_commands"]

_LINE = re.compile(r'^im_store_command_seconds_(sum|count)\{(.*)\} ([0-9.eE+-]+)$')
_AGE = re.compile(r'^im_sync_cursor_age_seconds_bucket'
                  r'\{le="([^"]+)",source="(\w+)"\} ([0-9.eE+-]+)$')
_FILL = re.compile(r'^im_offline_fills_total\{outcome="(\w+)"\} ([0-9.eE+-]+)$')
PERIOD_S = 5.0


class StoreLoad:
    def __init__(self, nodes: Callable[[], list[tuple[int, str]]]) -> None:
        self.nodes = nodes  # () -> [(pid, http url)] of the processes up now
        self._last: dict[int, dict[str, tuple[float, float]]] = {}  # pid -> labels -> (s, n)
        self._ages: dict[int, dict[tuple[str, str], float]] = {}  # pid -> (source, le) -> n
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                await asyncio.gather(*(self._read(client, pid, url)
                                       for pid, url in self.nodes()))
                await asyncio.sleep(PERIOD_S)

    async def _read(self, client: httpx.AsyncClient, pid: int, url: str) -> None:
        try:
            got = await client.get(f"{url}/metrics")
        except httpx.HTTPError:
            return
        if got.status_code != 200:  # a busy or draining node: keep its last reading
            return
        text = got.text
        seen: dict[str, list[float]] = {}
        ages: dict[tuple[str, str], float] = {}
        for line in text.splitlines():
            m = _LINE.match(line)
            if m:
                pair = seen.setdefault(m.group(2), [0.0, 0.0])
                pair[0 if m.group(1) == "sum" else 1] = float(m.group(3))
            elif a := _AGE.match(line):
                ages[(a.group(2), a.group(1))] = float(a.group(3))
            elif f := _FILL.match(line):
                ages[("fills", f.group(1))] = float(f.group(2))
        self._last[pid] = {k: (v[0], v[1]) for k, v in seen.items()}
        self._ages[pid] = ages

    def sync_ages(self) -> dict[str, dict[str, int]]:
        """Per source of a sync's 1:1 page (redis, mongo): how many syncs had a
        cursor at most 15 s, 60 s, 300 s old, and older (``im_sync_cursor_age_seconds``);
        and ``fills``: the offline store refills by outcome (``im_offline_fills_total``)."""
        total: dict[tuple[str, str], float] = {}
        for series in self._ages.values():
            for key, n in series.items():
                total[key] = total.get(key, 0.0) + n
        out: dict[str, dict[str, int]] = {
            "fills": {k: int(n) for (src, k), n in total.items() if src == "fills"}}
        for source in sorted({src for src, _ in total} - {"fills"}):
            def upto(le: str, source: str = source) -> int:
                return int(total.get((source, le), 0))
            every = upto("+Inf")
            out[source] = {"<=15s": upto("15.0"), "15-60s": upto("60.0") - upto("15.0"),
                           "60-300s": upto("300.0") - upto("60.0"),
                           ">300s": every - upto("300.0")}
        return out

    async def stop(self) -> list[dict[str, Any]]:
        """The top commands by time waited, over every process of the run."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        total: dict[str, list[float]] = {}
        for series in self._last.values():
            for labels, (s, n) in series.items():
                t = total.setdefault(labels, [0.0, 0.0])
                t[0] += s
                t[1] += n
        return top_commands({k: (s, n) for k, (s, n) in total.items()})


def top_commands(series: dict[str, tuple[float, float]], top: int = 12) -> list[dict[str, Any]]:
    """labels -> (seconds, count) as rows, the most time waited first."""
    rows = sorted(((s, n, k) for k, (s, n) in series.items() if n > 0), reverse=True)[:top]
    return [{"command": k, "count": int(n), "seconds": round(s, 1),
             "mean_ms": round(s / n * 1000, 1)} for s, n, k in rows]
