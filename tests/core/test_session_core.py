"""The sans-I/O session core: frames in, actions out (gateway/ws/session.py's decisions)."""

from __future__ import annotations

import orjson
import pytest

from gateway import frames
from gateway import protocol as p
from gateway.errors import ProtocolError
from gateway.ws.core import (
    Accepted,
    Close,
    Inline,
    Reply,
    SessionCore,
    SessionLimits,
    Spawn,
    UserBudgets,
)

LIMITS = SessionLimits(max_body=64, bad_frame_limit=3, send_rate=2.0, send_burst=2)
SEND = '{"op":"send","id":1,"to":"bob","cmid":"c1","body":"hi"}'
GROUP_SEND = '{"op":"group_send","id":2,"group":"g1","cmid":"c2","body":"hi"}'


def core(limits: SessionLimits = LIMITS) -> SessionCore:
    return SessionCore(limits, now=100.0)


def error_reply(code: str, message: str, re: object = None) -> Reply:
    return Reply(frames.error(ProtocolError(code, message, re)), code)


# -- bad frames -------------------------------------------------------------------


def test_unparsable_frame_is_refused_without_re():
    c = core()
    assert c.receive("not json", 100.0) == [error_reply("bad_request", "frame is not valid JSON")]
    assert c.bad_frames == 1


def test_refusal_carries_re_when_the_id_was_readable():
    [reply] = core().receive('{"op":"nope","id":"r1"}', 100.0)
    assert isinstance(reply, Reply) and reply.error == "bad_request"
    assert orjson.loads(reply.data) == {"op": "error", "code": "bad_request",
                                        "message": "unknown op 'nope'", "re": "r1"}


def test_too_large_body_is_a_bad_frame_with_its_own_code():
    c = core()
    [reply] = c.receive('{"op":"send","id":3,"to":"bob","cmid":"c","body":"' + "x" * 80 + '"}',
                        100.0)
    assert isinstance(reply, Reply) and reply.error == "too_large"
    assert orjson.loads(reply.data)["re"] == 3
    assert c.bad_frames == 1


def test_close_1008_at_the_bad_frame_limit():
    c = core()
    assert len(c.receive("[]", 100.0)) == 1
    assert len(c.receive(b"{", 100.0)) == 1
    actions = c.receive("1", 100.0)
    assert actions == [error_reply("bad_request", "frame must be a JSON object"),
                       Close(1008, "too many bad frames", "bad_frames")]
    assert c.bad_frames == 3


def test_bad_frames_close_once_and_good_frames_do_not_reset():
    c = core(SessionLimits(64, 2, 1.0, 1))
    c.receive("x", 100.0)
    assert c.receive('{"op":"ping"}', 100.0)[0] == Accepted("ping")
    assert c.bad_frames == 1  # a valid frame does not forgive
    assert c.receive("x", 100.0)[-1] == Close(1008, "too many bad frames", "bad_frames")
    # Frames buffered before the close are not judged again: one close.
    assert c.receive("x", 100.0) == [] and c.bad_frames == 2


def test_limit_of_one_closes_on_the_first_bad_frame():
    c = core(SessionLimits(64, 1, 1.0, 1))
    assert isinstance(c.receive("x", 100.0)[-1], Close)


# -- sends and the token bucket ---------------------------------------------------------


def test_send_and_group_send_spawn_with_their_op_labels():
    c = core()
    assert c.receive(SEND, 100.0) == [Accepted("send"),
                                      Spawn("send", p.Send(1, "bob", "c1", b"\"hi\""))]
    assert c.receive(GROUP_SEND, 100.0) == [
        Accepted("groupsend"), Spawn("group_send", p.GroupSend(2, "g1", "c2", b"\"hi\""))]


def test_sends_share_one_bucket_and_are_refused_when_it_is_empty():
    c = core()  # burst 2, 2 per second
    c.receive(SEND, 100.0)
    c.receive(GROUP_SEND, 100.0)
    assert c.receive(SEND, 100.0) == [Accepted("send"),
                                      error_reply("rate_limited", "too many sends", 1)]
    assert c.receive(GROUP_SEND, 100.0)[1] == error_reply("rate_limited", "too many sends", 2)
    assert c.bad_frames == 0  # a refused send is not a bad frame
    assert c.receive(SEND, 100.5) == [Accepted("send"),
                                      Spawn("send", p.Send(1, "bob", "c1", b"\"hi\""))]
    assert isinstance(c.receive(SEND, 100.5)[1], Reply)


