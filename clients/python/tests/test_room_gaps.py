"""Gaps in a room's positions, in the sans-I/O core (no server): a jump in ``pos``
is recovered with a join ``since`` the last contiguous position, the hole is
filled in order, what cannot be recovered is told as a ``RoomGap``; ``room_gap``
frames; dedup; one recovery in flight; the rate limit and the off switch."""

from __future__ import annotations

from imgate_client.core import RoomGap, RoomOut, Rooms, RoomState


def rm(*positions: int, epoch: str = "e1", room: str = "r") -> dict:
    return {"op": "room_msgs", "room": room, "epoch": epoch,
            "msgs": [{"from": "a", "body": p, "ts": 1, "pos": p} for p in positions]}


def gap_frame(after: int, epoch: str = "e1", room: str = "r") -> dict:
    return {"op": "room_gap", "room": room, "epoch": epoch, "after": after}


def joined(pos: int, epoch: str | None = "e1", msgs=(), **kw) -> dict:
    return {"op": "joined", "re": "r1", "room": "r", "online": 1, "users": 1, "epoch": epoch,
            "pos": pos, "msgs": [{"from": "a", "body": p, "pos": p} for p in msgs], **kw}


def shown(items) -> list:
    """Messages as their pos, gaps as ("gap", after, missing, reason)."""
    return [("gap", i.after, i.missing, i.reason) if isinstance(i, RoomGap) else i["pos"]
            for i in items]


def member(**kw) -> RoomState:
    """A room joined at position 3 of epoch e1."""
    st = RoomState("r", **kw)
    st.join_fields()
    st.on_joined(joined(3), since_sent=False)
    return st


def test_a_contiguous_stream_goes_straight_through():
    st = member()
    out = st.on_push(rm(4, 5), 0.0)
    assert shown(out.items) == [4, 5] and out.recover is None
    out = st.on_push(rm(6), 0.1)
    assert shown(out.items) == [6] and out.recover is None and not st.recovering
    assert st.pos == 6


def test_a_jump_rejoins_since_the_last_contiguous_position_and_is_filled_in_order():
    st = member()
    out = st.on_push(rm(4, 7, 8), 0.0)
    assert shown(out.items) == [4]  # before the hole: shown; after it: waits
    assert out.recover == {"room": "r", "since": {"epoch": "e1", "pos": 4}}
    assert st.recovering and st.pos == 4
    # Frames that come while the recovery is in flight wait too (and start no other).
    later = st.on_push(rm(9, 11), 0.1)
    assert later.items == [] and later.recover is None
    j = st.on_joined(joined(11, msgs=[5, 6, 7, 8, 9, 10, 11], recovered=True), True, 0.2)
    assert shown(j.items) == [5, 6, 7, 8, 9, 10, 11] and j.gaps == [] and j.recover is None
    assert not st.recovering and st.pos == 11
    assert shown(st.on_push(rm(11, 12), 0.3).items) == [12]


def test_not_recovered_is_told_as_a_gap_before_what_follows_the_hole():
    st = member()
    out = st.on_push(rm(4, 20), 0.0)
    assert out.recover == {"room": "r", "since": {"epoch": "e1", "pos": 4}}
    # 5..14 were trimmed: only 15..20 are kept.
    j = st.on_joined(joined(20, msgs=range(15, 21), recovered=False), True, 0.1)
    gap = j.gaps[0]
    assert gap == RoomGap("r", "e1", 4, ((5, 14),), (15, 16, 17, 18, 19, 20), "not_kept")
    assert gap.count == 10
    assert shown(j.items) == [("gap", 4, ((5, 14),), "not_kept"), 15, 16, 17, 18, 19, 20]


def test_another_epoch_in_the_reply_is_a_gap_of_unknown_size():
    st = member()
    st.on_push(rm(4, 9), 0.0)
    j = st.on_joined(joined(2, epoch="e2", msgs=[1, 2], recovered=False), True, 0.1)
    assert shown(j.items) == [("gap", 4, (), "epoch"), 1, 2]
    assert j.gaps[0].epoch == "e1" and st.epoch == "e2" and st.pos == 2


def test_a_room_gap_frame_is_recovered_from_after():
    st = member()
    st.on_push(rm(4, 5), 0.0)
    out = st.on_push(gap_frame(5), 0.1)
    assert out.items == [] and out.recover == {"room": "r", "since": {"epoch": "e1", "pos": 5}}
    assert st.on_push(rm(9, 10), 0.2).items == []  # what follows the hole waits
    j = st.on_joined(joined(10, msgs=[8, 9, 10], recovered=False), True, 0.3)
    assert shown(j.items) == [("gap", 5, ((6, 7),), "not_kept"), 8, 9, 10]
    assert j.gaps[0].recovered == (8, 9, 10)
    # Fully kept: no gap at all.
    out = st.on_push(gap_frame(10), 0.4)
    j = st.on_joined(joined(12, msgs=[11, 12], recovered=True), True, 0.5)
    assert shown(j.items) == [11, 12]


def test_a_room_gap_frame_is_acted_on_even_when_off_or_rate_limited():
    st = member(recover_jumps=False)
    assert st.on_push(gap_frame(3), 0.0).recover is not None
    st.on_joined(joined(3, recovered=True), True, 0.0)
    st2 = member()
    assert st2.on_push(rm(5), 0.0).recover is not None  # an automatic recovery ...
    st2.on_joined(joined(5, msgs=[4, 5], recovered=True), True, 0.0)
    assert st2.on_push(gap_frame(5), 0.1).recover is not None  # ... and room_gap right after


