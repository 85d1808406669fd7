"""The store's own latency for the node's documents, paced: a floor for ack latency.

Writes what the node writes per batch (``insert_many`` of bodies, then of box
entries, built by ``store.messages``, same indexes and client options) at a
paced message rate, one batch at a time, and prints per-batch latency
percentiles for a few batch sizes. Run from the repository root::

    .venv/bin/python -m bench.store_probe [--mongo-url URL] [--rate 283] [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from pymongo import AsyncMongoClient

from store.messages_mongo import INDEXES, body_doc, box_docs
from store.records import ChatMessage


async def probe(url: str, rate: float, seconds: float) -> None:
    client: AsyncMongoClient[dict] = AsyncMongoClient(  # type: ignore[type-arg]
        url, w="majority", journal=True, retryWrites=False)
    db = client["store_probe"]
    await client.drop_database("store_probe")
    for col, keys, opts in INDEXES:
        await db[col].create_index(keys, **opts)
    try:
        for batch in (1, 2, 5, 16):
            lat: list[float] = []
            mid = (1 << 40) + batch * 1_000_000
            end = time.perf_counter() + seconds
            while time.perf_counter() < end:
                msgs = [ChatMessage(mid + i, f"s{i % 50}", f"r{i % 50}", f"c{mid + i}",
                                    {"t": "x" * 40}) for i in range(batch)]
                mid += batch
                t = time.perf_counter()
                await db.messages.insert_many([body_doc(m) for m in msgs], ordered=False)
                await db.boxes.insert_many([d for m in msgs for d in box_docs(m, m.mid)],
                                           ordered=False)
                lat.append((time.perf_counter() - t) * 1000)
                await asyncio.sleep(max(0.0, batch / rate - (time.perf_counter() - t)))
            lat.sort()
            n = len(lat)
            print(f"B={batch:<3} batches={n:<5} p50={lat[n // 2]:.1f} p95={lat[int(n * .95)]:.1f}"
                  f" p99={lat[int(n * .99)]:.1f} max={lat[-1]:.1f} ms")
    finally:
        await client.drop_database("store_probe")
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    p.add_argument("--rate", type=float, default=283.0, help="messages per second")
    p.add_argument("--seconds", type=float, default=6.0, help="per batch size")
    args = p.parse_args()
    if "127.0.0.1" not in args.mongo_url and "localhost" not in args.mongo_url:
        raise SystemExit("store_probe only talks to a local server")
    asyncio.run(probe(args.mongo_url, args.rate, args.seconds))


if __name__ == "__main__":
    main()
