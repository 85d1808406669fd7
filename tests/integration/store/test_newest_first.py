"""``store.mongo_client.newest_first``: newest-first reads in windows of time
give exactly what one sorted read gives, whatever the ages and the limit."""

from __future__ import annotations

import time
from typing import Any

from core.ids import mid_for_time_ms
from store.mongo_client import newest_first
from tests.conftest import uid

AGES_S = [0, 30, 59, 61, 300, 3_000, 7_200, 80_000, 90_000, 172_800, 400 * 86_400]


async def test_windows_read_the_same_as_one_sorted_read(mongo_db: Any) -> None:
    coll = mongo_db[uid("nf")]
    now_ms = int(time.time() * 1000)
    owner = "o1"
    docs = [{"_id": f"{owner}|{i}", "owner": owner, "mid": mid_for_time_ms(now_ms - a * 1000) + i}
            for i, a in enumerate(AGES_S)]
    docs.append({"_id": "o2|0", "owner": "o2", "mid": mid_for_time_ms(now_ms)})  # not o1's
    await coll.insert_many(docs)
    await coll.create_index([("owner", 1), ("mid", 1)])
    mine = sorted((d["mid"] for d in docs if d["owner"] == owner), reverse=True)
    for limit in (1, 2, 3, 5, 8, len(mine), len(mine) + 5):
        got = [d["mid"] for d in await newest_first(coll, {"owner": owner}, limit)]
        assert got == mine[:limit], limit
    for before in mine:  # a page below each of them
        got = [d["mid"] for d in await newest_first(coll, {"owner": owner}, 4, before=before)]
        assert got == [m for m in mine if m < before][:4], before
    await coll.drop()