def test_a_room_gap_during_a_recovery_is_recovered_again_once_the_answer_is_in():
    st = member()
    st.on_push(rm(6), 0.0)
    assert st.on_push(gap_frame(8), 0.1).recover is None  # one in flight: waits
    j = st.on_joined(joined(8, msgs=[4, 5, 6, 7, 8], recovered=True), True, 0.2)
    assert shown(j.items) == [4, 5, 6, 7, 8]
    assert j.recover == {"room": "r", "since": {"epoch": "e1", "pos": 8}}  # from the lowest missing
    j = st.on_joined(joined(10, msgs=[9, 10], recovered=True), True, 0.3)
    assert shown(j.items) == [9, 10] and j.recover is None


def test_each_position_is_shown_once():
    st = member()
    seen: list[int] = []
    for frame in (rm(2, 3, 4), rm(4, 5), rm(5)):  # the overlap at the join, repeats
        seen += [i["pos"] for i in st.on_push(frame, 0.0).msgs]
    out = st.on_push(rm(5, 8), 0.0)
    seen += [i["pos"] for i in out.msgs]
    st.on_push(rm(7, 8), 0.1)  # part of the hole comes late, while recovering
    j = st.on_joined(joined(8, msgs=[5, 6, 7, 8], recovered=True), True, 0.2)
    seen += [i["pos"] for i in j.msgs]
    seen += [i["pos"] for i in st.on_push(rm(6, 8, 9), 0.3).msgs]
    assert seen == [4, 5, 6, 7, 8, 9]


def test_automatic_recoveries_are_rate_limited_per_room():
    st = member(recover_interval=2.0)
    assert st.on_push(rm(5), 0.0).recover is not None
    st.on_joined(joined(5, msgs=[4, 5], recovered=True), True, 0.1)
    out = st.on_push(rm(7), 1.0)  # a second jump within 2 s: told, shown, not recovered
    assert out.recover is None
    assert shown(out.items) == [("gap", 5, ((6, 6),), "rate_limited"), 7]
    out = st.on_push(rm(9), 2.5)  # 2 s after the first: recovered again
    assert out.recover == {"room": "r", "since": {"epoch": "e1", "pos": 7}}
    # Rooms are limited one by one.
    rooms = Rooms(recover_interval=2.0)
    for room in ("a", "b"):
        rooms.join_fields(room)
        rooms.on_joined(room, {**joined(1), "room": room}, False)
    for room in ("a", "b"):
        got = rooms.on_push(rm(3, room=room), 0.0)
        assert isinstance(got, RoomOut) and got.recover is not None


def test_the_off_switch_per_room_and_per_client():
    st = member(recover_jumps=False)
    out = st.on_push(rm(4, 6, 9), 0.0)
    assert out.recover is None
    assert shown(out.items) == [4, ("gap", 4, ((5, 5),), "off"), 6, ("gap", 6, ((7, 8),), "off"), 9]
    rooms = Rooms(recover_jumps=False)
    rooms.join_fields("r")
    rooms.on_joined("r", joined(1), False)
    got = rooms.on_push(rm(3), 0.0)
    assert got is not None and got.recover is None and got.gaps[0].reason == "off"
    rooms.join_fields("r", recover_jumps=True)  # this room: on again
    rooms.on_joined("r", joined(3, recovered=True), True)
    got = rooms.on_push(rm(5), 0.0)
    assert got is not None and got.recover is not None
    assert rooms.on_push(rm(1, room="other"), 0.0) is None


def test_a_failed_recovery_shows_what_waited_after_a_gap():
    st = member()
    st.on_push(rm(6, 7), 0.0)
    out = st.on_recovery_failed(0.5)
    assert shown(out.items) == [("gap", 3, ((4, 5),), "failed"), 6, 7]
    assert not st.recovering and st.pos == 7
    # A room_gap whose recovery failed: the next jump is told as failed, not recovered.
    st.on_push(gap_frame(7), 1.0)
    assert st.on_recovery_failed(1.1).items == []
    out = st.on_push(rm(10), 5.0)
    assert out.recover is None and shown(out.items) == [("gap", 7, ((8, 9),), "failed"), 10]
    out = st.on_push(rm(12), 9.0)  # later jumps: recovered as usual
    assert out.recover is not None


def test_a_recovery_cut_by_the_connection_goes_on_with_the_rejoin():
    st = member()
    st.on_push(rm(4, 7), 0.0)
    st.on_recovery_lost()
    assert st.join_fields() == {"room": "r", "since": {"epoch": "e1", "pos": 4}}
    st.on_push(rm(8), 0.1)  # on the new connection, before the reply
    j = st.on_joined(joined(8, msgs=[5, 6, 7, 8], recovered=True), True, 0.2)
    assert shown(j.items) == [5, 6, 7, 8] and j.recovered is True


def test_a_new_epoch_whose_first_position_is_not_1_is_a_jump_too():
    st = member()
    out = st.on_push(rm(3, epoch="e2"), 0.0)
    assert out.recover == {"room": "r", "since": {"epoch": "e2", "pos": 0}}
    j = st.on_joined(joined(3, epoch="e2", msgs=[1, 2, 3], recovered=True), True, 0.1)
    assert shown(j.items) == [1, 2, 3]


def test_keep_late_and_positionless_rooms_are_left_alone():
    st = RoomState("r", keep_late=True)
    st.join_fields(hold=False)
    st.on_joined(joined(1), since_sent=False)
    out = st.on_push(rm(5, 3), 0.0)
    assert shown(out.items) == [5, 3] and out.recover is None
    off = RoomState("r")
    off.join_fields()
    off.on_joined({"op": "joined", "room": "r", "online": 1, "users": 1}, since_sent=False)
    out = off.on_push({"op": "room_msgs", "room": "r", "msgs": [{"body": 1}, {"body": 2}]}, 0.0)
    assert [m["body"] for m in out.msgs] == [1, 2] and out.recover is None
