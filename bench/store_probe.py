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
import time

from bench import cli, common
from bench.chat_bench import fresh_collections, message_docs, raw_client


async def probe(url: str, rate: float, seconds: float) -> None:
    client = raw_client(url)
    db = client["store_probe"]
    try:
        for batch in (1, 2, 5, 16):
            await fresh_collections(db, indexes=True)
            lat: list[float] = []
            mid, end = 1 << 40, time.perf_counter() + seconds
            while time.perf_counter() < end:
                bodies, boxes = message_docs(mid, batch, 50)
                mid += batch
                t = time.perf_counter()
                await db.messages.insert_many(bodies, ordered=False)
                await db.boxes.insert_many(boxes, ordered=False)
                lat.append(time.perf_counter() - t)
                await asyncio.sleep(max(0.0, batch / rate - (time.perf_counter() - t)))
            s = common.latency_summary(lat, (50, 95, 99))
            print(f"B={batch:<3} batches={s['count']:<5} p50={s['p50_ms']} p95={s['p95_ms']} "
                  f"p99={s['p99_ms']} max={s['max_ms']} ms")
    finally:
        await client.drop_database("store_probe")
        await client.close()


def main() -> None:
    args = cli.parse(cli.new_parser("bench.store_probe", __doc__, (
        ("--rate", float, 283.0, "messages per second"),
        ("--seconds", float, 6.0, "per batch size")), urls=("mongo",), nodes=False), None)
    asyncio.run(probe(args.mongo_url, args.rate, args.seconds))


if __name__ == "__main__":
    main()
