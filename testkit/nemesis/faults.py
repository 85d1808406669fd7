"""Applying the schedule's faults to the cluster and healing them, each with the
evidence it took effect: ``kill9`` (SIGKILL a node, start it again), ``drain``
(SIGTERM, wait for its exit, start it again), ``redis`` (SIGKILL the Redis,
start it again empty), ``redis_master`` (on a Redis Cluster: kill one master,
start it again empty), ``store_pause`` (SIGSTOP the store, SIGCONT),
``broker_cut`` (cut one node's RabbitMQ link at its proxy, restore)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

from testkit.nemesis.cluster import Cluster
from testkit.nemesis.history import now
from testkit.nemesis.schedule import Fault
from testkit.poll import until

__all__ = ["FaultInjector", "proc_state"]


def proc_state(pid: int) -> str:
    """The process's state letter from ``/proc`` ("T": stopped), "?" if gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "?"


class FaultInjector:
    """Runs a schedule against a cluster: each fault applied, held for its
    duration, healed; its ``t_start``, ``t_heal`` and ``evidence`` filled in."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.timeline: list[tuple[float, str]] = []
        self._apply: dict[str, Callable[[Fault], Awaitable[None]]] = {
            "kill9": self._kill9, "drain": self._drain, "redis": self._redis_restart,
            "redis_master": self._redis_master,
            "store_pause": self._store_pause, "broker_cut": self._broker_cut}

    def note(self, what: str) -> None:
        self.timeline.append((now(), what))

    async def run_schedule(self, schedule: list[Fault], t0: float) -> None:
        """Each fault at ``t0 + at``, one after the other."""
        for f in sorted(schedule, key=lambda f: f.at):
            wait = t0 + f.at - now()
            if wait > 0:
                await asyncio.sleep(wait)
            await self.apply(f)

    async def apply(self, f: Fault) -> None:
        f.t_start = now()
        self.note(f"{f.kind} start node={f.node}")
        await self._apply[f.kind](f)
        if f.skipped is not None:
            return
        f.t_heal = now()
        self.note(f"{f.kind} heal node={f.node}")

    async def _kill9(self, f: Fault) -> None:
        slot = self.cluster.slots[f.node]
        proc = slot.running
        f.evidence["pid_before"] = proc.pid
        slot.up = False
        proc.kill()
        f.evidence["exit_code"] = await proc.wait(10)
        await asyncio.sleep(f.duration)
        f.evidence["pid_after"] = (await self.cluster.start_node(slot)).pid

    async def _drain(self, f: Fault) -> None:
        assert f.t_start is not None
        slot = self.cluster.slots[f.node]
        proc = slot.running
        f.evidence["pid_before"] = proc.pid
        slot.up = False
        proc.term()
        f.evidence["exit_code"] = await proc.wait(30)
        f.evidence["drain_s"] = round(now() - f.t_start, 3)
        rest = f.duration - (now() - f.t_start)
        if rest > 0:
            await asyncio.sleep(rest)
        f.evidence["pid_after"] = (await self.cluster.start_node(slot)).pid

    async def _redis_restart(self, f: Fault) -> None:
        redis = self.cluster.redis
        assert redis is not None and redis.proc is not None
        f.evidence["pid_before"] = redis.proc.pid
        await redis.kill()
        await asyncio.sleep(f.duration)
        await redis.start()
        assert redis.proc is not None
        f.evidence["pid_after"] = redis.proc.pid

    async def _redis_master(self, f: Fault) -> None:
        rc = self.cluster.redis_cluster
        if rc is None:
            f.skipped = "no Redis Cluster in this run"
            f.t_heal = now()
            return
        f.evidence["port"] = rc.ports[f.node - 1]
        await rc.stop_node(f.node)
        f.evidence["state_on_master_down"] = await rc.state(f.node)  # "": it does not answer
        await asyncio.sleep(f.duration)
        await rc.start_node(f.node)  # returns once every master says ok
        f.evidence["state_after"] = await rc.state(f.node)

    async def _store_pause(self, f: Fault) -> None:
        mongo = self.cluster.mongo
        if mongo is None or mongo.proc is None:
            f.skipped = "the shared MongoDB-compatible server is not paused (no private one)"
            f.t_heal = now()
            return
        pid = mongo.proc.pid
        os.kill(pid, signal.SIGSTOP)
        f.evidence["pid"] = pid
        try:  # resumed whatever happens here (a wait that times out, a cancelled run)
            await until(lambda: proc_state(pid) == "T", timeout=5, every=0.01)
            f.evidence["state_paused"] = proc_state(pid)
            await asyncio.sleep(f.duration)
        finally:
            os.kill(pid, signal.SIGCONT)
        f.evidence["state_after"] = proc_state(pid)

    async def _broker_cut(self, f: Fault) -> None:
        slot = self.cluster.slots[f.node]
        f.evidence["pid_before"] = slot.running.pid
        proxy = slot.proxy
        refused = proxy.refused
        proxy.cut()
        f.evidence["proxy_cut"] = proxy.is_cut
        await asyncio.sleep(f.duration)
        f.evidence["refused_during_cut"] = proxy.refused - refused
        proxy.restore()
        accepted = proxy.accepted
        ok = await until(lambda: proxy.accepted > accepted, timeout=20, every=0.1)
        f.evidence["relinked"] = bool(ok)
