"""The chat load generator: sender and receiver devices (``testkit.device``: the
Python SDK's low-level ``imgate_client.Connection``) in this one process.

Not the SDK's ``Client``: its receivers would ``recv_ack`` and dedup, its
senders keep an outbox with a timer task: work for the node under test and for
this process (which shares the machine's cores with it) that the figures
compared across runs never included. A send is one ``send`` frame and its
reply, matched by id, as the SDK's ``Connection.request`` does it.

``Load`` holds every device and the counts of the current phase
(``PhaseStats``); a ``Sender`` numbers its sends and times their acks, a
``Receiver`` counts the pushes of the current phase (both also per phase, for
per-node figures). ``closed_loop`` keeps a window of sends in flight, ``paced``
sends on a fixed schedule (open loop); ``run_phase`` drives the senders, counts
over a measured window (``common.measure_window``: CPU and the nodes' metrics)
and ``summarise``s the counts; ``saturate`` is that in a closed loop. Used by
``bench.chat_bench`` and ``bench.multinode_bench``.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from bench import common
from bench.stats import latency_summary
from testkit.device import Device, DeviceClosed
from testkit.nodes import NodeProcess
from testkit.poll import until
from testkit.tokens import issue_token

TEXT = "hello from the chat benchmark, a short line of text"
DRAIN_S = 10.0
Pump = Callable[[int, "Sender"], Coroutine[Any, Any, None]]  # sender i's loop in a phase
Measured = tuple[dict[str, Any], list[dict[str, Any]]]  # a phase's result, nodes' metrics


# -- the devices -------------------------------------------------------------------------
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
    """All devices of the benchmark, in this one process."""

    def __init__(self, receivers_online: bool = True) -> None:
        self.stats = PhaseStats(0)
        self.senders: list[Sender] = []
        self.receivers: list[Receiver] = []  # none when the receivers are offline
        self.receivers_online = receivers_online  # False: no deliveries expected

    @property
    def other(self) -> Counter[str]:
        """Frames nobody expected (op -> count)."""
        out: Counter[str] = Counter()
        for s in self.senders:
            out.update(s.dev.counts)
        for r in self.receivers:
            out.update({op: n for op, n in r.dev.counts.items() if op != "msg"})
        return out

    def begin_phase(self, phase: int) -> PhaseStats:
        self.stats = PhaseStats(phase)
        return self.stats

    async def drain(self, timeout_s: float = DRAIN_S) -> dict[str, int]:
        """Wait for outstanding acks and pushes of the phase; report what never came
        (pushes only when the receivers are online)."""
        def expected() -> int:
            return self.stats.acks if self.receivers_online else 0

        await until(lambda: not self.inflight() and self.stats.deliveries >= expected(),
                    timeout_s)
        return {"unanswered": self.inflight(),
                "undelivered": max(0, expected() - self.stats.deliveries)}

    def inflight(self) -> int:
        return sum(s.inflight for s in self.senders)

    async def close(self) -> None:
        await asyncio.gather(*(s.dev.close() for s in self.senders),
                             *(r.dev.close() for r in self.receivers), return_exceptions=True)


class Sender:
    """One sending device on node ``node``: numbered sends, acks timed."""

    def __init__(self, dev: Device, to: str, load: Load, node: int) -> None:
        self.dev, self.to, self.load, self.node = dev, to, load, node
        self.inflight = 0
        self.acked: Counter[int] = Counter()  # acks of measured sends, by phase
        self._n = 0
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self) -> None:
        """One send; returns once it is answered (or DRAIN_S x 3 passed)."""
        self._n += 1
        stats = self.load.stats if self.load.stats.open else None
        t = time.perf_counter()
        body = {"t": t, "m": stats.phase if stats is not None else -1, "text": TEXT}
        if stats is not None:
            stats.sent += 1
        self.inflight += 1
        try:
            f = await self.dev.request("send", 3 * DRAIN_S, to=self.to, cmid=f"c{self._n}",
                                       body=body)
        except (TimeoutError, DeviceClosed) as exc:
            f = {"op": "error", "code": type(exc).__name__}
        finally:
            self.inflight -= 1
        if stats is None:
            return
        if f["op"] == "ack":
            stats.acks += 1
            stats.ack_lat.append(time.perf_counter() - t)
            self.acked[stats.phase] += 1
        else:
            stats.errors[str(f.get("code"))] += 1

    def send_soon(self) -> None:
        """A send that nobody waits for (open loop)."""
        task = asyncio.create_task(self.send())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class Receiver:
    """One receiving device on node ``node``: counts the pushes of the current phase."""

    def __init__(self, load: Load, node: int) -> None:
        self.load, self.node = load, node
        self.got: Counter[int] = Counter()  # pushes of measured sends, by phase
        self.dev: Device

    def on_push(self, f: dict[str, Any]) -> None:
        body = f.get("body")
        if f.get("op") != "msg" or not isinstance(body, dict):
            return
        self.got[body.get("m", -1)] += 1
        stats = self.load.stats
        if body.get("m") == stats.phase:
            stats.deliveries += 1
            stats.dlv_lat.append(time.perf_counter() - body["t"])


async def open_load(ws_urls: list[str], secret: str, pairs: int, tag: str,
                    receivers_online: bool = True) -> Load:
    """Sender i on node i % n, its receiver on node (i+1) % n (the same node when n = 1).
    ``receivers_online=False``: the receivers (users ``{tag}-r{i}``) never connect, so
    every message is stored for an offline user; ``load.receivers`` is empty and no
    deliveries are expected."""
    n, load = len(ws_urls), Load(receivers_online)

    async def dial(url: str, user: str, on_push: Any = None) -> Device:
        return await Device.open(url, issue_token(secret, user), on_push=on_push,
                                 open_timeout=15)

    load.receivers = [Receiver(load, (i + 1) % n) for i in range(pairs if receivers_online
                                                                   else 0)]
    devs = await asyncio.gather(*(dial(ws_urls[r.node], f"{tag}-r{i}", r.on_push)
                                  for i, r in enumerate(load.receivers)))
    for r, dev in zip(load.receivers, devs, strict=True):
        r.dev = dev
    senders = await asyncio.gather(*(dial(ws_urls[i % n], f"{tag}-s{i}") for i in range(pairs)))
    load.senders = [Sender(dev, f"{tag}-r{i}", load, i % n) for i, dev in enumerate(senders)]
    return load


# -- sending: closed and open loop --------------------------------------------------
async def closed_loop(sender: Sender, window: int, until: float) -> None:
    """Keep ``window`` sends in flight until ``until`` (perf_counter)."""
    async def one_slot() -> None:
        while time.perf_counter() < until:
            await sender.send()

    await asyncio.gather(*(one_slot() for _ in range(window)))


async def paced(sender: Sender, first: float, interval: float, until: float) -> None:
    """Open loop: send at first, first + interval, ... whatever the acks do."""
    due = first
    while due < until:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if sender.load.stats.open:
            sender.load.stats.lag.append(max(0.0, time.perf_counter() - due))
        sender.send_soon()
        due += interval


async def stop_pumps(pumps: list[asyncio.Task[None]]) -> int:
    """Let the senders' loops end by themselves (bounded); returns how many had to be cancelled."""
    _, stuck = await asyncio.wait(pumps, timeout=DRAIN_S)
    for t in stuck:
        t.cancel()
    await asyncio.gather(*pumps, return_exceptions=True)
    return len(stuck)


