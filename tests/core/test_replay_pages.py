"""gateway.delivery.entries_since over a fake offline store: every entry after
the point, page after page, up to the cap (no servers)."""

from __future__ import annotations

import orjson

from gateway.delivery import REPLAY_MAX, REPLAY_PAGE, entries_since
from store.records import Delivery
from tests.core.fakes import FakeDedup, FakeOffline, FakeRoutes


async def offline_with(counts: dict[str, int]) -> FakeOffline:
    offline = FakeOffline(FakeDedup(), FakeRoutes())
    for user, n in counts.items():
        await offline.deliver([Delivery(user, "peer", mid, orjson.dumps({"mid": mid}), True)
                               for mid in range(1, n + 1)], [])
    return offline


async def test_a_user_with_more_than_a_page_gets_every_entry_after_the_point() -> None:
    offline = await offline_with({"bob": REPLAY_PAGE * 2 + 50, "ann": 3})
    bob, ann = await entries_since(offline, ["bob", "ann"], 10)
    assert [orjson.loads(f)["mid"] for f in bob] == list(range(11, REPLAY_PAGE * 2 + 51))
    assert [orjson.loads(f)["mid"] for f in ann] == []


async def test_the_replay_stops_at_its_cap() -> None:
    offline = await offline_with({"bob": REPLAY_MAX + REPLAY_PAGE * 2})
    [bob] = await entries_since(offline, ["bob"], 0)
    assert len(bob) == REPLAY_MAX
