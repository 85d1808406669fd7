"""``core.ratelimit``: a call that turned out to cost more is debited after it."""

from __future__ import annotations

from core.ratelimit import KeyedBuckets


def test_a_debit_makes_the_next_calls_wait_until_the_bucket_refills():
    b = KeyedBuckets(rate=1.0, burst=5)
    assert b.take("u", 0.0)  # 4 left
    b.debit("u", 0.0, 6)  # the call was worth 6 more: -2
    assert not b.take("u", 0.0) and not b.take("u", 2.5)  # 0.5 by then
    assert b.take("u", 3.0)  # 1 by then
    b.debit("u", 3.0, 100)  # never below minus a burst
    assert not b.take("u", 8.9) and b.take("u", 9.0)
    assert b.take("other", 0.0)  # another user's bucket is its own
