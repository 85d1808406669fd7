"""The SDK's sans-I/O core, without a server: frames and tokens, the in-flight send
table, dedup by mid and sync paging, recv_ack batching, room positions and the
rejoin recipe, the reconnect policy."""

from __future__ import annotations

import asyncio
import base64
import random

import orjson
import pytest
from imgate_client.core import (
    AckBatcher,
    Action,
    Backoff,
    Inbox,
    Outbox,
    Outcome,
    ReconnectPolicy,
    RequestIds,
    Rooms,
    RoomState,
    decode,
    encode,
    error_of,
    is_id,
    make,
    new_cmid,
    token_expiry,
    token_user,
    with_token,
)
from imgate_client.http import HttpClient, HttpError


def jwt_of(claims: dict) -> str:
    def part(obj: dict) -> str:
        return base64.urlsafe_b64encode(orjson.dumps(obj)).rstrip(b"=").decode()

    return f"{part({'alg': 'HS256'})}.{part(claims)}.sig"


# -- frames ---------------------------------------------------------------------------
def test_frames_round_trip_and_errors():
    f = make("send", "r1", to="b", cmid="c", body={"x": 1})
    assert f == {"op": "send", "id": "r1", "to": "b", "cmid": "c", "body": {"x": 1}}
    assert decode(encode(f)) == f
    assert "id" not in make("typing", conv="b")
    with pytest.raises(ValueError):
        decode(b"[1, 2]")
    assert error_of({"op": "error", "code": "forbidden", "message": "no"}) == ("forbidden", "no")
    assert error_of({"op": "ack"}) is None


def test_ids_and_cmids():
    ids = RequestIds("q")
    assert [ids.next(), ids.next()] == ["q1", "q2"]
    cmids = {new_cmid() for _ in range(1000)}
    assert len(cmids) == 1000 and all(is_id(c) for c in cmids)
    assert not is_id("a b") and not is_id("x" * 65) and not is_id(3)


def test_token_claims_are_read_without_the_key():
    t = jwt_of({"sub": "alice", "exp": 1700000000})
    assert token_user(t) == "alice" and token_expiry(t) == 1700000000.0
    assert token_user("not-a-jwt") is None and token_expiry("a.b!.c") is None
    assert token_expiry(jwt_of({"sub": "a", "exp": True})) is None


# -- outbox -------------------------------------------------------------------------------
def test_a_send_is_written_once_per_connection_until_acked():
    ob = Outbox(ack_timeout=10)
    p = ob.add("send", {"to": "b", "body": 1}, cmid="c1")
    assert [x.cmid for x in ob.due(gen=1, now=0)] == ["c1"]
    f1 = ob.write(p, 1, 0)
    assert f1["cmid"] == "c1" and f1["op"] == "send" and f1["to"] == "b"
    assert ob.due(1, 5) == []  # written on this connection, not overdue
    # A reconnect: due again, same cmid, a new request id.
    [again] = ob.due(2, 6)
    f2 = ob.write(again, 2, 6)
    assert f2["cmid"] == "c1" and f2["id"] != f1["id"] and p.attempts == 2
    # The ack of the first frame (it was stored before the link broke) settles it.
    got = ob.on_reply({"op": "ack", "re": f1["id"], "cmid": "c1", "mid": 7, "ts": 1}, 7)
    assert got == (p, Outcome.ACKED) and len(ob) == 0
    assert ob.on_reply({"op": "ack", "re": f2["id"], "cmid": "c1", "mid": 7}, 8) is None


