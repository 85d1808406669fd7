"""The store's own speed at the one command a group send cannot batch: the seq
allocation (``findAndModify`` by ``_id`` on the groups collection), beside an
``update`` and a point ``find`` by ``_id``, on a scratch collection of as many
documents as the benchmark's groups collection holds, in the same run.

SecantusDB (the MongoDB-compatible server the benchmarks run on here) answers
a ``findAndModify`` by ``_id`` with a scan of its collection, so its cost grows
with the number of groups; mongod uses the ``_id`` index. A figure of a run
with many groups is read against these.

    .venv/bin/python -m bench.store_probe --docs 2000
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from pymongo import AsyncMongoClient, ReturnDocument

__all__ = ["probe"]


async def probe(mongo_url: str, docs: int, rounds: int = 100) -> dict[str, Any]:
    """Mean ms per command, one at a time, on a scratch database (dropped)."""
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(mongo_url)
    name = f"probe_{uuid.uuid4().hex[:8]}"
    try:
        coll = client[name]["groups"]
        await coll.insert_many([{"_id": f"g{i}", "seq": 0, "lastmid": 0, "rdmid": 0}
                                for i in range(docs)])
        out: dict[str, Any] = {"docs": docs, "rounds": rounds}

        async def timed(what: str, one: Any) -> None:
            t = time.perf_counter()
            for i in range(rounds):
                await one(f"g{i % docs}")
            out[what] = round((time.perf_counter() - t) / rounds * 1000, 3)

        await timed("find_and_modify_ms", lambda g: coll.find_one_and_update(
            {"_id": g, "dissolved": {"$ne": True}}, {"$inc": {"seq": 1}},
            projection={"seq": 1}, return_document=ReturnDocument.AFTER))
        await timed("update_one_ms", lambda g: coll.update_one({"_id": g},
                                                               {"$inc": {"seq": 1}}))
        await timed("find_one_ms", lambda g: coll.find_one({"_id": g}))
        return out
    finally:
        await client.drop_database(name)
        await client.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.store_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    p.add_argument("--docs", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=100)
    a = p.parse_args()
    print(asyncio.run(probe(a.mongo_url, max(1, a.docs), max(1, a.rounds))))


if __name__ == "__main__":
    main()
