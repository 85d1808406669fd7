"""testkit.nemesis's checks over a recorded history, without servers: a clean
history passes; a duplicate (delivered, or in the store), a reorder, a lost
message, a double ack, a silent room jump (but not one told by ``room_gap``
or an unrecovered rejoin), a deaf push and a wrong unread count are each
found, with the fault near them."""

from __future__ import annotations

import random
from collections import Counter

from testkit.nemesis.checks import (
    check_deaf,
    check_group_history,
    check_messages,
    check_stored,
    fault_report,
)
from testkit.nemesis.history import Conn, History, Send, User
from testkit.nemesis.room_checks import silent_room_gaps, tail_gaps
from testkit.nemesis.schedule import Fault
from testkit.nemesis.unread_checks import plan_unread, unread_mismatches


def world(faults: list[Fault] | None = None) -> tuple[History, User, User]:
    """Two users, a -> b (a ring of two), both connected from t=0 to the end,
    in one group "g"."""
    a, b = User("a", 0, peer="b"), User("b", 1, peer="a")
    for u in (a, b):
        u.conns[1] = Conn(1, 0, t_open=0.0)
        u.groups.append("g")
    h = History([a, b], [], {"g": ["a", "b"]}, faults or [], t0=0.0, clock=lambda: 100.0)
    return h, a, b


def sent(sender: User, receiver: User | None, k: int, mid: int, t: float = 1.0,
         kind: str = "dm", seq: int | None = None, pushed: bool = True) -> Send:
    """``sender``'s k-th send, acked 0.1 s later, delivered to ``receiver`` (by
    push on its connection 1 when ``pushed``; None: delivered nowhere)."""
    to = "g" if kind == "group" else sender.peer
    cmid = f"{sender.name}-{kind}-{to}-{k}"
    s = sender.sends[cmid] = Send(cmid, kind, to, k, t, t + 0.1, mid, seq, 0)
    sender.raw_acks[cmid].add(mid)
    if receiver is not None:
        op = "group_msg" if kind == "group" else "msg"
        receiver.delivered[mid].append(("push" if pushed else "sync", t + 0.2, 1))
        receiver.frames[mid] = {"op": op, "mid": mid, "from": sender.name, "group": to,
                                "seq": seq, "body": {"c": cmid, "k": k}}
        if pushed:
            receiver.pushes[1][mid] = t + 0.2
    return s


def clean() -> tuple[History, User, User]:
    h, a, b = world()
    sent(a, b, 0, 10, t=1.0)
    sent(a, b, 1, 12, t=2.0)
    sent(b, a, 0, 11, t=1.5)
    sent(a, b, 0, 13, t=2.5, kind="group", seq=1)
    return h, a, b


def test_a_clean_history_passes():
    h, a, b = clean()
    b.room_log += [(1.0, "joined", ({"epoch": "e1", "pos": 0}, [])),
                   (2.0, "msgs:live", ("e1", [1, 2])), (3.0, "msgs:live", ("e1", [3]))]
    msgs = check_messages(h)
    assert [msgs[k] for k in ("lost", "duplicated", "reordered", "double_acked")] == [0] * 4
    deaf = check_deaf(h)
    assert deaf["deaf_pushes"] == 0 and deaf["pushes_owed"] == 4
    silent, streams = silent_room_gaps(h)
    assert silent == [] and streams["b"] == {"told": 0, "msgs": 3}
    history = check_group_history(h, {("g", "a"): Counter(), ("g", "b"): Counter({1: 1})})
    assert history["history_missing"] == 0 and history["history_duplicated"] == 0


def test_a_duplicate_is_found_by_mid_and_by_cmid():
    h, a, b = clean()
    b.delivered[10].append(("sync", 5.0, 2))  # the SDK gave mid 10 twice
    b.synced = [{"op": "msg", "mid": 99, "from": "a", "body": {"c": "a-dm-b-1"}}]  # a 2nd mid
    msgs = check_messages(h)
    assert msgs["duplicated"] == 2
    assert {"user": "b", "mid": 10, "deliveries": 2} in msgs["details"]["duplicated"]
    assert {"user": "b", "from": "a", "cmid": "a-dm-b-1",
            "mids": [12, 99]} in msgs["details"]["duplicated"]


def test_the_store_holding_two_mids_for_one_cmid_or_one_seq_is_found():
    clean_store = {"by_cmid": {("a", "c1"): {10}, ("a", "c2"): {11}},
                   "by_seq": {("g", 1): {11}}}
    assert check_stored(clean_store)["stored_duplicated"] == 0
    twice = {"by_cmid": {("a", "c1"): {10, 12}, ("a", "c2"): {11}},
             "by_seq": {("g", 1): {11, 13}}}
    got = check_stored(twice)
    assert got["stored_duplicated"] == 2
    assert {"from": "a", "cmid": "c1", "mids": [10, 12]} in got["details_stored_duplicated"]
    assert {"group": "g", "seq": 1, "mids": [11, 13]} in got["details_stored_duplicated"]


