"""The Redis Cluster client the stores use (``store.redis_client``), on a
private local cluster (on free ports; not the run's Redis, so CI's
single-Redis pass runs it and the cluster pass need not): scripts in
pipelines across nodes, NOSCRIPT after a node lost its script cache, the
bounded gate, and errors as ``Unavailable``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from core.errors import Unavailable
from store.redis_client import Batch, GatedRedisCluster, Lua, connect_redis, redis_guard
from testkit.clusters import LocalRedisCluster
from testkit.poll import until
from testkit.servers import free_port
from tests.conftest import uid


def gated(seeds: str, timeout_s: float, **kw: int) -> GatedRedisCluster:
    """``connect_redis(..., cluster=True)``: the gated cluster client."""
    r = connect_redis(seeds, timeout_s, cluster=True, **kw)
    assert isinstance(r, GatedRedisCluster)
    return r


async def hget_int(r: GatedRedisCluster, key: str, field: str) -> int:
    value = await r.hget(key, field)
    assert value is not None, key
    return int(value)


@pytest.fixture(scope="module")
async def cluster() -> AsyncIterator[LocalRedisCluster]:
    c = LocalRedisCluster()  # free ports
    try:
        yield await c.start()
    finally:
        await c.stop()


async def test_scripts_in_a_pipeline_run_on_every_node_even_after_a_script_flush(cluster):
    r = gated(cluster.seeds, 2.0)
    hmax = Lua("hmax.lua")
    ns = uid("s")
    keys = [f"{ns}:{{u{i}}}" for i in range(60)]  # spread over the three masters
    try:
        for flush in (False, True):
            if flush:  # as after a restart or a promoted replica: no script cached
                await r.execute_command("SCRIPT FLUSH", target_nodes=r.PRIMARIES)
            batch = Batch(r)
            for i, k in enumerate(keys):
                batch.script(hmax, [k], ["f", i + 100 * flush])
            batch.pipe.hget(keys[0], "f")  # a plain command keeps its place (it may
            # run before re-sent scripts: store.redis_client.Batch says so)
            replies = await batch.execute()
            assert replies[:-1] == [i + 100 * flush for i in range(len(keys))]
            assert [await hget_int(r, k, "f") for k in keys] == \
                [i + 100 * flush for i in range(len(keys))]
        await r.execute_command("SCRIPT FLUSH", target_nodes=r.PRIMARIES)
        assert await hmax(r, [keys[0]], ["f", 7]) == 100  # outside a pipeline too
    finally:
        for k in keys:
            await r.delete(k)
        await r.aclose()


async def test_the_gate_bounds_connections_waits_then_gives_unavailable(cluster):
    # The wait (2 s) is only an upper bound here: generous, so a loaded machine
    # does not turn the burst's queueing into a failure.
    r = gated(cluster.seeds, 2.0, max_connections=4)
    watch = gated(cluster.seeds, 2.0)
    ns = uid("g")
    try:
        await r.ping(target_nodes=r.PRIMARIES)
        before = await _clients(watch)
        # A burst far above the gate's size waits its turn: no failure, and no
        # primary got more than 4 connections from this client.
        hmax = Lua("hmax.lua")
        got = await asyncio.gather(*(hmax(r, [f"{ns}:{{b{i}}}"], ["f", i]) for i in range(200)))
        assert got == list(range(200))
        after = await _clients(watch)
        assert all(after[n] - before[n] <= 4 for n in before), (before, after)
        # Every place held: the next command waits 2 s, then is Unavailable
        # and was never sent.
        release = asyncio.Event()

        async def hold() -> None:
            async with r.gate.place():
                await release.wait()

        holders = [asyncio.create_task(hold()) for _ in range(4)]
        assert await until(lambda: r.gate.free == 0, timeout=5)
        with pytest.raises(Unavailable):
            async with redis_guard():
                await r.set(f"{ns}:{{late}}", 1)
        release.set()
        await asyncio.gather(*holders)
        assert await watch.get(f"{ns}:{{late}}") is None
        assert await r.set(f"{ns}:{{late}}", 1)  # places are free again
    finally:
        for k in [f"{ns}:{{late}}", *(f"{ns}:{{b{i}}}" for i in range(200))]:
            await watch.delete(k)
        await r.aclose()
        await watch.aclose()


async def _clients(r: GatedRedisCluster) -> dict[str, int]:
    """connected_clients of each primary."""
    infos = await r.info("clients", target_nodes=r.PRIMARIES)
    return {name: int(i["connected_clients"]) for name, i in infos.items()}


async def test_cluster_errors_are_unavailable(cluster):
    r = connect_redis(f"redis://127.0.0.1:{free_port()}", 0.5, cluster=True)  # nothing listens
    with pytest.raises(Unavailable):
        async with redis_guard():
            await r.ping()
    await r.aclose()