def test_ack_timeout_unavailable_and_refusals():
    ob = Outbox(ack_timeout=10, retry_base=1, retry_cap=4, rng=random.Random(1))
    p = ob.add("group_send", {"group": "g", "body": "x"})
    f = ob.write(p, 1, 0)
    assert ob.next_deadline() == 10
    assert ob.due(1, 10) == [p]  # overdue: written again on the same connection
    # unavailable: retried later, with jitter within [delay/2, delay]
    assert ob.on_reply({"op": "error", "re": f["id"], "code": "unavailable"}, 20)[1] \
        is Outcome.RETRY
    assert p.retry_at is not None and 20.5 <= p.retry_at <= 21
    assert ob.due(1, 20.4) == [] and ob.due(2, 20.4) == []  # even a new connection waits
    assert ob.due(1, 21) == [p]
    f = ob.write(p, 1, 21)
    got = ob.on_reply({"op": "error", "re": f["id"], "code": "forbidden"}, 22)
    assert got == (p, Outcome.FAILED) and p.cmid not in ob


def test_resends_are_told_apart_and_unanswered_sends_counted():
    ob = Outbox(ack_timeout=10, retry_base=1, retry_cap=4, rng=random.Random(1))
    p = ob.add("send", {"to": "b", "body": 1}, cmid="c1")
    assert ob.unanswered(1) == 0  # not written yet
    ob.write(p, 1, 0)
    assert ob.unanswered(1) == 1 and ob.unanswered(2) == 0
    ob.write(p, 1, 10)  # the ack timeout: same connection, no answer
    assert (p.attempts, p.timeouts, p.refusals) == (2, 1, 0)
    ob.write(p, 2, 11)  # a reconnect: neither
    assert (p.attempts, p.timeouts) == (3, 1) and ob.unanswered(1) == 0
    f = ob.write(p, 2, 21)  # overdue again on connection 2
    ob.on_reply({"op": "error", "re": f["id"], "code": "unavailable"}, 22)
    assert ob.unanswered(2) == 0  # answered: waits for its retry, not for an answer
    ob.write(p, 2, 23)  # after the refusal: not a timeout
    assert (p.attempts, p.timeouts, p.refusals) == (5, 2, 1)


def test_outbox_refuses_a_cmid_in_flight_and_bad_ops():
    ob = Outbox()
    ob.add("send", {"to": "b", "body": 1}, cmid="same")
    with pytest.raises(ValueError):
        ob.add("send", {"to": "b", "body": 2}, cmid="same")
    with pytest.raises(ValueError):
        ob.add("room_send", {})
    assert ob.remove("same") is not None and ob.remove("same") is None


# -- inbox ----------------------------------------------------------------------------------
def msg(mid: int, op: str = "msg") -> dict:
    return {"op": op, "mid": mid, "from": "a", "to": "b", "body": mid}


def test_each_mid_is_delivered_once_by_push_or_sync():
    ib = Inbox(since=10)
    assert ib.push(msg(5)) is None  # at or below the cursor: a sync had it
    assert ib.push(msg(12)) == msg(12) and ib.push(msg(12)) is None
    assert ib.push({"op": "typing"}) is None
    ib.begin_sync()
    assert ib.push(msg(20)) is None  # held while syncing
    assert ib.push(msg(14)) is None
    out, more = ib.on_sync_page({"msgs": [msg(11), msg(12), msg(13)], "next": 13,
                                 "more": True})
    assert [m["mid"] for m in out] == [11, 13] and more and ib.cursor == 13
    out, more = ib.on_sync_page({"msgs": [msg(14)], "next": 14, "more": False})
    assert [m["mid"] for m in out] == [14] and not more
    assert [m["mid"] for m in ib.end_sync()] == [20]  # 14 came by sync already
    assert ib.seen(12) and ib.seen(20) and not ib.seen(21)
    assert ib.remembered == 1  # only 20 is above the cursor


def test_pushes_about_a_message_held_during_a_sync_come_after_the_messages():
    ib = Inbox(since=0)
    edited = {"op": "edited", "mid": 20, "conv": "a", "body": "new", "edited": 1}
    reaction = {"op": "reaction", "mid": 20, "conv": "a", "from": "b", "emoji": "+1",
                "on": True}
    assert ib.hold(edited) is False  # no sync under way: told now
    ib.begin_sync()
    assert ib.push(msg(20)) is None  # held
    assert ib.hold(edited) and ib.hold(reaction) and ib.hold({"op": "recalled", "mid": 20})
    assert ib.hold({"op": "typing", "conv": "a"}) is False  # not about a stored message
    ib.on_sync_page({"msgs": [msg(10)], "next": 10, "more": False})
    assert [m["mid"] for m in ib.end_sync()] == [20]
    assert [f["op"] for f in ib.after_sync()] == ["edited", "reaction", "recalled"]
    assert ib.after_sync() == [] and ib.hold(edited) is False


