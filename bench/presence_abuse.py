"""Presence-watch abuse vs a bystander's 1:1 sends (bounded, 127.0.0.1 only).

Two node processes on the local Redis, RabbitMQ and MongoDB (a namespace of
their own, dropped at the end). A bystander on node 0 sends 1:1 messages to a
peer on node 1 at a fixed rate and times each ``ack``: first ``--seconds``
with nothing else going on (baseline), then as long again while one user with
``--conns`` connections on node 0 keeps asking to watch ``--per-conn`` new
users per connection, closing and reconnecting every round (a reconnect
loop). Prints the send latencies of both windows, the watches accepted and
refused, and node 0's broker binds and unbinds::

    .venv/bin/python -m bench.presence_abuse                # this checkout
    .venv/bin/python -m bench.presence_abuse --tree /tmp/old  # another checkout's nodes
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import time
import urllib.request
from typing import Any

from bench.stats import latency_summary
from testkit.device import Device
from testkit.namespace import drop_namespace, new_namespace
from testkit.nodes import NodeProcess, node_env
from testkit.tokens import issue_token

SECRET = "bench-secret-0123456789-abcdefghijkl"
URLS = {"redis_url": os.environ.get("IM_REDIS_URL", "redis://127.0.0.1:6379/0"),
        "mongo_url": os.environ.get("IM_MONGO_URL", "mongodb://127.0.0.1:27017"),
        "amqp_url": os.environ.get("IM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")}


def metric(node: NodeProcess, name: str, labels: str) -> float:
    with urllib.request.urlopen(f"{node.http_url}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{name}\{{{labels}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def sender(a: Device, to: str, rate: float, stop: asyncio.Event, out: list[float]) -> None:
    n = 0
    next_at = time.perf_counter()
    while not stop.is_set():
        n += 1
        t0 = time.perf_counter()
        r = await a.request("send", to=to, cmid=f"c{n}", body=n)
        if r.get("op") == "ack":
            out.append(time.perf_counter() - t0)
        next_at += 1 / rate
        await asyncio.sleep(max(0.0, next_at - time.perf_counter()))


async def attack(ws_url: str, conns: int, per_conn: int, stop: asyncio.Event,
                 tally: dict[str, int]) -> None:
    user, k = "attacker", 0
    while not stop.is_set():
        devs = await asyncio.gather(*(Device.open(ws_url, issue_token(SECRET, user, 3600))
                                      for _ in range(conns)))

        async def watch(d: Device) -> None:
            nonlocal k
            for start in range(0, per_conn, 500):
                k += 1
                users = [f"v{k}x{i}" for i in range(min(500, per_conn - start))]
                r = await d.request("presence_sub", timeout=30, users=users)
                tally["accepted" if r.get("op") == "presence" else
                      str(r.get("code"))] += len(users)

        await asyncio.gather(*(watch(d) for d in devs))
        tally["rounds"] += 1
        await asyncio.gather(*(d.close() for d in devs))


async def main(a: argparse.Namespace) -> dict[str, Any]:
    ns = new_namespace("pab")
    env = node_env(namespace=ns, ws_port=0, http_port=0, metrics_port=-1, metrics_public=1,
                   auth_secret=SECRET, privacy_presence="everyone", ip_handshake_rate=0,
                   max_conns_per_ip=0, presence_subs_max=a.cap, **URLS)
    nodes: list[NodeProcess] = []
    try:
        for _ in range(2):
            nodes.append(await NodeProcess(env, tree=a.tree).start())
        sa = await Device.open(nodes[0].ws_url, issue_token(SECRET, "alice", 3600))
        sb = await Device.open(nodes[1].ws_url, issue_token(SECRET, "bob", 3600))
        await asyncio.sleep(3)  # heartbeats: each node knows the other
        res: dict[str, Any] = {"tree": a.tree or "this checkout", "cap": a.cap,
                               "conns": a.conns, "per_conn": a.per_conn}
        for phase in ("baseline", "attack"):
            stop, lat = asyncio.Event(), list[float]()
            tally: dict[str, int] = {"rounds": 0, "accepted": 0}
            tally.setdefault("forbidden", 0)
            tally.setdefault("bad_request", 0)
            jobs = [asyncio.create_task(sender(sa, "bob", a.rate, stop, lat))]
            if phase == "attack":
                jobs.append(asyncio.create_task(attack(nodes[0].ws_url, a.conns, a.per_conn,
                                                       stop, tally)))
            await asyncio.sleep(a.seconds)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*jobs), 60)
            res[phase] = {"sends": latency_summary(lat), **(
                {"watch_requests": tally} if phase == "attack" else {})}
        res["node0_binds"] = metric(nodes[0], "im_room_bind_ops_total", 'op="bind"')
        res["node0_unbinds"] = metric(nodes[0], "im_room_bind_ops_total", 'op="unbind"')
        await sa.close()
        await sb.close()
        return res
    finally:
        for n in nodes:
            await n.stop(grace_s=5)
        await drop_namespace(ns, redis_url=URLS["redis_url"], mongo_url=URLS["mongo_url"],
                             amqp_url=URLS["amqp_url"])


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tree", default=None, help="checkout whose code the nodes run")
    p.add_argument("--seconds", type=float, default=6.0, help="length of each window")
    p.add_argument("--rate", type=float, default=50.0, help="bystander sends per second")
    p.add_argument("--conns", type=int, default=10, help="the watcher's connections")
    p.add_argument("--per-conn", type=int, default=1000, help="users asked per connection")
    p.add_argument("--cap", type=int, default=1000, help="IM_PRESENCE_SUBS_MAX")
    a = p.parse_args()
    if not (0 < a.seconds <= 60 and 0 < a.rate <= 500 and 0 < a.conns <= 10
            and 0 < a.per_conn <= 5000):
        p.error("bounded: --seconds 0-60, --rate 0-500, --conns 1-10, --per-conn 1-5000")
    print(json.dumps(asyncio.run(main(a)), indent=1))


if __name__ == "__main__":
    cli()
