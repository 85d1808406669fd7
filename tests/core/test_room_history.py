"""core.room_history: what a joining member gets, and ``recovered`` never true
when something after its position is gone (no server)."""

from __future__ import annotations

import orjson

from core.room_history import RoomLog, catch_up

NOW = 1_000_000


def entries(first: int, last: int, ts: int = NOW) -> list[bytes]:
    return [orjson.dumps({"from": "u", "body": p, "ts": ts, "pos": p})
            for p in range(first, last + 1)]


def poss(msgs: list[bytes]) -> list[int]:
    return [orjson.loads(m)["pos"] for m in msgs]


def join(log: RoomLog, *, history: int = 0, since: tuple[str, int] | None = None,
         max_age_ms: int = 300_000):
    return catch_up(log, now_ms=NOW, max_age_ms=max_age_ms, history=history, since=since)


def test_history_gives_the_last_n_in_order():
    log = RoomLog("e1", 10, entries(1, 10))
    assert poss(join(log, history=3).msgs) == [8, 9, 10]
    assert join(log, history=3).recovered is None
    assert poss(join(log, history=50).msgs) == list(range(1, 11))
    assert join(log).msgs == []


def test_since_a_kept_position_recovers_exactly_what_followed():
    log = RoomLog("e1", 10, entries(3, 10))
    c = join(log, since=("e1", 5))
    assert (poss(c.msgs), c.recovered) == ([6, 7, 8, 9, 10], True)
    c = join(log, since=("e1", 2))  # 3 is the oldest kept: nothing missing
    assert (poss(c.msgs), c.recovered) == (list(range(3, 11)), True)
    c = join(log, since=("e1", 10))
    assert (c.msgs, c.recovered) == ([], True)


def test_a_trimmed_gap_is_not_recovered():
    log = RoomLog("e1", 10, entries(5, 10))
    c = join(log, since=("e1", 2))  # 3 and 4 were trimmed
    assert (poss(c.msgs), c.recovered) == ([5, 6, 7, 8, 9, 10], False)


def test_another_or_lost_epoch_is_not_recovered():
    c = join(RoomLog("e2", 4, entries(1, 4)), since=("e1", 2))
    assert (poss(c.msgs), c.recovered) == ([1, 2, 3, 4], False)
    c = join(RoomLog(None, 0, []), since=("e1", 2))
    assert (c.msgs, c.recovered) == ([], False)
    # Same epoch, position ahead of the room's (a failover lost positions): not true.
    c = join(RoomLog("e1", 3, entries(1, 3)), since=("e1", 7))
    assert c.recovered is False


def test_messages_past_the_age_are_gone_with_everything_before_them():
    old, new = entries(1, 5, ts=NOW - 400_000), entries(6, 8)
    # A message of a slow node's clock in the middle: it and what precedes it go.
    mixed = new[:1] + entries(7, 7, ts=NOW - 400_000) + new[2:]
    c = join(RoomLog("e1", 8, old + new), since=("e1", 3))
    assert (poss(c.msgs), c.recovered) == ([6, 7, 8], False)
    c = join(RoomLog("e1", 8, old + new), since=("e1", 5))
    assert (poss(c.msgs), c.recovered) == ([6, 7, 8], True)
    c = join(RoomLog("e1", 8, old + mixed), since=("e1", 5))
    assert (poss(c.msgs), c.recovered) == ([8], False)
    assert poss(join(RoomLog("e1", 8, old + new), history=10).msgs) == [6, 7, 8]