def test_each_edit_and_recall_is_told_once_and_a_sync_tells_what_changed_while_away():
    ib = Inbox(since=0, window=6)
    ib.push(msg(10))  # from "a" to "b": delivered by push, so the cursor stays below it
    ib.push({**msg(11), "edited": 500})  # delivered edited already
    group = {"op": "group_msg", "mid": 12, "seq": 1, "group": "g1", "from": "c", "body": 1}
    ib.push(group)
    edit = {"op": "edited", "mid": 10, "conv": "a", "body": "new", "edited": 600}
    assert ib.update(edit) and not ib.update(edit)  # told once
    assert not ib.update({**edit, "edited": 550})  # older than the one told
    assert not ib.update({"op": "edited", "mid": 11, "edited": 500})  # the message had it
    assert ib.update({"op": "reaction", "mid": 10}) and ib.update({"op": "reaction", "mid": 10})
    ib.fresh(9)  # as the client's own sent message is
    # A sync brings them again: 9 unchanged, 10 as told, 11 edited again, 12 edited, 13 new.
    ib.begin_sync()
    out, _ = ib.on_sync_page({"msgs": [
        msg(9), {**msg(10), "body": "new", "edited": 600},
        {**msg(11), "body": "v2", "edited": 700}, {**group, "body": 2, "edited": 800},
        msg(13)], "next": 13, "more": False})
    assert [m["mid"] for m in out] == [13]
    assert ib.changes("b") == [
        {"op": "edited", "mid": 11, "conv": "a", "body": "v2", "edited": 700},
        {"op": "edited", "mid": 12, "conv": "g:g1", "body": 2, "edited": 800}]
    assert ib.changes("b") == []
    assert ib.end_sync() == [] and ib.after_sync() == []
    assert not ib.update({"op": "edited", "mid": 12, "edited": 800})  # the sync told it
    # Recalled while away: told once, from the tombstone (conv: from the sender's side).
    ib.begin_sync()
    tomb = {"op": "msg", "mid": 11, "from": "a", "to": "b", "ts": 1, "recalled": True}
    ib.on_sync_page({"msgs": [tomb], "next": 13, "more": False})
    ib.on_sync_page({"msgs": [tomb], "next": 13, "more": False})
    assert ib.changes("a") == [{"op": "recalled", "mid": 11, "conv": "b", "by": "a"}]
    ib.end_sync()
    assert not ib.update({"op": "recalled", "mid": 11, "conv": "a", "by": "a"})
    # A page read before the recall, edited: not told after the recall.
    ib.on_sync_page({"msgs": [{**msg(11), "edited": 900}], "next": 13, "more": False})
    assert ib.changes("b") == []
    # Bounded: a mid forgotten from the window is forgotten here too.
    for mid in range(20, 26):
        ib.fresh(mid)
    assert not ib._edited and not ib._recalled
    assert ib.update({"op": "edited", "mid": 99, "edited": 1})  # never delivered: told
    assert ib.update({"op": "edited", "mid": 99, "edited": 1}) and 99 not in ib._edited


def test_a_message_stored_late_below_the_cursor_is_delivered_by_its_push_once():
    ib = Inbox(since=0)
    ib.begin_sync()
    out, _ = ib.on_sync_page({"msgs": [msg(10), msg(12)], "next": 13, "more": False})
    assert [m["mid"] for m in out] == [10, 12] and ib.cursor == 13
    assert ib.end_sync() == []
    # 11 was in flight when the sync passed it (its send stalled): its push comes late.
    assert ib.push(msg(11)) == msg(11) and ib.push(msg(11)) is None
    assert ib.push(msg(12)) is None  # delivered by the sync: a repeat
    assert ib.push(msg(9)) is None  # older than anything remembered: taken for a repeat
    assert ib.remembered == 0  # none above the cursor


