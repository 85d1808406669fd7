"""Frame validation: pure, no servers."""

from __future__ import annotations

import orjson
import pytest

from core.ids import MAX_MID
from gateway.errors import ProtocolError
from gateway.frames import error as error_frame
from gateway.protocol import (
    Ping,
    Read,
    RecvAck,
    RoomSend,
    Send,
    check_id,
    parse_frame,
)


def refused(data: str | bytes, code: str = "bad_request", max_body: int = 4096) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_frame(data, max_body)
    assert info.value.code == code
    return info.value


def test_send_parses():
    f = parse_frame('{"op":"send","id":7,"to":"bob","cmid":"c-1","body":{"t":"hi"}}', 4096)
    assert f == Send(7, "bob", "c-1", b'{"t":"hi"}')  # the body as encoded JSON bytes


def test_ping_read_recv_ack_room_send_parse():
    assert parse_frame('{"op":"ping","id":"x"}', 10) == Ping("x")
    assert parse_frame('{"op":"read","conv":"bob","mid":5}', 10) == Read(None, "bob", 5)
    assert parse_frame('{"op":"recv_ack","mids":[1,2]}', 10) == RecvAck(None, (1, 2))
    assert parse_frame('{"op":"room_send","room":"r","body":1,"prio":1}', 10) == RoomSend(
        None, "r", b"1", 1)


@pytest.mark.parametrize("data", ["{", "not json", b"\xff\xfe", "", "[1,2]", '"op"', "null"])
def test_malformed_frames(data):
    refused(data)


def test_unknown_and_missing_op_keep_request_id():
    assert refused('{"op":"fly","id":3}').re == 3
    assert "unknown op" in refused('{"op":"fly"}').message
    assert refused('{"id":4}').re == 4
    refused('{"op":5}')


@pytest.mark.parametrize("frame", [
    '{"op":"send","cmid":"c","body":1}',                    # no to
    '{"op":"send","to":"bob","body":1}',                     # no cmid
    '{"op":"send","to":"bob","cmid":"c"}',                   # no body
    '{"op":"send","to":5,"cmid":"c","body":1}',              # wrong type
    '{"op":"send","to":"bob","cmid":["c"],"body":1}',
    '{"op":"send","to":{"$ne":null},"cmid":"c","body":1}',   # operator where an id belongs
    '{"op":"send","to":{"$gt":""},"cmid":"c","body":1}',
    '{"op":"send","to":"bob smith","cmid":"c","body":1}',    # outside the pattern
    '{"op":"send","to":"bob{x}","cmid":"c","body":1}',
    '{"op":"send","to":"","cmid":"c","body":1}',
    '{"op":"read","conv":"bob","mid":-1}',
    '{"op":"read","conv":"bob","mid":1.5}',
    '{"op":"read","conv":"bob","mid":true}',
    '{"op":"read","conv":"bob","mid":"5"}',
    '{"op":"recv_ack","mids":[]}',
    '{"op":"recv_ack","mids":"1"}',
    '{"op":"recv_ack","mids":[1,"x"]}',
    '{"op":"room_send","room":"r","body":1,"prio":2}',
    '{"op":"room_send","room":"r","body":1,"prio":true}',
    '{"op":"ping","id":{"a":1}}',
    '{"op":"ping","id":true}',
])
def test_bad_fields(frame):
    refused(frame)


def test_id_pattern_bounds():
    assert check_id("a" * 64, "to") == "a" * 64
    assert check_id("A-z_0.9:x", "to") == "A-z_0.9:x"
    for bad in ("a" * 65, "a\n", "ü", "a/b", "a b", None, 3, ["a"], {"$ne": 1}):
        with pytest.raises(ProtocolError):
            check_id(bad, "to")


def test_mid_bounds():
    read = f'{{"op":"read","conv":"b","mid":{MAX_MID}}}'
    assert parse_frame(read, 10) == Read(None, "b", MAX_MID)
    refused(f'{{"op":"read","conv":"b","mid":{MAX_MID + 1}}}')


def test_body_over_limit_is_too_large():
    err = refused('{"op":"send","id":1,"to":"b","cmid":"c","body":"' + "x" * 100 + '"}',
                  code="too_large", max_body=50)
    assert err.re == 1 and "50" in err.message


def test_error_frame_carries_re_only_when_known():
    assert error_frame(ProtocolError("bad_request", "m", 9)) == (
        b'{"op":"error","code":"bad_request","message":"m","re":9}')
    assert b'"re"' not in error_frame(ProtocolError("bad_request", "m"))


@pytest.mark.parametrize("body", [
    "9223372036854775808",           # 2**63: past BSON's 8-byte integers
    "18446744073709551615",          # 2**64 - 1
    '{"a\\u0000b": 1}',              # NUL in a key: BSON refuses it
    '{"$where": "1", "a.b": [{"$gt": 0}]}',
])
def test_bodies_a_document_store_cannot_hold_are_carried_as_bytes(body):
    f = parse_frame('{"op":"send","to":"b","cmid":"c","body":' + body + "}", 4096)
    assert isinstance(f, Send)
    assert orjson.loads(f.body) == orjson.loads(body)  # the same JSON, as bytes


@pytest.mark.parametrize(("text", "rid"), [
    ('{"op":"send","id":"a","to":"b","cmid":"c","body":"\\ud800"}', "a"),
    ('{"op":"send","id":7,"to":"b","cmid":"c","body":{"k":"\\udfff x"}}', 7),
    ('{"op":"send","id":"\\ud800","body":"\\udc00"}', None),  # the id itself: not echoed
])
def test_a_lone_surrogate_is_refused_naming_the_request(text, rid):
    with pytest.raises(ProtocolError) as exc:
        parse_frame(text, 1000)
    assert exc.value.code == "bad_request" and exc.value.re == rid
    assert "lone surrogate" in exc.value.message


@pytest.mark.parametrize(("text", "rid", "says"), [
    ('{"op":"ping","id":18446744073709551616,"x":"\\ud800"}', None, "lone surrogate"),
    ('{"id":-9223372036854775809,"\\ud800":null}', None, "lone surrogate"),
    ('{"op":"ping","id":1,"x":1e400}', 1, "out of range"),
    ('{"op":"ping","id":"q","x":[-1e999]}', "q", "out of range"),
])
def test_an_error_names_only_an_id_a_reply_can_carry(text, rid, says):
    with pytest.raises(ProtocolError) as exc:
        parse_frame(text, 1000)
    assert exc.value.re == rid and says in exc.value.message
    orjson.dumps({"op": "error", "re": exc.value.re})  # writable
