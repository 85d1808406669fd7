"""gateway.bindings over the in-process broker (router.broker_memory), no
servers: keys bound once for concurrent callers, unbound only after the delay,
and, after a broker link comes back, the keys in use checked against what the
broker binds, a missing one bound again and counted."""

from __future__ import annotations

import asyncio

from gateway.bindings import Bindings
from gateway.metrics import NodeMetrics
from router.broker_memory import MemoryBroker


async def bindings() -> tuple[Bindings, MemoryBroker, NodeMetrics]:
    broker, metrics = MemoryBroker(), NodeMetrics()
    await broker.start("n1", lambda _envelope: None)
    return Bindings(broker, metrics, delay_s=5.0, window_ticks=6), broker, metrics


def repairs(metrics: NodeMetrics) -> float:
    value = metrics.registry.get_sample_value("im_room_bind_ops_total", {"op": "repair"})
    return value or 0.0


async def test_concurrent_callers_share_one_bind_and_unbind_waits_for_the_delay() -> None:
    b, broker, _ = await bindings()
    await asyncio.gather(*(b.ensure("r.lobby") for _ in range(5)))
    assert broker.binds == 1 and broker.bound_keys() == {"r.lobby"}
    b.idle("r.lobby", now=100.0)
    await b.sweep(104.0, lambda _key: False)
    assert broker.bound_keys() == {"r.lobby"}  # not yet
    await b.sweep(105.0, lambda _key: False)
    assert broker.bound_keys() == set() and b.bound == set()


async def test_recheck_binds_again_a_key_in_use_the_broker_lost() -> None:
    b, broker, metrics = await bindings()
    for key in ("r.lobby", "g.team", "p.alice"):
        await b.ensure(key)
    await broker.unbind_key("g.team")  # lost behind the node's back
    assert b.bound >= {"g.team"}  # what this side believed

    assert await b.recheck(["r.lobby", "g.team", "p.alice"]) == ["g.team"]
    assert broker.bound_keys() == {"r.lobby", "g.team", "p.alice"}
    assert repairs(metrics) == 1
    assert await b.recheck(["r.lobby", "g.team", "p.alice"]) == []  # nothing more
    assert repairs(metrics) == 1


async def test_resumed_rechecks_what_is_in_use_then() -> None:
    b, broker, _ = await bindings()
    in_use = ["r.lobby"]
    b.resumed(lambda: in_use)
    for _ in range(10):
        if broker.bound_keys():
            break
        await asyncio.sleep(0)
    assert broker.bound_keys() == {"r.lobby"}