def test_a_page_that_does_not_move_ends_the_sync():
    ib = Inbox()
    ib.begin_sync()
    _, more = ib.on_sync_page({"msgs": [], "next": 0, "more": True})
    assert more is False
    assert ib.sync_params(50) == {"since": 0, "limit": 50, "changes": 1}


def test_the_dedup_window_is_bounded_and_asks_for_a_sync():
    ib = Inbox(window=10)
    for mid in range(1, 5):
        ib.fresh(mid)
    assert not ib.wants_sync
    ib.fresh(5)
    assert ib.wants_sync
    for mid in range(6, 16):
        ib.fresh(mid)
    assert ib.remembered == 10 and ib.evicted == 5 and not ib.seen(1) and ib.seen(15)


def test_recv_acks_are_batched():
    ab = AckBatcher(batch=3, delay=0.2)
    assert ab.add(1, now=100) is False and ab.deadline == pytest.approx(100.2)
    assert ab.add(2, now=100.1) is False and ab.deadline == pytest.approx(100.2)
    assert ab.add(3) is True
    assert ab.frame() == {"op": "recv_ack", "mids": [1, 2, 3]}
    assert ab.frame() is None and ab.deadline is None
    big = AckBatcher(batch=5000, max_pending=1500)
    for mid in range(1600):
        big.add(mid)
    assert big.dropped == 100 and len(big.take()) == 1000 and len(big) == 500


# -- rooms ------------------------------------------------------------------------------------
def rm(*positions: int, epoch: str = "e1", room: str = "r") -> dict:
    return {"op": "room_msgs", "room": room, "epoch": epoch,
            "msgs": [{"from": "a", "body": p, "ts": 1, "pos": p} for p in positions]}


def joined(pos: int, epoch: str | None = "e1", msgs=(), **kw) -> dict:
    return {"op": "joined", "re": "r1", "room": "r", "online": 2, "users": 2, "epoch": epoch,
            "pos": pos, "msgs": [{"from": "a", "body": p, "pos": p} for p in msgs], **kw}


def test_first_join_then_rejoin_with_since_and_dedup_by_pos():
    rooms = Rooms()
    assert rooms.join_fields("r", history=5) == {"room": "r", "history": 5}
    j = rooms.on_joined("r", joined(3, msgs=[1, 2, 3]), since_sent=False)
    assert [m["pos"] for m in j.msgs] == [1, 2, 3] and j.recovered is None and j.online == 2
    assert rooms.on_room_msgs(rm(3, 4, 5)) == ("r", rm(4, 5)["msgs"])  # 3: the overlap
    assert rooms.on_room_msgs(rm(4)) == ("r", [])  # late or repeated
    assert rooms.on_room_msgs(rm(1, room="other")) is None
    # After a reconnect: since the highest position shown.
    assert rooms.join_fields("r") == {"room": "r", "since": {"epoch": "e1", "pos": 5}}
    j = rooms.on_joined("r", joined(7, msgs=[6, 7], recovered=True), since_sent=True)
    assert [m["pos"] for m in j.msgs] == [6, 7] and j.recovered is True
    j = rooms.on_joined("r", joined(9, msgs=[9], recovered=False), since_sent=True)
    assert j.recovered is False and [m["pos"] for m in j.msgs] == [9]


def test_frames_before_the_joined_reply_come_after_its_messages():
    st = RoomState("r", history=10)
    st.join_fields()
    assert st.on_frame(rm(11, 12)) == []  # held: the reply is not here yet
    j = st.on_joined(joined(11, msgs=[9, 10, 11]), since_sent=False)
    assert [m["pos"] for m in j.msgs] == [9, 10, 11, 12]


