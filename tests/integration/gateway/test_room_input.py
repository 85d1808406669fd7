"""Bad room input on a real node: a clear error, the connection survives,
no membership, no count and no traffic left behind."""

from __future__ import annotations

import pytest

from tests.conftest import uid


@pytest.mark.parametrize("frame, code", [
    ('{"op":"join","id":1}', "bad_request"),
    ('{"op":"join","id":1,"room":"has space"}', "bad_request"),
    ('{"op":"join","id":1,"room":{"$ne":null}}', "bad_request"),
    ('{"op":"join","id":1,"room":"' + "r" * 65 + '"}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","history":101}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","history":true}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","since":{"epoch":"e"}}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","since":{"epoch":"","pos":1}}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","since":{"epoch":"e","pos":-1}}', "bad_request"),
    ('{"op":"join","id":1,"room":"r1","since":[1,2]}', "bad_request"),
    ('{"op":"leave","id":1,"room":7}', "bad_request"),
    ('{"op":"room_send","id":1,"room":"r1"}', "bad_request"),
    ('{"op":"room_send","id":1,"room":"r1","body":1,"prio":2}', "bad_request"),
    ('{"op":"room_send","id":1,"room":"r1","body":"' + "x" * 5000 + '"}', "too_large"),
    ('{"op":"room_send","id":1,"room":"r1","body":1}', "forbidden"),  # not a member
])
async def test_bad_room_frames_get_their_error(node, connect, frame, code):
    c = await connect(node, uid())
    await c.send_raw(frame)
    err = await c.next_push()
    assert err["op"] == "error" and err["code"] == code and err["re"] == 1, err
    assert (await c.request("ping"))["op"] == "pong"  # the connection survives
    # No member, no binding, nothing sent (a login's presence envelope is not room traffic).
    assert node.app.room_hub.memberships == 0 and node.app.live.snapshot()["bound"] == 0
    assert node.metrics.room_sends.labels("accepted")._value.get() == 0


async def test_room_send_rate_limit_per_user(make_node, connect):
    node = await make_node(room_send_rate=0.01, room_send_burst=3)
    user, room = uid(), uid("room")
    a, b = await connect(node, user), await connect(node, user)  # two devices, one bucket
    await a.request("join", room=room)
    await b.request("join", room=room)
    codes = [(await d.request("room_send", room=room, body=i))["op"]
             for i, d in enumerate([a, b, a, b])]
    assert codes == ["ok", "ok", "ok", "error"]
    err = await b.request("room_send", room=room, body="again")
    assert err["code"] == "rate_limited"
    text = node.metrics.render().decode()
    assert 'im_room_sends_total{outcome="rate_limited"} 2.0' in text


async def test_rooms_per_connection_are_bounded(make_node, connect):
    node = await make_node(room_max_per_conn=2)
    c = await connect(node, uid())
    rooms = [uid("room") for _ in range(3)]
    assert (await c.request("join", room=rooms[0]))["op"] == "joined"
    assert (await c.request("join", room=rooms[1]))["op"] == "joined"
    assert (await c.request("join", room=rooms[1]))["online"] == 1  # rejoin: no change
    err = await c.request("join", room=rooms[2])
    assert err["code"] == "forbidden" and "at most 2 rooms" in err["message"]
    assert node.app.room_hub.count(rooms[2]) == 0
    assert (await c.request("leave", room=rooms[0]))["op"] == "left"
    assert (await c.request("leave", room=rooms[0]))["op"] == "left"  # idempotent
    assert (await c.request("join", room=rooms[2]))["op"] == "joined"


async def test_room_count_http_errors(node, http):
    assert (await http(uid()).get("/v1/rooms/bad$room")).status_code == 400
    r = await http(uid()).get(f"/v1/rooms/{'r' * 65}")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as anon:
        r = await anon.get("/v1/rooms/r1")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert (await http(uid()).get(f"/v1/rooms/{uid('room')}")).json()["online"] == 0