def test_rate_limited_reply_without_an_id_has_no_re():
    c = core(SessionLimits(64, 3, 1.0, 0))
    [_, reply] = c.receive('{"op":"send","to":"bob","cmid":"c","body":1}', 100.0)
    assert isinstance(reply, Reply)
    assert orjson.loads(reply.data) == {"op": "error", "code": "rate_limited",
                                        "message": "too many sends"}


def test_the_bucket_starts_at_the_clock_it_is_given():
    c = SessionCore(SessionLimits(64, 3, 1.0, 1), now=50.0)
    assert isinstance(c.receive(SEND, 50.0)[1], Spawn)
    assert isinstance(c.receive(SEND, 50.5)[1], Reply)  # half a token
    assert isinstance(c.receive(SEND, 51.0)[1], Spawn)


def test_room_send_is_inline_and_takes_no_send_token():
    c = core(SessionLimits(64, 3, 1.0, 0))  # no send tokens at all
    frame = '{"op":"room_send","id":5,"room":"r","body":"x","prio":1}'
    assert c.receive(frame, 100.0) == [Accepted("roomsend"),
                                       Inline("room_send", p.RoomSend(5, "r", b"\"x\"", 1))]


# -- the other ops ---------------------------------------------------------------------------


@pytest.mark.parametrize(("data", "op", "label", "frame"), [
    ('{"op":"read","id":1,"conv":"bob","mid":5}', "read", "read", p.Read(1, "bob", 5)),
    ('{"op":"recv_ack","mids":[1,2]}', "recv_ack", "recvack", p.RecvAck(None, (1, 2))),
    ('{"op":"join","id":"j","room":"r"}', "join", "join", p.Join("j", "r")),
    ('{"op":"leave","room":"r"}', "leave", "leave", p.Leave(None, "r")),
    ('{"op":"recall","id":2,"mid":9}', "recall", "recall", p.Recall(2, 9)),
    ('{"op":"typing","conv":"bob"}', "typing", "typing", p.Typing(None, "bob")),
    ('{"op":"refresh","id":3,"token":"t"}', "refresh", "refresh", p.Refresh(3, "t")),
    ('{"op":"presence_sub","users":["a"]}', "presence_sub", "presencesub",
     p.PresenceSub(None, ("a",), True)),
    ('{"op":"presence_unsub","users":["a"]}', "presence_unsub", "presencesub",
     p.PresenceSub(None, ("a",), False)),
])
def test_task_ops_spawn(data, op, label, frame):
    c = core(SessionLimits(64, 3, 1.0, 0))  # none of them needs a send token
    assert c.receive(data, 100.0) == [Accepted(label), Spawn(op, frame)]


@pytest.mark.parametrize(("data", "wire"), [
    ('{"op":"ping","id":"x"}', b'{"op":"pong","re":"x"}'),
    ('{"op":"ping","id":7}', b'{"op":"pong","re":7}'),
    ('{"op":"ping"}', b'{"op":"pong"}'),
    (b'{"op":"ping","id":null}', b'{"op":"pong"}'),
])
def test_ping_is_answered_at_once(data, wire):
    assert core().receive(data, 100.0) == [Accepted("ping"), Reply(wire)]


def test_every_op_in_the_table_has_a_handler_in_the_session():
    from gateway.ws.session import Sessions

    served = {name for name, op in p.OPS.items() if op.run != "core"}
    assert served == {name[3:] for name in dir(Sessions) if name.startswith("op_")}
    assert [name for name, op in p.OPS.items() if op.run == "core"] == ["ping"]


def test_the_table_says_which_ops_spend_the_send_budget_and_run_at_once():
    assert {n for n, op in p.OPS.items() if op.budget == "send"} == {"send", "group_send"}
    assert {n for n, op in p.OPS.items() if op.run == "now"} == {"room_send"}


def test_actions_are_frozen():
    with pytest.raises(AttributeError):
        Close(1008, "x", "y").code = 1000  # type: ignore[misc]
    with pytest.raises(AttributeError):
        LIMITS.max_body = 1  # type: ignore[misc]


