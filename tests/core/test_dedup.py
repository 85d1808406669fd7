"""The dedup value per (sender, cmid): formats and parsing, pure."""

from __future__ import annotations

import random

import pytest

from core.dedup import Prior, done, parse, pending


def test_the_three_forms_are_today_s_strings():
    assert pending(42) == "p:42"
    assert done(42) == "d:42"
    assert done(42, 7) == "d:42:7"
    assert done(42, 0) == "d:42:0"  # seq 0 is a seq, not "no seq"


def test_parse_reads_each_form():
    assert parse("p:42") == Prior(acked=False, mid=42, seq=None)
    assert parse("d:42") == Prior(acked=True, mid=42, seq=None)
    assert parse("d:42:7") == Prior(acked=True, mid=42, seq=7)


def test_round_trip_on_random_values():
    rng = random.Random(10)
    for _ in range(1000):
        mid, seq = rng.randrange(2**53), rng.randrange(2**40)
        assert parse(pending(mid)) == Prior(False, mid)
        assert parse(done(mid)) == Prior(True, mid)
        assert parse(done(mid, seq)) == Prior(True, mid, seq)


def test_a_group_value_is_told_apart_from_a_1to1_value():
    # chat.py today does int("42:7") on a group value and fails with "internal";
    # a caller of parse() sees seq is not None and can refuse with bad_request.
    assert parse("d:42:7").seq is not None
    assert parse("d:42").seq is None


@pytest.mark.parametrize("value", [
    "", "p", "d", "p:", "d:", "x:1", "P:1", "p:1:2", "d:1:2:3", "d:1:", "d::1",
    "d:-1", "p:+1", "p: 1", "p:1 ", "p:1_000", "p:0x10", "d:1.5", "p:١", "d:a:1",
])
def test_malformed_values_raise_value_error(value):
    with pytest.raises(ValueError):
        parse(value)


def test_prior_is_frozen():
    with pytest.raises(AttributeError):
        parse("d:1").mid = 2  # type: ignore[misc]