# -- one measured phase -----------------------------------------------------------------
def summarise(stats: PhaseStats, seconds: float, cpu: dict[str, Any],
              drain: dict[str, int]) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3), "sent": stats.sent, "acks": stats.acks,
        "deliveries": stats.deliveries,
        "sent_per_s": round(stats.sent / seconds, 1),
        "acks_per_s": round(stats.acks / seconds, 1),
        "deliveries_per_s": round(stats.deliveries / seconds, 1),
        "errors": dict(stats.errors), **drain,
        "ack_latency": latency_summary(stats.ack_lat),
        "delivery_latency": latency_summary(stats.dlv_lat),
        "send_lag": latency_summary(stats.lag),
        "cpu": cpu,
    }


async def run_phase(load: Load, phase: int, names: dict[int, str], nodes: list[NodeProcess],
                    opens_at: float, until: float, pump: Pump) -> Measured:
    """Phase ``phase``: ``pump(i, sender)`` for every sender from now; sends counted from
    ``opens_at`` to ``until`` (perf_counter), then drained. The result (``summarise``; CPU
    over the window, and a single node's metrics), and every node's metrics deltas."""
    stats = load.begin_phase(phase)
    pumps = [asyncio.create_task(pump(i, s)) for i, s in enumerate(load.senders)]
    seconds, cpu, deltas = await common.measure_window(
        names, nodes, opens_at, until, lambda on: setattr(stats, "open", on))
    cpu["stuck_senders"] = await stop_pumps(pumps)
    if len(nodes) == 1:
        cpu["node_metrics"] = deltas[0]
    return summarise(stats, seconds, cpu, await load.drain()), deltas


async def saturate(load: Load, phase: int, names: dict[int, str], nodes: list[NodeProcess],
                   args: Any) -> Measured:
    """``run_phase`` in a closed loop (``args.window`` sends in flight per sender) for
    ``args.warmup`` s, then ``args.duration`` s measured."""
    opens_at = time.perf_counter() + args.warmup
    until = opens_at + args.duration
    return await run_phase(load, phase, names, nodes, opens_at, until,
                           lambda _i, s: closed_loop(s, args.window, until))
