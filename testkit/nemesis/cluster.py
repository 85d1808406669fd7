"""The cluster a nemesis run faults: ``nodes`` gateway node processes
(``NodeProcess``: kill -9 is real) on fixed free ports (a restarted node keeps
its ports), sharing a private redis-server (``PrivateServer``: killed and
started again empty) or a private 3-master Redis Cluster (``LocalRedisCluster``:
one master killed and started again empty), a private SecantusDB (paused
with SIGSTOP/SIGCONT; or the shared MongoDB-compatible server, then the pause
is skipped) and the shared RabbitMQ, each node through its own ``TcpProxy``
(one node's link can be cut)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from urllib.parse import urlsplit

from testkit.clusters import LocalRedisCluster
from testkit.namespace import _delete_exchanges, _drop_database, new_namespace
from testkit.nemesis.config import SECRET, NemesisConfig
from testkit.nodes import NodeProcess, node_env
from testkit.proxy import TcpProxy
from testkit.servers import PrivateServer, free_port

__all__ = ["Cluster", "Slot"]


class Slot:
    """One node's place: fixed ports, its broker proxy, its process (restarted)."""

    def __init__(self, index: int, proxy: TcpProxy) -> None:
        self.index = index
        self.ws_port, self.http_port = free_port(), free_port()
        self.proxy = proxy
        self.proc: NodeProcess | None = None
        self.pids: list[int] = []
        self.up = False

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.ws_port}/ws"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def running(self) -> NodeProcess:
        """The node's process (it must have been started)."""
        if self.proc is None:
            raise RuntimeError(f"node {self.index} was never started")
        return self.proc


class Cluster:
    """The node processes, the private Redis and store, the broker proxies; a
    fresh namespace (``ns``) for the run, and which code the nodes ran."""

    def __init__(self, cfg: NemesisConfig) -> None:
        self.cfg = cfg
        self.ns = new_namespace("nem")
        self.redis: PrivateServer | None = None
        self.redis_cluster: LocalRedisCluster | None = None
        self.mongo: PrivateServer | None = None
        self.slots: list[Slot] = []
        self.node_code: set[str] = set()

    @property
    def mongo_url(self) -> str:
        return self.mongo.url if self.mongo is not None else self.cfg.shared_mongo_url

    def live_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.up]

    def amqp_through(self, proxy: TcpProxy) -> str:
        u = urlsplit(self.cfg.amqp_url)
        userinfo = u.netloc.rpartition("@")[0]
        return proxy.url("amqp", f"{userinfo}@" if userinfo else "", u.path or "/")

    async def start(self) -> None:
        if self.cfg.redis_cluster:
            self.redis_cluster = await LocalRedisCluster().start()
        else:
            self.redis = await PrivateServer("redis").start()
        if self.cfg.private_mongo:
            self.mongo = await PrivateServer("mongo").start()
        amqp_port = urlsplit(self.cfg.amqp_url).port or 5672
        for i in range(self.cfg.nodes):
            self.slots.append(Slot(i, await TcpProxy(amqp_port).start()))
        await asyncio.gather(*(self.start_node(s) for s in self.slots))

    def node_env(self, slot: Slot) -> dict[str, str]:
        if self.redis_cluster is not None:
            redis_url, cluster = self.redis_cluster.seeds, 1
        else:
            assert self.redis is not None
            redis_url, cluster = self.redis.url, 0
        return node_env(namespace=self.ns, auth_secret=SECRET, ws_port=slot.ws_port,
                        http_port=slot.http_port, metrics_port=-1, metrics_public=1,
                        redis_url=redis_url, redis_cluster=cluster, mongo_url=self.mongo_url,
                        amqp_url=self.amqp_through(slot.proxy), heartbeat_s=0.5,
                        heartbeat_ttl_s=2.0, dep_timeout_s=1.0, room_rate_cap=0,
                        drain_timeout_s=5)

    async def start_node(self, slot: Slot) -> NodeProcess:
        """Start the slot's node (again), retrying while its ports linger."""
        log = (self.cfg.log_dir / f"node{slot.index}.log") if self.cfg.log_dir else None
        last: Exception | None = None
        # A port just freed by a killed node may linger a moment, and a node
        # waits for a store that does not answer at its start (IM_STARTUP_WAIT_S,
        # 30 s) before it exits (SecantusDB, busy with the syncs that follow a
        # Redis loss, or paused by the schedule, can take many seconds): each try
        # is given longer than that wait, and tried again, as a supervisor
        # would, for up to 120 s.
        deadline = asyncio.get_running_loop().time() + 120
        while asyncio.get_running_loop().time() < deadline:
            proc = NodeProcess(self.node_env(slot), log_path=log, tree=self.cfg.tree)
            try:
                await proc.start(timeout=45)
            except (RuntimeError, TimeoutError) as exc:  # stopped by start() itself
                last = exc
                await asyncio.sleep(0.5)
                continue
            slot.proc = proc
            slot.pids.append(proc.pid)
            self._record_code(proc.pid)
            slot.up = True
            return proc
        raise RuntimeError(f"node {slot.index} would not start: {last}")

    def _record_code(self, pid: int) -> None:
        """Which code the node runs: its cwd and its PYTHONPATH."""
        with contextlib.suppress(OSError):
            self.node_code.add(os.readlink(f"/proc/{pid}/cwd"))
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = dict(kv.split(b"=", 1) for kv in fh.read().split(b"\0") if b"=" in kv)
            self.node_code.add("PYTHONPATH=" + env.get(b"PYTHONPATH", b"").decode())

    async def stop(self) -> None:
        for s in self.slots:
            if s.proc is not None:
                with contextlib.suppress(Exception):
                    await s.proc.stop(grace_s=5)
            await s.proxy.close()
        for srv in (self.redis, self.mongo):
            if srv is not None:
                if srv.proc is not None:  # a paused store is woken to be stopped
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(srv.proc.pid, signal.SIGCONT)
                await srv.stop_and_clean()
        if self.redis_cluster is not None:
            with contextlib.suppress(Exception):
                await self.redis_cluster.stop()
        await self._drop_leftovers()

    async def _drop_leftovers(self) -> None:
        """Only the exchanges (and, on the shared store, the database) outlive the run."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(20):
                await _delete_exchanges(self.cfg.amqp_url, self.ns)
        if self.mongo is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(20):
                    await _drop_database(self.cfg.shared_mongo_url, self.ns)
