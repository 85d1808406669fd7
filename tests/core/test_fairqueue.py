from __future__ import annotations

from core.fairqueue import FairQueue


def test_keys_take_turns_and_keep_their_order():
    q: FairQueue[str, str] = FairQueue(max_total=100, max_per_key=100)
    for i in range(5):
        q.put("flood", f"f{i}")
    q.put("quiet", "q0")
    q.put("other", "o0")
    assert q.batch(4) == ["f0", "q0", "o0", "f1"]
    assert q.batch(10) == ["f0", "q0", "o0", "f1", "f2", "f3", "f4"]
    assert len(q) == 7


def test_remove_done_takes_leading_items_per_key_and_rotates():
    q: FairQueue[str, int] = FairQueue(100, 100)
    for i in range(3):
        q.put("a", i)
    q.put("b", 10)
    sent = {0, 10, 2}  # 2 is not at a's head: it stays until 1 is done
    q.remove_done(lambda x: x in sent)
    assert len(q) == 2 and q.batch(5) == [1, 2]
    q.put("c", 20)
    q.remove_done(lambda x: False)  # nothing done: the same batch again, in order
    assert q.batch(5) == [1, 20, 2]
    q.remove_done(lambda x: x == 1)  # progress: the lead moves on
    assert q.batch(5) == [20, 2]


def test_bounded_in_all_and_per_key():
    q: FairQueue[str, int] = FairQueue(max_total=5, max_per_key=2)
    assert [q.put("a", i) for i in range(3)] == [True, True, False]
    assert [q.put(k, 0) for k in "bcd"] == [True, True, True]
    assert not q.put("e", 0) and len(q) == 5  # full in all
    q.remove_done(lambda x: True)
    assert len(q) == 0 and q.batch(3) == [] and q.put("a", 1)
