"""Gateways on a 3-node RabbitMQ cluster (``scripts/rabbitmq_cluster.sh``): each
node of the cluster is killed under the gateways connected to it, and they
move to another node of ``IM_AMQP_URL``, replay their setup there (queue,
bindings, consumer) and carry 1:1 and room traffic again.

The cluster is private (AMQP on 127.0.0.1, RMQ_CLUSTER_PORT_BASE+1..3 with a
free base picked by ``LocalRabbit``; its own directory and Erlang cookie),
started once for this module and always torn down. The gateways are real
processes on the run's Redis and MongoDB (whatever IM_REDIS_URL /
IM_REDIS_CLUSTER / IM_MONGO_URL name). Every wait polls with a deadline.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest

from testkit.clusters import LocalRabbit
from testkit.device import Device
from testkit.nodes import NodeProcess
from testkit.poll import until
from testkit.probe import sample
from tests.conftest import token, uid

# Room traffic in this test is counted exactly: no per-member delivery cap, no
# send limit in the way; fast heartbeats so the nodes learn each other soon.
GATEWAY = {"metrics_public": 1, "room_rate_cap": 0, "room_send_rate": 1000,
           "room_send_burst": 1000, "heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}
MOVE_S = 20  # a gateway must be on another RabbitMQ node within this (measured: < 1 s)
_LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_seq = itertools.count(1)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRabbit]:
    rabbit = LocalRabbit(tmp_path_factory.mktemp("rmq") / "cluster")
    try:
        rabbit.start()
        assert len(rabbit.urls) == 3, rabbit.urls
        yield rabbit
    finally:
        rabbit.stop()


# -- reading a gateway from outside -------------------------------------------
async def scrape(client: httpx.AsyncClient, g: NodeProcess) -> dict[str, float]:
    text = (await client.get(f"{g.http_url}/metrics")).text
    names = ("im_broker_connected", "im_broker_node_index", "im_broker_reconnects_total",
             "im_broker_failovers_total")
    return {n.removeprefix("im_broker_"): sample(text, n) for n in names}


async def health(client: httpx.AsyncClient, g: NodeProcess) -> int:
    return (await client.get(f"{g.http_url}/healthz")).status_code


def failover_seconds(g: NodeProcess) -> float | None:
    """From the gateway's log: the last lost link to its restoration on another node."""
    lost = restored = None
    for line in g.output:
        m = _LOG_TIME.match(line)
        if m is None:
            continue
        at = datetime.strptime(m.group(1).decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if b"RabbitMQ connection to" in line and b"lost" in line:
            lost, restored = at, None
        elif b"RabbitMQ connection restored" in line and lost is not None:
            restored = at
    return None if lost is None or restored is None else restored - lost


# -- users ---------------------------------------------------------------------
@dataclass
class User:
    """One device of one user, recording every push it gets."""

    name: str
    device: Device
    msgs: dict[str, dict[str, Any]] = field(default_factory=dict)  # mid -> 1:1 msg push
    room_bodies: list[str] = field(default_factory=list)

    @classmethod
    async def on(cls, g: NodeProcess, prefix: str) -> User:
        name = uid(prefix)
        user = cls(name, None)  # type: ignore[arg-type]
        user.device = await Device.open(g.ws_port, token(name), on_push=user._push)
        return user

    def _push(self, frame: dict[str, Any]) -> None:
        if frame.get("op") == "msg":
            self.msgs[str(frame["mid"])] = frame
        elif frame.get("op") == "room_msgs":
            self.room_bodies.extend(str(m["body"]) for m in frame["msgs"])

    async def send(self, to: User, tag: str) -> str:
        """A 1:1 message; its mid once acked (AssertionError otherwise)."""
        reply = await self.device.request("send", to=to.name, cmid=f"{tag}-{next(_seq)}",
                                          body=tag)
        assert reply["op"] == "ack", reply
        return str(reply["mid"])

    async def room_send(self, room: str, body: str) -> None:
        reply = await self.device.request("room_send", room=room, body=body)
        assert reply["op"] == "ok", reply

    async def synced_mids(self, g: NodeProcess, client: httpx.AsyncClient) -> set[str]:
        """Every mid ``/v1/sync`` returns (all pages)."""
        mids: set[str] = set()
        since = "0"
        for _ in range(100):
            r = await client.get(f"{g.http_url}/v1/sync", params={"since": since, "limit": 200},
                                 headers={"Authorization": f"Bearer {token(self.name)}"})
            assert r.status_code == 200, r.text
            page = r.json()
            mids.update(str(m["mid"]) for m in page["msgs"])
            if not page["more"]:
                return mids
            since = str(page["next"])
        raise AssertionError("sync did not end")


async def crossing(a: User, b: User, room: str, tag: str, n: int = 10) -> None:
    """``n`` 1:1 messages each way and ``n`` room messages each way between ``a``
    and ``b`` (on different gateways): every acked one arrives as a push, every
    room message sent arrives (nothing is failing any more)."""
    to_a = [await b.send(a, f"{tag}-b2a") for _ in range(n)]
    to_b = [await a.send(b, f"{tag}-a2b") for _ in range(n)]
    for i in range(n):
        await b.room_send(room, f"{tag}-room-b-{i}")
        await a.room_send(room, f"{tag}-room-a-{i}")
    assert await until(lambda: set(to_a) <= a.msgs.keys() and set(to_b) <= b.msgs.keys(),
                       timeout=10), (set(to_a) - a.msgs.keys(), set(to_b) - b.msgs.keys())
    want_a = sorted(f"{tag}-room-b-{i}" for i in range(n))
    want_b = sorted(f"{tag}-room-a-{i}" for i in range(n))

    def rooms_in() -> bool:
        return (sorted(x for x in a.room_bodies if x.startswith(f"{tag}-room-b-")) == want_a
                and sorted(x for x in b.room_bodies if x.startswith(f"{tag}-room-a-")) == want_b)

    assert await until(rooms_in, timeout=10), (a.room_bodies[-n:], b.room_bodies[-n:])


def on_node(first: int, index: float) -> int:
    """The cluster node (1..3) of entry ``index`` of the list ``rotated(first)``."""
    return (first - 1 + int(index)) % 3 + 1


async def wait_moved(client: httpx.AsyncClient, g: NodeProcess, *,
                     failovers: int) -> dict[str, float]:
    """Until ``g`` has failed over ``failovers`` times in all, is connected and
    /healthz says 200 again; its broker metrics then."""
    async def moved() -> dict[str, float] | None:
        m = await scrape(client, g)
        ok = (m["connected"] == 1 and m["failovers_total"] >= failovers
              and await health(client, g) == 200)
        return m if ok else None

    m = await until(moved, timeout=MOVE_S, every=0.02)
    assert m, f"{g.name} did not move: {await scrape(client, g)}\n{g.log_tail()}"
    return m


class Watch:
    """Polls a gateway's /healthz every 10 ms in the background: was a 503 seen?"""

    def __init__(self, client: httpx.AsyncClient, g: NodeProcess) -> None:
        self.codes: set[int] = set()
        self._task = asyncio.create_task(self._run(client, g))

    async def _run(self, client: httpx.AsyncClient, g: NodeProcess) -> None:
        while True:
            try:
                self.codes.add(await health(client, g))
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.01)

    async def stop(self) -> bool:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return 503 in self.codes


