"""``serve --workers N`` (gateway/cli/workers.py): N node processes sharing one
WebSocket and one HTTP port (SO_REUSEPORT) under a supervisor. Connections
spread over the workers; users on two workers chat; a worker killed with
SIGKILL is started again, its clients reconnect through the same port and
nothing acked is lost; SIGTERM drains every worker and the supervisor exits 0."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from store.keys import Keys
from testkit.poll import until
from testkit.soak import Endpoint, Soak
from tests.conftest import RUN_NS, SECRET, uid
from tests.integration.router.test_failover import (
    FAST_HEARTBEAT,
    assert_nothing_acked_was_lost,
    report,
)


def children(pid: int) -> list[int]:
    """The live child processes of ``pid`` (its workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def alive(pids: list[int]) -> list[int]:
    return [p for p in pids if Path(f"/proc/{p}").exists()]


async def nodes_holding(redis_client, users: list[str]) -> set[str]:
    keys = Keys(RUN_NS)
    held: set[str] = set()
    for u in users:
        routes = await redis_client.hgetall(keys.routes(u))
        held.update(v.decode() for v in routes.values())
    return held


async def test_workers_share_the_ports_and_a_killed_worker_is_started_again(
        node_process, redis_client):
    sup = await node_process(workers=2, **FAST_HEARTBEAT)
    workers = await until(lambda: len(children(sup.pid)) == 2 and children(sup.pid))
    assert len(workers) == 2
    users = [uid("w") for _ in range(16)]
    soak = Soak([Endpoint.of(sup)], users, SECRET, interval=1 / 8)
    spread: list[set[str]] = []

    async def kill_a_worker():
        spread.append(await nodes_holding(redis_client, users))
        os.kill(workers[0], signal.SIGKILL)

    await soak.run(seconds=8, event=kill_a_worker, event_at=3)
    result = await soak.finish()
    report("worker killed", result)
    assert len(spread[0]) == 2  # the kernel spread the 16 connections over both workers
    assert_nothing_acked_was_lost(result)
    assert result["reconnects"] >= 1  # the killed worker's clients came back
    again = await until(lambda: (len(c := children(sup.pid)) == 2 and workers[0] not in c
                                 and c), timeout=15)
    assert again and workers[1] in again  # the other one was left alone
    sup.term()
    assert await sup.wait(30) == 0
    assert not alive(again)  # drained, exited, reaped
    said = b"".join(sup.output)
    assert b"worker 0 exited (code -9); starting it again" in said
    assert b"draining 2 workers" in said and b"gateway.workers stopped" in said


async def test_a_killed_supervisor_leaves_no_worker_serving(node_process):
    """SIGKILL of the supervisor (no drain from it): the kernel tells each worker
    (PR_SET_PDEATHSIG), which drains and exits; none is left holding the port."""
    sup = await node_process(workers=2, **FAST_HEARTBEAT)
    workers = await until(lambda: len(children(sup.pid)) == 2 and children(sup.pid))
    assert len(workers) == 2
    try:
        sup.kill()
        await sup.wait(30)
        assert await until(lambda: not alive(workers), timeout=30)
    finally:
        for pid in alive(workers):  # (only if the check failed: none may outlive the test)
            os.kill(pid, signal.SIGKILL)
