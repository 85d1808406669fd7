"""Group unread, the sync merge and the conversations merge, pure."""

from __future__ import annotations

import random

from core.inbox import (
    ConversationIndex,
    GroupRow,
    busy_groups,
    conversation_page,
    group_conversation_row,
    group_unread,
    merge_group_pages,
    merge_sync,
    newest,
)


def test_group_unread():
    assert group_unread(10, 4, 0) == 6
    assert group_unread(10, 4, 7) == 3  # joined at 7: older messages never count
    assert group_unread(10, 12, 0) == 0  # never negative
    assert group_unread(0, 0, 0) == 0


def test_group_row_shows_last_only_after_the_join():
    row = group_conversation_row("G", seq=10, lastmid=99, last=b"{}", from_seq=3, read_seq=8)
    assert row == GroupRow("g:G", 2, b"{}", 99)
    joined_after = group_conversation_row("G", 10, 99, b"{}", from_seq=10, read_seq=10)
    assert joined_after == GroupRow("g:G", 0, None, 0)  # sorts after every message


def test_group_row_without_a_last_message():
    assert group_conversation_row("G", 0, 0, None, 0, 0) == GroupRow("g:G", 0, None, 0)
    assert group_conversation_row("G", 5, 9, b"", 0, 0).last is None  # empty: absent, as today


def test_merge_sync_interleaves_and_cuts():
    rows = [(1, "a"), (4, "b"), (6, "c")]
    extra = [(2, {"g": 1}), (5, {"g": 2})]
    items, mids, more = merge_sync(rows, extra, 4)
    assert mids == [1, 2, 4, 5]
    assert items == ["a", {"g": 1}, "b", {"g": 2}]
    assert more
    assert merge_sync(rows, extra, 5)[2] is False
    assert merge_sync(rows, [], 3) == (["a", "b", "c"], [1, 4, 6], False)
    assert merge_sync([], [], 3) == ([], [], False)


def test_merge_sync_takes_rows_alone_as_they_came():
    # today's code sorts only when there are extra rows
    assert merge_sync([(5, "x"), (3, "y")], [], 10)[1] == [5, 3]


def test_merge_sync_equal_mids_keep_rows_first():
    assert merge_sync([(3, "row")], [(3, "extra")], 5)[0] == ["row", "extra"]


def test_merge_sync_matches_a_brute_force():
    rng = random.Random(30)
    for _ in range(300):
        pool = rng.sample(range(1000), rng.randrange(0, 40))
        rows = sorted((m, f"r{m}") for m in pool if m % 2)
        extra = sorted((m, f"e{m}") for m in pool if not m % 2)
        limit = rng.randrange(1, 30)
        items, mids, more = merge_sync(rows, extra, limit)
        everything = sorted(rows + extra)
        assert mids == [m for m, _ in everything][:limit]
        assert items == [i for _, i in everything][:limit]
        assert more == (len(everything) > limit)
        assert mids == sorted(set(mids))


def test_busy_groups_and_group_pages():
    assert busy_groups({"a": 5, "b": 10, "c": 0}, since=5) == ["b"]
    pages = [[(1, "a1"), (7, "a7")], [(3, "b3")], []]
    assert merge_group_pages(pages, 2) == [(1, "a1"), (3, "b3")]
    assert merge_group_pages(pages, 10) == [(1, "a1"), (3, "b3"), (7, "a7")]
    assert merge_group_pages([], 3) == []


def test_conversation_pages_follow_positions_newest_first():
    rows = [((9, "a"), "a"), ((5, "g:x"), "g:x"), ((7, "b"), "b"), ((0, "g:q"), "g:q"),
            ((0, "g:p"), "g:p")]
    page, after = conversation_page(rows, 2)
    assert page == ["a", "b"] and after == (7, "b")
    page, after = conversation_page(rows, 2, after)
    assert page == ["g:x", "g:q"] and after == (0, "g:q")
    page, after = conversation_page(rows, 2, after)  # groups without a message: by id
    assert page == ["g:p"] and after is None
    assert conversation_page(rows, 5) == (["a", "b", "g:x", "g:q", "g:p"], None)
    assert conversation_page([], 5) == ([], None)


def test_newest_takes_count_after_a_position():
    rows = [((m, str(m)), m) for m in range(10)]
    assert [r for _, r in newest(rows, 3)] == [9, 8, 7]
    assert [r for _, r in newest(rows, 3, (5, "5"))] == [4, 3, 2]


def test_group_unread_leaves_out_recalled_seqs_after_the_read():
    # seq 10, read up to 6: 7..10 unread; 8 and 3 recalled (3 was read anyway).
    assert group_unread(10, 6, 0, (3, 8)) == 3
    assert group_unread(10, 6, 8, (8, 9)) == 1  # joined at 8: only 9, 10; 9 recalled
    assert group_unread(10, 10, 0, (10,)) == 0


def test_a_conversation_index_pages_as_newest_does():
    rng = random.Random(7)
    rows = [((rng.choice([0, rng.randrange(1, 50)]), f"g:{i}"), i) for i in range(300)]
    index = ConversationIndex(rows)
    assert len(index) == 300
    after = None
    for count in (1, 7, 50, 300, 0):
        assert index.newest(count, after) == newest(rows, count, after)
        page = newest(rows, count, after)
        after = page[-1][0] if page else after
    assert index.newest(5, (0, "")) == [] and ConversationIndex([]).newest(3) == []


def test_a_conversation_index_takes_new_values_and_positions():
    index = ConversationIndex([((9, "a"), 1), ((5, "g:x"), 2), ((0, "g:q"), 3)])
    assert index.update("g:x", 0) == 2 and index.newest(3) == [
        ((9, "a"), 1), ((5, "g:x"), 0), ((0, "g:q"), 3)]
    assert index.update("g:q", 0, 12) == 3  # a message of its own: first now
    assert index.newest(3) == [((12, "g:q"), 0), ((9, "a"), 1), ((5, "g:x"), 0)]
    assert index.newest(2, (12, "g:q")) == [((9, "a"), 1), ((5, "g:x"), 0)]
    assert index.update("g:nope", 5, 3) is None and len(index) == 3
