"""The sync cursor and sends in flight on other nodes: a send that may still
land holds every node's cursor below its mid; a node that closes takes its
mark with it."""

from __future__ import annotations

import time

from gateway.node import Node
from testkit.poll import until
from tests.conftest import uid


async def _next(h, since: int) -> int:  # type: ignore[no-untyped-def]
    page = (await h.get("/v1/sync", params={"since": since})).json()
    return int(page["next"])


async def test_a_send_that_may_still_land_holds_cursors_until_its_node_closes(
        make_node, connect, http) -> None:  # type: ignore[no-untyped-def]
    # a_node's heartbeat stays current for a minute after it stops: its mark
    # must go with it, not with the heartbeat.
    a_node: Node = await make_node(heartbeat_ttl_s=60)
    b_node: Node = await make_node()
    a, b = uid("a"), uid("b")
    ca = await connect(b_node, a)
    first = await ca.request("send", to=b, cmid="m0", body="before")
    # A send on a_node failed after it had its mid: the store may still write
    # it, so no cursor may pass it while that is possible.
    held = a_node.app.chat.mids.next()
    a_node.app.inflight.failed(held, time.monotonic())
    later = await ca.request("send", to=b, cmid="m1", body="after")
    assert first["mid"] < held < later["mid"]
    hb = http(b, b_node)

    async def b_node_knows_the_mark() -> bool:
        return b_node.app.marks.get(a_node.name) == held

    assert await until(b_node_knows_the_mark, 5)
    # Past the settle window the cursor would pass both messages; the mark
    # keeps it below the held mid.
    async def settled() -> bool:
        return (await _next(hb, 0)) >= first["mid"]

    assert await until(settled, 5)
    assert await _next(hb, 0) < held

    await a_node.close()

    async def passes() -> bool:
        return (await _next(hb, 0)) >= later["mid"]

    assert await until(passes, 5)
    await b_node.stores.nodes.leave(a_node.name)  # no minute-long ghost for later tests