# -- budgets (a flood must not hurt anyone else) --------------------------------------------

BUDGET = SessionLimits(max_body=64, bad_frame_limit=3, send_rate=100.0, send_burst=100,
                       op_rate=10.0, op_burst=5, refuse_rate=1.0, refuse_burst=3)
PING = '{"op":"ping","id":9}'


def test_every_op_spends_the_op_budget_and_is_refused_over_it():
    c = core(BUDGET)
    for _ in range(5):
        assert c.receive(PING, 100.0)[0] == Accepted("ping")
    assert c.receive(PING, 100.0) == [error_reply("rate_limited", "too many frames; slow down", 9)]
    assert c.receive(PING, 100.2)[0] == Accepted("ping")  # 0.2 s at 10/s: two tokens back


def test_a_connection_that_keeps_flooding_is_closed_with_1008():
    c = core(BUDGET)
    for _ in range(5):
        c.receive(PING, 100.0)
    refused = [c.receive(PING, 100.0) for _ in range(3)]
    assert all(r[0].error == "rate_limited" for r in refused)  # type: ignore[union-attr]
    assert c.receive(PING, 100.0) == [Close(1008, "flooding: too many frames over the budget",
                                            "flood")]
    # Closed once: frames that were already buffered get nothing, not a second close.
    assert c.closed and c.receive(PING, 200.0) == [] and c.receive("nope", 200.0) == []


def test_recv_ack_costs_by_its_mids():
    c = core(SessionLimits(max_body=64, bad_frame_limit=3, send_rate=1, send_burst=1,
                           op_rate=1.0, op_burst=20, refuse_rate=1.0, refuse_burst=3))
    ack = orjson.dumps({"op": "recv_ack", "id": 1, "mids": list(range(1, 101))})  # 11 tokens
    assert c.receive(ack, 100.0)[0] == Accepted("recvack")
    assert c.receive(ack, 100.0)[0].error == "rate_limited"  # type: ignore[union-attr]
    for _ in range(9):  # what is left (9 tokens) still buys nine pings
        assert c.receive(PING, 100.0)[0] == Accepted("ping")


def test_bad_frames_spend_the_budget_too():
    c = core(BUDGET)
    for _ in range(2):
        c.receive("nope", 100.0)
    for _ in range(3):
        c.receive(PING, 100.0)
    assert c.receive("nope", 100.0)[0].error == "rate_limited"  # type: ignore[union-attr]
    assert c.bad_frames == 2  # refused for the budget, not counted as a bad frame


def test_sends_over_their_budget_also_spend_refusals():
    c = core(SessionLimits(max_body=64, bad_frame_limit=3, send_rate=0.0, send_burst=1,
                           op_rate=1000.0, op_burst=1000, refuse_rate=0.0, refuse_burst=2))
    assert isinstance(c.receive(SEND, 100.0)[1], Spawn)
    assert c.receive(SEND, 100.0)[1].error == "rate_limited"  # type: ignore[union-attr]
    assert c.receive(SEND, 100.0)[1].error == "rate_limited"  # type: ignore[union-attr]
    assert c.receive(SEND, 100.0)[1] == Close(1008, "flooding: too many sends over the budget",
                                              "flood")


def test_a_users_connections_share_one_budget_while_any_is_open():
    budgets = UserBudgets(LIMITS)
    one, two = budgets.acquire("alice", 0.0), budgets.acquire("alice", 0.0)
    assert one is two and len(budgets) == 1
    c1, c2 = SessionCore(LIMITS, 0.0, one), SessionCore(LIMITS, 0.0, two)
    assert isinstance(c1.receive(SEND, 0.0)[1], Spawn)
    assert isinstance(c2.receive(SEND, 0.0)[1], Spawn)
    over = c1.receive(SEND, 0.0)[-1]  # the burst of 2 is the user's, not each connection's
    assert isinstance(over, Reply) and over.error == "rate_limited"
    assert budgets.acquire("bob", 0.0) is not one  # another user's is its own
    budgets.release("alice")
    assert budgets.acquire("alice", 0.0) is one  # still held by a connection
    budgets.release("alice")
    budgets.release("alice")
    assert budgets.acquire("alice", 0.0) is not one  # all closed: a fresh one
