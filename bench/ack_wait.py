"""What an ack's wait for its pushes' hand-off costs: 1:1 sends between two
in-process nodes (sender on one, receiver on the other, so every push crosses
RabbitMQ), one at a time, with ``IM_PUSH_CONFIRM_MS`` at its default and at 0
(no wait), alternating rounds in one run; prints the ack latency p50 / p99.

    .venv/bin/python -m bench.ack_wait --sends 300 --rounds 3

Uses the local Redis, RabbitMQ and MongoDB-compatible server of the test
settings (IM_* from the environment), a fresh namespace; stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import time
import uuid

from bench.stats import percentile
from gateway.config import Settings
from gateway.node import Node
from testkit.device import Device
from testkit.tokens import issue_token

SECRET = secrets.token_hex(32)


def settings(**values: object) -> Settings:
    env = {k: v for k, v in os.environ.items() if k in
           ("IM_REDIS_URL", "IM_REDIS_CLUSTER", "IM_MONGO_URL", "IM_AMQP_URL")}
    return Settings.from_env(env, auth_secret=SECRET, ws_port=0, http_port=0, metrics_port=-1,
                             node_id=-1, **values)


async def _round(wait_ms: int, sends: int, ns: str) -> list[float]:
    n1 = Node(settings(namespace=ns, push_confirm_ms=wait_ms))
    n2 = Node(settings(namespace=ns, push_confirm_ms=wait_ms))
    await n1.start()
    await n2.start()
    try:
        await n1.beat()
        await n2.beat()
        a, b = f"a{uuid.uuid4().hex[:8]}", f"b{uuid.uuid4().hex[:8]}"
        ca = await Device.open(n1.ws_port, issue_token(SECRET, a, 3600))
        cb = await Device.open(n2.ws_port, issue_token(SECRET, b, 3600))
        await ca.request("send", to=b, cmid="warm", body="w")  # a new pair: not timed
        await cb.next_push("msg")
        out = []
        for i in range(sends):
            t = time.perf_counter()
            r = await ca.request("send", to=b, cmid=f"m{i}", body=i)
            out.append((time.perf_counter() - t) * 1000)
            assert r["op"] == "ack", r
            await cb.next_push("msg")
        await ca.close()
        await cb.close()
        return out
    finally:
        await n1.close()
        await n2.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sends", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    ns = f"ackwait{uuid.uuid4().hex[:8]}"
    got: dict[int, list[float]] = {500: [], 0: []}
    for _ in range(args.rounds):
        for wait in (500, 0):
            got[wait] += await _round(wait, args.sends, ns)
    for wait, ms in got.items():
        ms.sort()
        print(f"IM_PUSH_CONFIRM_MS={wait}: {len(ms)} acks, p50 {percentile(ms, 50) or 0.0:.2f} ms, "
              f"p99 {percentile(ms, 99) or 0.0:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