def test_a_reorder_and_a_double_ack_are_found():
    h, a, b = world()
    sent(a, b, 0, 20, t=1.0)
    sent(a, b, 1, 15, t=2.0)  # sent after, acked with a lower mid
    a.raw_acks["a-dm-b-1"].add(21)
    msgs = check_messages(h)
    assert msgs["reordered"] == 1 and msgs["double_acked"] == 1
    assert msgs["details"]["reordered"][0]["mids"] == [20, 15]
    assert msgs["details"]["double_acked"][0] == {"user": "a", "cmid": "a-dm-b-1",
                                                  "mids": [15, 21]}


def test_a_lost_message_names_the_fault_near_it():
    h, a, b = world([Fault("redis", 5, 2, t_start=5.0, t_heal=7.0)])
    sent(a, None, 0, 10, t=6.0)
    msgs = check_messages(h)
    assert msgs["lost"] == 1
    lost = msgs["details"]["lost"][0]
    assert (lost["to"], lost["mid"], lost["fault"]) == ("b", 10, ["redis@5.0"])
    b.synced_mids.add(10)  # the final sync has it: not lost
    assert check_messages(h)["lost"] == 0


def test_a_silent_pos_jump_is_a_gap_unless_told():
    h, _, b = world()
    b.room_log += [(1.0, "joined", ({"epoch": "e1", "pos": 1}, [])),
                   (2.0, "msgs:live", ("e1", [2, 4]))]  # 3 skipped, nobody said so
    silent, _ = silent_room_gaps(h)
    assert silent == [{"user": "b", "epoch": "e1", "after": 2, "got": 4, "t": 2.0,
                       "how": "msgs:live", "fault": []}]

    b.room_log[1:] = [(2.0, "msgs:live", ("e1", [2])), (2.5, "gap", {"epoch": "e1"}),
                      (3.0, "msgs:live", ("e1", [4]))]
    silent, streams = silent_room_gaps(h)
    assert silent == [] and streams["b"] == {"told": 1, "msgs": 2}


def test_a_rejoin_that_skips_positions_is_silent_unless_unrecovered():
    h, _, b = world()
    joined: tuple[float, str, object] = (1.0, "joined", ({"epoch": "e1", "pos": 3}, []))
    b.room_log += [joined, (2.0, "rejoined", (True, {"epoch": "e1", "pos": 6, "msgs": []}))]
    silent, _ = silent_room_gaps(h)
    assert len(silent) == 1 and silent[0]["how"] == "rejoin said recovered"
    assert silent[0]["room_pos"] == 6

    b.room_log[1:] = [(2.0, "rejoined", (False, {"epoch": "e1", "pos": 6, "msgs": []}))]
    assert silent_room_gaps(h)[0] == []
    # A new epoch must start at 1.
    b.room_log[1:] = [(2.0, "msgs:live", ("e2", [2]))]
    assert silent_room_gaps(h)[0][0]["got"] == 2


def test_a_member_behind_at_the_end_is_a_tail_gap():
    gaps = tail_gaps([{"user": "b", "epoch": "e1", "pos": 4}], {"epoch": "e1", "pos": 6})
    assert gaps == [{"user": "b", "tail": True, "room_epoch": "e1", "room_pos": 6,
                     "member_epoch": "e1", "member_pos": 4}]


def test_a_deaf_push_is_found_and_only_when_owed():
    h, a, b = world()
    sent(a, b, 0, 10, t=1.0, pushed=False)  # delivered by sync, never pushed
    deaf = check_deaf(h)
    assert deaf["deaf_pushes"] == 1 and deaf["details_deaf"][0]["gen"] == 1
    b.conns[1].t_close = 3.0  # gone before the push was due (ack + 3 s): not owed
    assert check_deaf(h) == {"deaf_pushes": 0, "pushes_owed": 0, "pushes_lost_with_node": 0,
                             "details_deaf": []}


def test_a_push_lost_with_its_node_killed_at_the_ack_is_counted_apart():
    # sent() acks at t + 0.1 = 1.1 on node 0: a kill -9 of node 0 at 1.12 is in the window
    h, a, b = world([Fault("kill9", 1.12, 2, 0, t_start=1.12, t_heal=3.12)])
    sent(a, b, 0, 10, t=1.0, pushed=False)
    got = check_deaf(h)
    assert (got["deaf_pushes"], got["pushes_lost_with_node"]) == (0, 1)
    h.faults[0].t_start = 1.3  # well after the ack: the push had left; deaf
    got = check_deaf(h)
    assert (got["deaf_pushes"], got["pushes_lost_with_node"]) == (1, 0)


