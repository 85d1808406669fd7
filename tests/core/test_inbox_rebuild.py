"""The 1:1 conversation list and unread rebuilt from box entries, pure."""

from __future__ import annotations

from core.inbox_rebuild import RebuiltConv, legacy_marks, rebuild_convs, unread_candidates

# (mid, conv, sent by the owner); in any order, as a store returns them.
ENTRIES = [
    (10, "bob", False), (11, "bob", True), (12, "bob", False), (13, "bob", False),
    (20, "carol", False), (21, "carol", False),
    (30, "dan", True),
    (35, "g:team", False),  # a write-diffused group's entry: not a 1:1 conversation
    (5, "erin", False),
]


def test_rows_newest_first_with_unread_after_the_read_mark():
    rows = rebuild_convs(ENTRIES, {"bob": 12, "carol": 21}, (), convs_max=10, unread_cap=99)
    assert rows == [
        RebuiltConv("dan", 30, ()),  # only sent: nothing unread
        RebuiltConv("carol", 21, ()),  # read up to its last
        RebuiltConv("bob", 13, (13,)),  # 10 and 12 read; 11 is the owner's own
        RebuiltConv("erin", 5, (5,)),  # never read
    ]


def test_recalled_messages_are_last_but_never_unread():
    rows = rebuild_convs(ENTRIES, {}, {13, 21}, convs_max=10, unread_cap=99)
    by_conv = {r.conv: r for r in rows}
    assert by_conv["bob"] == RebuiltConv("bob", 13, (10, 12))  # 13 stays the last (a tombstone)
    assert by_conv["carol"].unread == (20,)


def test_caps_keep_the_newest_conversations_and_unread():
    rows = rebuild_convs(ENTRIES, {}, (), convs_max=2, unread_cap=2)
    assert [r.conv for r in rows] == ["dan", "carol"]  # bob and erin are forgotten
    rows = rebuild_convs(ENTRIES, {}, (), convs_max=10, unread_cap=2)
    assert {r.conv: r.unread for r in rows}["bob"] == (12, 13)


def test_candidates_are_the_received_mids_after_each_mark():
    assert sorted(unread_candidates(ENTRIES, {"bob": 12})) == [5, 13, 20, 21]


def test_no_entries_no_rows_and_duplicates_count_once():
    assert rebuild_convs([], {}, (), 10, 10) == []
    twice = [(7, "bob", False), (7, "bob", False)]
    assert rebuild_convs(twice, {}, (), 10, 10) == [RebuiltConv("bob", 7, (7,))]


def test_marks_of_a_version_without_them_come_from_its_unread_keys():
    entries = [(10, "alice", False), (11, "alice", False), (12, "alice", False),
               (20, "bob", False), (21, "bob", True), (30, "carol", False)]
    # The old version counted alice (2 unread, the oldest 11) and bob (none).
    marks = legacy_marks({"*", "alice", "bob"}, {"alice": 11}, entries,
                         ["alice", "bob", "carol"])
    assert marks == {"alice": 10, "bob": 21, "carol": 30}
    # A user the old version left nothing for: no marks made up (all unread).
    assert legacy_marks(set(), {}, entries, ["alice"]) == {}
