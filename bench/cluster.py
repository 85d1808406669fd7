"""What one multi-node run starts and must clean up: its namespaces (a Redis key
prefix, MongoDB database and RabbitMQ exchanges each), its gateway nodes (their
exit codes and log findings are kept for the report), and the cleanup at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
from typing import Any

from bench import common

NODES = 3  # nodes in phases 2 and 3 of bench.multinode_bench


class Run:
    """What one benchmark run started and must clean up."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.secret = secrets.token_hex(32)
        self.base = common.new_namespace()
        self.namespaces: list[str] = []
        self.nodes: list[dict[str, Any]] = []

    def namespace(self, suffix: str) -> str:
        ns = self.base + suffix
        self.namespaces.append(ns)
        return ns

    async def start_nodes(self, ns: str, n: int, label: str) -> list[common.NodeProcess]:
        env = {**common.node_env(self.args, ns, self.secret), "IM_AMQP_URL": self.args.amqp_url}
        nodes: list[common.NodeProcess] = []
        try:
            for i in range(n):
                log = common.OUT_DIR / f"multinode-{self.args.stamp}-{label}-{i}.log"
                nodes.append(common.NodeProcess(env, log))
                await nodes[-1].start()
        except BaseException:
            await self.stop_nodes(nodes)
            raise
        return nodes

    async def stop_nodes(self, nodes: list[common.NodeProcess]) -> None:
        """SIGTERM (drain) every node still running; note exit codes and log findings."""
        codes = await asyncio.gather(*(n.stop() for n in nodes), return_exceptions=True)
        for n, code in zip(nodes, codes, strict=True):
            self.nodes.append({
                "log": str(n.log_path), "name": n.name,
                "pid": n.proc.pid if n.proc else None,
                "exit_code": code if not isinstance(code, BaseException) else repr(code),
                "log_findings": common.log_findings(n.log_path)})

    async def cleanup(self) -> dict[str, Any]:
        a, out = self.args, {}
        for ns in self.namespaces:
            done: dict[str, Any] = {}
            for what, job in (("mongo", lambda ns=ns: common.drop_databases(a.mongo_url, [ns])),
                              ("redis_keys", lambda ns=ns: common.delete_redis_keys(
                                  a.redis_url, ns)),
                              ("exchanges", lambda ns=ns: common.delete_exchanges(
                                  a.amqp_url, ns))):
                try:
                    async with asyncio.timeout(120):
                        done[what] = await job()
                except Exception as exc:  # noqa: BLE001 - reported; the results still matter
                    done[what] = f"failed: {exc!r}"
            out[ns] = done
        return out