def test_a_fault_over_the_send_moves_when_the_push_is_owed():
    h, a, b = world([Fault("broker_cut", 0.5, 5, 0, t_start=0.5, t_heal=5.5)])
    sent(a, b, 0, 10, t=1.0, pushed=False)
    b.conns[1].t_close = 6.0  # after ack + 3 s, before heal + 3 s
    assert check_deaf(h)["pushes_owed"] == 0
    b.conns[1].t_close = 9.0
    assert check_deaf(h)["deaf_pushes"] == 1


class FirstPick(random.Random):
    """Reads up to the first message of each conversation."""

    def randrange(self, *args, **kwargs) -> int:  # type: ignore[override]
        return 0


def test_unread_counts_survive_a_redis_loss():
    """A user's unread is rebuilt from MongoDB once Redis lost it: every message
    after the read mark counts, whenever it was acked."""
    h, a, b = world([Fault("redis", 5, 2, t_start=5.0, t_heal=7.0)])
    for k, t in enumerate((1.0, 2.0, 6.0, 8.0, 9.0)):  # before, before, during, after, after
        sent(a, b, k, 10 + k, t=t)
    plan_b = plan_unread(h, FirstPick(), counters={"g": (0, 0)})[1]
    assert plan_b.reads == {"a": 10}
    assert plan_b.expect["a"] == (4, 4) and plan_b.ambiguous == 0
    ok = {"conversations": [{"conv": "a", "unread": 4}], "total_unread": 4}
    assert unread_mismatches(plan_b, ok) == []
    bad = {"conversations": [{"conv": "a", "unread": 5}, {"conv": "x", "unread": 1}],
           "total_unread": 5}
    wrong = unread_mismatches(plan_b, bad)
    assert [w.get("conv") for w in wrong] == ["a", "x", None]
    assert wrong[0]["expected"] == 4 and wrong[2]["sum_of_convs"] == 6


def test_own_group_messages_before_a_redis_loss_may_count_as_read():
    """A member's own group messages are read; their read seq reaches MongoDB
    a moment after Redis (best effort), so past a Redis loss those acked
    before it may count as unread, those acked after it may not."""
    h, a, b = world([Fault("redis", 5, 2, t_start=5.0, t_heal=7.0)])
    sent(a, b, 0, 10, t=1.0, kind="group", seq=1)
    sent(b, a, 0, 11, t=2.0, kind="group", seq=2)  # b's own, before the loss
    sent(a, b, 1, 12, t=3.0, kind="group", seq=3)
    sent(b, a, 1, 13, t=8.0, kind="group", seq=4)  # b's own, after it
    sent(a, b, 2, 14, t=9.0, kind="group", seq=5)
    plan_b = plan_unread(h, FirstPick(), counters={"g": (5, 5)})[1]
    assert plan_b.reads["g:g"] == 10  # read up to a's first (seq 1)
    assert plan_b.expect["g:g"] == (1, 1)  # seq 5 only: 4 is b's own, after the loss
    sent(b, a, 2, 15, t=9.5, kind="group", seq=6)  # ... unless b wrote last after it
    plan_b = plan_unread(h, FirstPick(), counters={"g": (6, 6)})[1]
    assert plan_b.expect["g:g"] == (0, 0)
    h, a, b = world([Fault("redis", 5, 2, t_start=5.0, t_heal=7.0)])
    sent(a, b, 0, 10, t=1.0, kind="group", seq=1)
    sent(a, b, 1, 11, t=2.0, kind="group", seq=2)
    sent(b, a, 0, 12, t=3.0, kind="group", seq=3)  # b's own, before the loss
    plan_b = plan_unread(h, FirstPick(), counters={"g": (3, 3)})[1]
    assert plan_b.expect["g:g"] == (0, 2)  # 2 and 3 unread unless seq 3's read reached MongoDB
    # Seqs 4 and 5 taken by sends never stored: they may count.
    plan_b = plan_unread(h, FirstPick(), counters={"g": (3, 5)})[1]
    assert plan_b.expect["g:g"] == (0, 4)


def test_a_send_never_acked_may_count():
    # Stored, its ack lost, never resent: it is in the receiver's box all the same.
    h, a, b = world([])
    sent(a, b, 0, 10, t=1.0)
    lost = sent(a, b, 1, 11, t=2.0)
    lost.mid = lost.t_ack = None
    sent(a, b, 2, 12, t=3.0)
    plan_b = plan_unread(h, FirstPick(), counters={"g": (0, 0)})[1]
    assert plan_b.expect["a"] == (1, 2) and plan_b.ambiguous == 1


def test_the_fault_report_times_the_heal_by_the_first_success_after_it():
    h, a, b = world([Fault("redis", 5, 2, t_start=5.0, t_heal=7.0)])
    sent(a, b, 0, 10, t=6.0)  # acked at 6.1: during
    sent(a, b, 1, 11, t=7.4)  # acked at 7.5: the first after the heal
    [f] = fault_report(h)
    assert (f["acks_during"], f["acks_after"], f["heal_s"]) == (1, 1, 0.5)
    assert f["heal_path"] == "first 1:1 or group ack, any node"