async def logged_failover(g: NodeProcess) -> float:
    """Seconds from link lost to restored, from the gateway's log (once both lines are in)."""
    took = await until(lambda: failover_seconds(g), timeout=5)
    assert took is not None, g.log_tail()
    return float(took)


# -- the tests -------------------------------------------------------------------
async def test_gateways_follow_their_rabbitmq_node_away(cluster, node_process):
    a = await node_process(amqp_url=cluster.rotated(1), **GATEWAY)  # starts on RabbitMQ node 1
    b = await node_process(amqp_url=cluster.rotated(2), **GATEWAY)  # starts on node 2
    d = await node_process(amqp_url=cluster.urls[0], **GATEWAY)  # node 1 only: cannot move
    async with httpx.AsyncClient(timeout=5, trust_env=False) as client:
        for g in (a, b, d):
            m = await scrape(client, g)
            assert m == {"connected": 1, "node_index": 0, "reconnects_total": 0,
                         "failovers_total": 0}, (g.name, m)
            assert await health(client, g) == 200
        alice, bob = await User.on(a, "alice"), await User.on(b, "bob")
        room = uid("room")
        for u in (alice, bob):
            assert (await u.device.request("join", room=room))["op"] == "joined"
        try:
            await crossing(alice, bob, room, "before")

            # 1. RabbitMQ node 1 stops (gracefully) while bob keeps sending to alice.
            gap: list[str] = []
            stop = asyncio.Event()

            async def keep_sending() -> None:
                while not stop.is_set():
                    gap.append(await bob.send(alice, "gap"))
                    await asyncio.sleep(0.02)

            sender = asyncio.create_task(keep_sending())
            watch = Watch(client, a)
            started = time.monotonic()
            stopping = asyncio.create_task(cluster.script("stop-node", "1"))
            moved = await wait_moved(client, a, failovers=1)
            took = time.monotonic() - started
            seen_503 = await watch.stop()
            await stopping
            stop.set()
            await sender
            a_on = on_node(1, moved["node_index"])
            assert a_on in (2, 3)
            print(f"\nnode 1 stopped: gateway A on node {a_on} "
                  f"{await logged_failover(a):.3f}s after its link was lost (its log; "
                  f"{took:.2f}s after `stop-node` began); 503 seen on A meanwhile: {seen_503}")
            # D has node 1 alone: no broker, so not healthy while node 1 is down.
            assert await until(lambda: _is_503(client, d), timeout=MOVE_S)
            assert (await scrape(client, d))["connected"] == 0
            assert (await scrape(client, b))["reconnects_total"] == 0  # node 2 never left
            # Every acked message of the gap is alice's: pushed, or in sync.
            assert len(gap) > 0
            synced = await alice.synced_mids(a, client)
            assert set(gap) <= alice.msgs.keys() | synced, set(gap) - alice.msgs.keys() - synced
            await crossing(alice, bob, room, "after-stop")

            # 2. The node A is on now is killed with SIGKILL (B too, if it is there).
            b_on = on_node(2, (await scrape(client, b))["node_index"])
            watch = Watch(client, a)
            started = time.monotonic()
            await cluster.script("stop-node", str(a_on), hard=True)
            ma = await wait_moved(client, a, failovers=2)
            took = time.monotonic() - started
            seen_503 = await watch.stop()
            survivor = ({1, 2, 3} - {1, a_on}).pop()
            assert on_node(1, ma["node_index"]) == survivor
            line = (f"node {a_on} killed: A on node {survivor} {await logged_failover(a):.3f}s "
                    f"after its link was lost ({took:.2f}s after the kill began; 503 seen: "
                    f"{seen_503})")
            if b_on == a_on:
                mb = await wait_moved(client, b, failovers=1)
                assert on_node(2, mb["node_index"]) == survivor
                line += f", B too, {await logged_failover(b):.3f}s"
            print(line)
            await crossing(alice, bob, room, "after-kill")

            # 3. A new gateway starts on the list while its first two nodes are down.
            e = await node_process(amqp_url=cluster.rotated(1), **GATEWAY)
            assert on_node(1, (await scrape(client, e))["node_index"]) == survivor
            carol = await User.on(e, "carol")
            mid = await carol.send(alice, "from-e")
            assert await until(lambda: mid in alice.msgs)
            await carol.device.close()
        finally:
            await alice.device.close()
            await bob.device.close()


async def _is_503(client: httpx.AsyncClient, g: NodeProcess) -> bool:
    try:
        return await health(client, g) == 503
    except httpx.HTTPError:
        return False


async def test_a_malformed_list_stops_the_start_with_its_name(node_process):
    with pytest.raises(RuntimeError, match=r"IM_AMQP_URL item 2 of 3 is empty"):
        await node_process(amqp_url="amqp://guest:guest@127.0.0.1:5681/,,amqp://h/")
