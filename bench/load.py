"""The chat load generator: sender and receiver WebSockets in this one process.

``Load`` holds every connection and the counts of the current phase
(``PhaseStats``); a ``Sender`` numbers its sends and matches acks, a
``Receiver`` counts the pushes of the current phase. ``closed_loop`` keeps a
window of sends in flight, ``paced`` sends on a fixed schedule (open loop);
``measure_window`` opens the phase's counting for a window and measures CPU
(``Meter``) and the node's metrics over it; ``summarise`` turns the counts into
the per-phase result. Used by ``bench.chat_bench`` and ``bench.multinode_bench``.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from bench import common
from gateway.auth import issue_token

TEXT = "hello from the chat benchmark, a short line of text"
DRAIN_S = 10.0


# -- the connections -------------------------------------------------------------------
@dataclass
class PhaseStats:
    """Counts of one phase; only messages sent while ``open`` are counted."""

    phase: int
    open: bool = False
    sent: int = 0
    acks: int = 0
    deliveries: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    ack_lat: list[float] = field(default_factory=list)
    dlv_lat: list[float] = field(default_factory=list)
    lag: list[float] = field(default_factory=list)


class Load:
    """All connections of the benchmark, in this one process."""

    def __init__(self) -> None:
        self.stats = PhaseStats(0)
        self.senders: list[Sender] = []
        self.receivers: list[Receiver] = []
        self.other: Counter[str] = Counter()  # frames nobody expected (op -> count)

    def begin_phase(self, phase: int) -> PhaseStats:
        self.stats = PhaseStats(phase)
        return self.stats

    async def drain(self, timeout_s: float = DRAIN_S) -> dict[str, int]:
        """Wait for outstanding acks and pushes of the phase; report what never came."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if not self.inflight() and self.stats.deliveries >= self.stats.acks:
                break
            await asyncio.sleep(0.05)
        return {"unanswered": self.inflight(),
                "undelivered": max(0, self.stats.acks - self.stats.deliveries)}

    def inflight(self) -> int:
        return sum(len(s.inflight) for s in self.senders)

    async def close(self) -> None:
        conns = [*self.senders, *self.receivers]
        await asyncio.gather(*(c.ws.close() for c in conns), return_exceptions=True)
        for c in conns:
            c.reader.cancel()


class Device:
    """One client connection of the load; a task reads its frames into ``_on_frame``."""

    def __init__(self, ws: ClientConnection, load: Load) -> None:
        self.ws, self.load = ws, load
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in self.ws:
                self._on_frame(orjson.loads(data))

    def _on_frame(self, f: dict[str, Any]) -> None:
        raise NotImplementedError


class Sender(Device):
    """One sending device: numbered requests, acks matched by ``re``."""

    def __init__(self, ws: ClientConnection, to: str, load: Load) -> None:
        self.to = to
        self.inflight: dict[int, tuple[float, PhaseStats | None]] = {}
        self.slots: asyncio.Semaphore | None = None  # closed-loop window, if any
        self._rid = 0
        super().__init__(ws, load)

    async def send(self) -> None:
        self._rid += 1
        stats = self.load.stats if self.load.stats.open else None
        mark = stats.phase if stats is not None else -1
        t = time.perf_counter()
        self.inflight[self._rid] = (t, stats)
        frame = {"op": "send", "id": self._rid, "to": self.to, "cmid": f"c{self._rid}",
                 "body": {"t": t, "m": mark, "text": TEXT}}
        await self.ws.send(orjson.dumps(frame).decode())
        if stats is not None:
            stats.sent += 1

    def _on_frame(self, f: dict[str, Any]) -> None:
        op = f.get("op")
        entry = self.inflight.pop(f.get("re"), None) if op in ("ack", "error") else None
        if entry is None:
            key = f"{op}:{f.get('code')}" if op == "error" else str(op)
            self.load.other[key] += 1
            return
        if self.slots is not None:
            self.slots.release()
        t, stats = entry
        if stats is None:
            return
        if op == "ack":
            stats.acks += 1
            stats.ack_lat.append(time.perf_counter() - t)
        else:
            stats.errors[str(f.get("code"))] += 1


class Receiver(Device):
    """One receiving device: counts pushes of the current phase."""

    def _on_frame(self, f: dict[str, Any]) -> None:
        body = f.get("body")
        stats = self.load.stats
        if f.get("op") == "msg" and isinstance(body, dict) and body.get("m") == stats.phase:
            stats.deliveries += 1
            stats.dlv_lat.append(time.perf_counter() - body["t"])
        elif f.get("op") != "msg":
            self.load.other[str(f.get("op"))] += 1