def test_a_new_epoch_starts_positions_over():
    st = RoomState("r")
    st.join_fields()
    st.on_joined(joined(0, epoch=None), since_sent=False)  # no message yet
    assert st.join_fields() == {"room": "r", "history": 100}  # a rejoin, still no epoch
    st.on_joined(joined(0, epoch=None), since_sent=False)
    assert [m["pos"] for m in st.on_frame(rm(1, 2))] == [1, 2]
    assert [m["pos"] for m in st.on_frame(rm(1, epoch="e2"))] == [1]  # the room lost its state
    assert st.epoch == "e2" and st.pos == 1


def test_recovered_without_since():
    st = RoomState("r")
    st.join_fields()
    st.on_joined(joined(0, epoch=None), since_sent=False)
    st.join_fields()
    assert st.on_joined(joined(0, epoch=None), since_sent=False).recovered is True
    st2 = RoomState("r")
    st2.join_fields()
    st2.on_joined(joined(0, epoch=None), since_sent=False)
    st2.join_fields()
    j = st2.on_joined(joined(3, msgs=[1, 2, 3]), since_sent=False)
    assert j.recovered is True and len(j.msgs) == 3
    st3 = RoomState("r")
    st3.join_fields()
    st3.on_joined(joined(0, epoch=None), since_sent=False)
    st3.join_fields()
    assert st3.on_joined(joined(300, msgs=[201, 300]), since_sent=False).recovered is False


def test_keep_late_counts_a_late_message_once():
    st = RoomState("r", keep_late=True, window=8)
    st.join_fields()
    st.on_joined(joined(0, epoch=None), since_sent=False)
    assert [m["pos"] for m in st.on_frame(rm(1, 3))] == [1, 3]
    assert [m["pos"] for m in st.on_frame(rm(2, 3))] == [2]  # late: shown; 3 again: not
    for p in range(4, 30):
        st.on_frame(rm(p))
    assert len(st._seen) <= 8 and st.on_frame(rm(5)) == []


def test_a_refused_join_drops_its_held_frames():
    st = RoomState("r")
    st.join_fields()
    st.on_frame(rm(1))
    st.on_join_failed()
    assert [m["pos"] for m in st.on_frame(rm(2))] == [2]


# -- policy ----------------------------------------------------------------------------------
def test_close_codes():
    pol = ReconnectPolicy(rng=random.Random(0), move_jitter=0.5)
    assert pol.on_close(4003, 0).action is Action.STOP
    assert pol.on_close(4005, 0).action is Action.STOP  # replaced: reconnecting takes it back
    assert pol.on_close(4001, 0).action is Action.REFRESH
    d = pol.on_close(1001, 0)
    assert d.action is Action.MOVE and 0 <= d.delay <= 0.5
    assert pol.on_close(1000, 0, told_to_move=True).action is Action.MOVE
    assert pol.on_close(None, 0).action is Action.RETRY
    assert pol.on_close(1011, 0).action is Action.RETRY
    assert pol.on_refused(403).action is Action.STOP
    assert pol.on_refused(429).action is Action.RETRY
    assert pol.on_refused(None).action is Action.RETRY


def test_repeated_401s_stop():
    pol = ReconnectPolicy(max_refusals=2)
    assert [pol.on_refused(401).action for _ in range(3)] == [
        Action.REFRESH, Action.REFRESH, Action.STOP]
    pol.on_open(0)  # a connection resets the count
    assert pol.on_refused(401).action is Action.REFRESH


def test_backoff_grows_with_jitter_and_resets_after_a_stable_connection():
    b = Backoff(base=1, cap=8, rng=random.Random(3))
    delays = [b.next() for _ in range(6)]
    for d, full in zip(delays, [1, 2, 4, 8, 8, 8], strict=True):
        assert full / 2 <= d <= full
    pol = ReconnectPolicy(Backoff(base=1, cap=8), stable_s=5)
    for _ in range(4):
        pol.on_close(None, 0)
    pol.on_open(10)
    assert pol.on_close(None, 12).delay >= 8 / 2  # up 2 s: not stable, still backing off
    pol.on_open(20)
    assert pol.on_close(None, 30).delay <= 1  # up 10 s: starts over


