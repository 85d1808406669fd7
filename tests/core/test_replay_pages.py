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


def test_a_replay_reaches_back_to_the_sends_in_flight_during_the_outage() -> None:
    """A message published during an outage can carry a mid issued long before
    it (a slow store, a resend keeping its first attempt's mid): the replay
    starts below the oldest mid in flight since the outage began, not only two
    seconds before it."""
    from core.ids import mid_for_time_ms
    from gateway.delivery import Replay
    from gateway.hub import Hub
    from gateway.metrics import NodeMetrics

    metrics = NodeMetrics()
    replay = Replay(Hub(metrics, 1 << 20), FakeOffline(FakeDedup(), FakeRoutes()), metrics)
    t = 1_800_000_000.0
    plain = mid_for_time_ms(int((t - 2.0) * 1000))
    assert replay._since(t) == plain  # nothing in flight ever seen
    marks = iter([mid_for_time_ms(int((t - 30) * 1000)),  # before the outage: no matter
                  mid_for_time_ms(int((t - 15) * 1000)),  # in flight during it
                  None])
    replay.low_mark = lambda: next(marks)
    replay.note_low_mark(t - 10)
    replay.note_low_mark(t + 1)
    replay.note_low_mark(t + 2)  # nothing in flight: not kept
    replay.low_mark = lambda: None
    assert replay._since(t) == mid_for_time_ms(int((t - 15) * 1000)) - 1
    replay.low_mark = lambda: mid_for_time_ms(int((t - 20) * 1000))  # in flight now
    assert replay._since(t) == mid_for_time_ms(int((t - 20) * 1000)) - 1