async def dial(ws_url: str, secret: str, user: str, open_timeout: float = 15
               ) -> ClientConnection:
    """One WebSocket as ``user`` (a fresh token); no compression, no keepalive pings."""
    token = issue_token(secret, user, 3600)
    return await connect(f"{ws_url}?token={token}", compression=None, proxy=None,
                         ping_interval=None, open_timeout=open_timeout, close_timeout=2)


async def open_load(ws_url: str, secret: str, pairs: int, tag: str) -> Load:
    load = Load()
    receivers = await asyncio.gather(*(dial(ws_url, secret, f"{tag}-r{i}")
                                       for i in range(pairs)))
    senders = await asyncio.gather(*(dial(ws_url, secret, f"{tag}-s{i}") for i in range(pairs)))
    load.receivers = [Receiver(ws, load) for ws in receivers]
    load.senders = [Sender(ws, f"{tag}-r{i}", load) for i, ws in enumerate(senders)]
    return load


# -- sending: closed and open loop --------------------------------------------------
async def closed_loop(sender: Sender, window: int, until: float) -> None:
    """Keep ``window`` sends in flight until ``until`` (perf_counter)."""
    sender.slots = asyncio.Semaphore(window)
    while (remaining := until - time.perf_counter()) > 0:
        try:
            await asyncio.wait_for(sender.slots.acquire(), remaining)
        except TimeoutError:
            return
        if time.perf_counter() >= until:
            return
        await sender.send()


async def paced(sender: Sender, first: float, interval: float, until: float) -> None:
    """Open loop: send at first, first + interval, ... whatever the acks do."""
    due = first
    while due < until:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sender.load.stats.open:
            sender.load.stats.lag.append(max(0.0, time.perf_counter() - due))
        await sender.send()
        due += interval


async def stop_pumps(pumps: list[asyncio.Task[None]]) -> int:
    """Let the senders' loops end by themselves (bounded); returns how many had to be cancelled."""
    _, stuck = await asyncio.wait(pumps, timeout=DRAIN_S)
    for t in stuck:
        t.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    return len(stuck)


# -- measuring windows ----------------------------------------------------------------
@dataclass
class Meter:
    """CPU of every process (from /proc) and of this one (getrusage) over a window."""

    names: dict[int, str]
    snap: common.CpuSnapshot = field(default_factory=common.cpu_snapshot)
    own: float = field(default_factory=lambda: _own_cpu())

    def stop(self) -> tuple[float, dict[str, Any]]:
        after = common.cpu_snapshot()
        seconds = after.wall - self.snap.wall
        report = common.cpu_report(self.snap, after, self.names)
        report["load_generator_cores"] = round((_own_cpu() - self.own) / seconds, 3)
        return seconds, report


def _own_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def summarise(stats: PhaseStats, seconds: float, cpu: dict[str, Any],
              drain: dict[str, int]) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3), "sent": stats.sent, "acks": stats.acks,
        "deliveries": stats.deliveries,
        "sent_per_s": round(stats.sent / seconds, 1),
        "acks_per_s": round(stats.acks / seconds, 1),
        "deliveries_per_s": round(stats.deliveries / seconds, 1),
        "errors": dict(stats.errors), **drain,
        "ack_latency": common.latency_summary(stats.ack_lat),
        "delivery_latency": common.latency_summary(stats.dlv_lat),
        "send_lag": common.latency_summary(stats.lag),
        "cpu": cpu,
    }


async def measure_window(load: Load, names: dict[int, str], node: common.NodeProcess | None,
                         opens_at: float, closes_at: float) -> tuple[float, dict[str, Any]]:
    """Count the current phase between two perf_counter instants; CPU and node metrics."""
    await asyncio.sleep(max(0.0, opens_at - time.perf_counter()))
    metrics = await common.fetch_metrics(node.http_url) if node else {}
    meter, load.stats.open = Meter(names), True
    await asyncio.sleep(max(0.0, closes_at - time.perf_counter()))
    load.stats.open = False
    seconds, cpu = meter.stop()
    if node is not None:
        after = await common.fetch_metrics(node.http_url)
        cpu["node_metrics"] = common.metrics_delta(metrics, after)
    return seconds, cpu
