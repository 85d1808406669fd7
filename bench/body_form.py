"""Does the form a body is stored in cost the store anything?

Inserts 15,000 message documents (batches of 256, w=majority, j=true, as the
node writes) three times per form, in rounds: the body as a sub-document (the
node before issue 11), as BSON binary of its encoded JSON (the node since), and
as a string. Prints docs/s per form and round. Use a fresh store::

    .venv/bin/python -m bench.body_form --mongo-url mongodb://127.0.0.1:27018
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from pymongo import AsyncMongoClient
from pymongo.write_concern import WriteConcern

TEXT = "hello there, this is a chat message of ordinary length"
FORMS = ("dict", "bytes", "str")


def body(form: str) -> Any:
    value = {"t": time.perf_counter(), "m": 0, "text": TEXT}
    if form == "dict":
        return value
    raw = orjson.dumps(value)
    return raw if form == "bytes" else raw.decode()


async def run(url: str, n: int, rounds: int) -> dict[str, list[float]]:
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(url)
    db = client.get_database("bench_body_form",
                             write_concern=WriteConcern(w="majority", j=True))
    rates: dict[str, list[float]] = {f: [] for f in FORMS}
    try:
        for rnd in range(rounds):
            for form in FORMS:
                col = db[f"m_{form}_{rnd}"]
                await col.drop()
                started, mid = time.perf_counter(), 0
                while mid < n:
                    docs = [{"_id": m, "from": f"s{m % 50}", "to": f"r{m % 50}",
                             "cmid": f"c{m}", "body": body(form)}
                            for m in range(mid + 1, mid + 257)]
                    await col.insert_many(docs, ordered=False)
                    mid += 256
                rates[form].append(mid / (time.perf_counter() - started))
                print(f"round {rnd} {form}: {rates[form][-1]:,.0f} docs/s", flush=True)
    finally:
        await client.drop_database("bench_body_form")
        await client.close()
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mongo-url", default="mongodb://127.0.0.1:27017")
    parser.add_argument("--docs", type=int, default=15_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rates = asyncio.run(run(args.mongo_url, args.docs, args.rounds))
    for form, values in rates.items():
        print(f"| {form} | " + " / ".join(f"{v:,.0f}" for v in values) + " |")


if __name__ == "__main__":
    main()
