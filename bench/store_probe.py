"""The store's own latency for the node's documents, paced: a floor for ack latency.

Writes what the node writes per batch (``insert_many`` of bodies, then of box
entries, built by ``store.messages_mongo``, same indexes and client options as
``bench.chat_bench``'s raw phase) at a
paced message rate, one batch at a time, and prints per-batch latency
percentiles for a few batch sizes. Run from the repository root::

    .venv/bin/python -m bench.store_probe [--mongo-url URL] [--rate 283] [--seconds 6]
"""

from __future__ import annotations

import asyncio

from bench import cli
from bench.chat_bench import store_paced_phase


async def probe(url: str, rate: float, seconds: float) -> None:
    for r in await store_paced_phase(url, "store_probe", rate, [1, 2, 5, 16], seconds):
        s = r["latency"]
        print(f"B={r['batch']:<3} batches={s['count']:<5} p50={s['p50_ms']} p95={s['p95_ms']} "
              f"p99={s['p99_ms']} max={s['max_ms']} ms")


def main() -> None:
    args = cli.parse(cli.new_parser("bench.store_probe", __doc__, (
        ("--rate", float, 283.0, "messages per second"),
        ("--seconds", float, 6.0, "per batch size")), urls=("mongo",), nodes=False), None)
    asyncio.run(probe(args.mongo_url, args.rate, args.seconds))


if __name__ == "__main__":
    main()