def test_with_token_and_a_join_that_does_not_hold():
    assert with_token("/ws", "a.b-c") == "/ws?token=a.b-c"
    assert with_token("ws://h/ws?x=1", "t+/") == "ws://h/ws?x=1&token=t%2B%2F"
    assert with_token("/ws", None) == "/ws"
    st = RoomState("r", keep_late=True)
    assert st.join_fields(rejoin_history=0, hold=False) == {"room": "r"}
    assert [m["pos"] for m in st.on_frame(rm(4))] == [4]  # counted as it comes
    st.on_joined(joined(4, msgs=[3, 4]), since_sent=False)
    st.on_joined(joined(0, epoch=None), since_sent=False)  # the room lost its state
    assert st.join_fields(rejoin_history=0) == {"room": "r"}  # no history asked


# -- the HTTP client, against a stub server -------------------------------------------
def test_http_client_reads_chunked_and_sized_answers_on_one_connection():
    async def run() -> None:
        conns: list[int] = []
        answers = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\n{\"a\":\r\n3\r\n 1}\r\n0\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 47\r\n\r\n"
            b'{"error":{"code":"not_found","message":"gone"}}',
        ]

        async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            conns.append(1)
            for answer in answers:
                head = await r.readuntil(b"\r\n\r\n")
                n = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await r.readexactly(n)
                w.write(answer)
                await w.drain()
            w.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        h = HttpClient(f"http://127.0.0.1:{port}", timeout=5)
        try:
            assert await h.json("POST", "/x", json={"q": 1}) == {"a": 1}
            with pytest.raises(HttpError) as err:
                await h.json("GET", "/y", params={"since": 0})
            assert (err.value.status, err.value.code, err.value.message) == (
                404, "not_found", "gone")
            assert len(conns) == 1  # kept alive
        finally:
            await h.close()
            server.close()
            await server.wait_closed()

    loop = asyncio.new_event_loop()  # its own loop: the suite's stays the current one
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def test_http_a_node_closing_before_answering_is_an_oserror():
    """The documented OSError (a sync retries on it), never asyncio's
    IncompleteReadError: that one once stopped the client's connection loop."""
    async def run() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.close()  # no answer

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        h = HttpClient(f"http://127.0.0.1:{port}", timeout=5)
        try:
            with pytest.raises(ConnectionError):
                await h.json("GET", "/v1/sync", params={"since": 0})
        finally:
            await h.close()
            server.close()
            await server.wait_closed()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(run())
    finally:
        loop.close()


def test_client_next_url_chooses_where_to_reconnect_and_failed_opens_say_so():
    from imgate_client import Client, ConnectionLost
    from imgate_client.core import Backoff, ReconnectPolicy

    async def run() -> list[ConnectionLost]:
        closed = []  # two ports nothing listens on
        for _ in range(2):
            srv = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
            closed.append(srv.sockets[0].getsockname()[1])
            srv.close()
            await srv.wait_closed()
        urls = [f"ws://127.0.0.1:{port}/ws" for port in closed]
        lost: list[ConnectionLost] = []
        seen: list[int] = []

        def next_url(i: int) -> int:
            seen.append(i)
            return 0  # stay on the first URL
        c = Client(urls, token=jwt_of({"sub": "a"}), next_url=next_url,
                   on_event=lambda ev: lost.append(ev) if isinstance(ev, ConnectionLost)
                   else None,
                   policy=ReconnectPolicy(Backoff(base=0.01, cap=0.01)))
        with pytest.raises(TimeoutError):
            await c.connect(timeout=0.3)
        await c.close()
        assert seen and set(seen) == {0}
        return lost

    lost = asyncio.run(run())
    assert len(lost) >= 2 and {ev.url for ev in lost} == {lost[0].url}
    assert all(not ev.opened and ev.unanswered == 0 and ev.action == "retry" for ev in lost)
