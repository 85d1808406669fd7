"""Group seq assignment and batch summaries (gateway/groups/service.py), pure."""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.groupseq import BatchSummary, assign, by_group, summarize


@dataclass(frozen=True)
class Msg:
    group: str
    seq: int
    mid: int
    sender: str
    wd: bool


def test_by_group_keeps_arrival_order():
    assert by_group(["a", "b", "a", "c", "b", "a"]) == {"a": [0, 2, 5], "b": [1, 4], "c": [3]}
    assert list(by_group(["z", "a", "z"])) == ["z", "a"]  # groups in first-seen order
    assert by_group([]) == {}


def test_assign_hands_out_the_batch_s_range_in_arrival_order():
    # the counter was 7, three items raised it to 10: seqs 8, 9, 10
    assert assign([0, 2, 5], 10) == [(0, 8), (2, 9), (5, 10)]
    assert assign([4], 1) == [(4, 1)]
    assert assign([], 5) == []


def test_assign_over_random_batches_never_repeats_a_seq():
    rng = random.Random(20)
    counters: dict[str, int] = {}
    seen: dict[str, list[int]] = {}
    for _ in range(200):
        groups = [rng.choice("abcde") for _ in range(rng.randrange(1, 30))]
        for g, idx in by_group(groups).items():
            start = counters.get(g, 0)
            counters[g] = start + len(idx)  # the store's $inc
            pairs = assign(idx, counters[g])
            assert [i for i, _ in pairs] == idx
            assert [s for _, s in pairs] == list(range(start + 1, counters[g] + 1))
            seen.setdefault(g, []).extend(s for _, s in pairs)
    for g, seqs in seen.items():
        assert seqs == list(range(1, counters[g] + 1)), g  # no hole, no repeat


def test_summarize_newest_rdmid_and_reads():
    msgs = [
        Msg("a", 8, 100, "u1", wd=True),
        Msg("b", 3, 101, "u2", wd=False),
        Msg("a", 9, 102, "u2", wd=True),
        Msg("b", 4, 103, "u2", wd=False),
        Msg("a", 10, 104, "u1", wd=False),
    ]
    s = summarize(msgs)
    assert isinstance(s, BatchSummary)
    assert s.newest == {"a": msgs[4], "b": msgs[3]}
    assert s.rdmid == {"a": 104, "b": 103}
    assert s.reads == [("u1", "a", 10), ("u2", "b", 4), ("u2", "a", 9)]


def test_summarize_write_diffused_only_group_has_rdmid_zero():
    s = summarize([Msg("a", 1, 5, "u", wd=True), Msg("a", 2, 6, "u", wd=True)])
    assert s.rdmid == {"a": 0}  # today: rd.get(g, 0)
    assert s.newest["a"].seq == 2


def test_summarize_empty_and_out_of_order_input():
    assert summarize([]) == BatchSummary({}, {}, [])
    late, early = Msg("g", 5, 50, "x", False), Msg("g", 4, 60, "x", False)
    s = summarize([late, early])  # stored order need not be seq order
    assert s.newest == {"g": late}
    assert s.rdmid == {"g": 60}  # highest mid, not the newest seq's mid
    assert s.reads == [("x", "g", 5)]


def test_summarize_equal_seqs_keep_the_first():
    first, second = Msg("g", 5, 1, "x", False), Msg("g", 5, 2, "y", False)
    assert summarize([first, second]).newest["g"] is first


def test_summarize_matches_a_brute_force_on_random_batches():
    rng = random.Random(21)
    for _ in range(200):
        msgs = [Msg(rng.choice("ab"), rng.randrange(1, 50), rng.randrange(1000),
                    rng.choice(["u", "v", "w"]), rng.random() < 0.5)
                for _ in range(rng.randrange(1, 20))]
        s = summarize(msgs)
        for g in {m.group for m in msgs}:
            mine = [m for m in msgs if m.group == g]
            assert s.newest[g].seq == max(m.seq for m in mine)
            assert s.rdmid[g] == max([m.mid for m in mine if not m.wd], default=0)
        want = {(m.sender, m.group): max(n.seq for n in msgs
                                         if (n.sender, n.group) == (m.sender, m.group))
                for m in msgs}
        assert {(u, g): seq for u, g, seq in s.reads} == want
        assert len(s.reads) == len(want)
