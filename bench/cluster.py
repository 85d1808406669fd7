"""What one benchmark run starts and must clean up: its namespaces (a Redis key
prefix, MongoDB database and RabbitMQ exchanges each, dropped at the end), its
gateway nodes (``testkit.nodes``; their exit codes and log findings are kept for
the report).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
from typing import Any

from bench import common
from testkit.namespace import drop_namespace, new_namespace
from testkit.nodes import NodeProcess, node_env

NODES = 3  # nodes in phases 2 and 3 of bench.multinode_bench


def process_names(nodes: list[NodeProcess]) -> dict[int, str]:
    """Labels for CPU reports: this process (the load generator) and the nodes."""
    return {os.getpid(): "load generator (this process)",
            **{n.pid: f"node {i} {n.name}" for i, n in enumerate(nodes)}}


class Run:
    """What one benchmark run started and must clean up; node logs are
    ``bench/out/<prefix>-<stamp>-<label>-<i>.log``."""

    def __init__(self, args: argparse.Namespace, prefix: str) -> None:
        self.args = args
        self.prefix = prefix
        self.secret = secrets.token_hex(32)
        self.base = new_namespace("bench")
        self.namespaces: list[str] = []
        self.nodes: list[dict[str, Any]] = []

    def namespace(self, suffix: str) -> str:
        ns = self.base + suffix
        self.namespaces.append(ns)
        return ns

    async def start_nodes(self, ns: str, n: int, label: str,
                          **settings: Any) -> list[NodeProcess]:
        """``n`` benchmark nodes: namespace ``ns``, any free ports, no send or op budget
        (the checks still run), ``/metrics`` on the API port, the
        run's token secret and store URLs, then ``settings`` (which may override
        any of these, the budgets included)."""
        a = self.args
        env = node_env(**{
            "namespace": ns, "ws_port": 0, "http_port": 0, "send_rate": 1_000_000,
            "send_burst": 1_000_000, "op_rate": 1_000_000, "op_burst": 1_000_000,
            "refuse_burst": 1_000_000, "max_conns_per_user": 1_000_000, "http_rate": 0,
            "ip_handshake_rate": 0, "max_conns_per_ip": 0, "user_handshake_rate": 0,
            "metrics_port": -1, "metrics_public": 1, "auth_secret": self.secret,
            "mongo_url": a.mongo_url, "redis_url": a.redis_url, "amqp_url": a.amqp_url,
            "redis_cluster": getattr(a, "redis_cluster", 0),
            "workers": getattr(a, "workers", "1"), **settings})
        nodes: list[NodeProcess] = []
        try:
            for i in range(n):
                log = common.OUT_DIR / f"{self.prefix}-{self.args.stamp}-{label}-{i}.log"
                nodes.append(NodeProcess(env, log, getattr(self.args, "node_tree", None)))
                await nodes[-1].start()
        except BaseException:
            await self.stop_nodes(nodes)
            raise
        return nodes

    async def stop_nodes(self, nodes: list[NodeProcess]) -> None:
        """SIGTERM (drain) every node still running; note exit codes and log findings."""
        codes = await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
        for n, code in zip(nodes, codes, strict=True):
            assert n.log_path is not None
            self.nodes.append({
                "log": str(n.log_path), "name": n.name,
                "pid": n.proc.pid if n.proc else None,
                "exit_code": code if not isinstance(code, BaseException) else repr(code),
                "log_findings": common.log_findings(n.log_path)})

    async def cleanup(self) -> dict[str, Any]:
        a = self.args
        return {ns: await drop_namespace(ns, redis_url=a.redis_url, mongo_url=a.mongo_url,
                                         amqp_url=a.amqp_url,
                                         redis_cluster=bool(getattr(a, "redis_cluster", 0)))
                for ns in self.namespaces}
