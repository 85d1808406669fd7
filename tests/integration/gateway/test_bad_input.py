"""Bad input over the real node: a clear error, the connection survives, nothing stored."""

from __future__ import annotations

import asyncio
import time

import jwt
import orjson
import pytest
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import InvalidStatus

from tests.conftest import RUN_NS, SECRET, token, uid


async def nothing_stored(user, mongo_db, redis_client):
    assert await mongo_db.messages.count_documents({"$or": [{"from": user}, {"to": user}]}) == 0
    assert await mongo_db.boxes.count_documents({"owner": user}) == 0
    keys = [k async for k in redis_client.scan_iter(match=f"{RUN_NS}:*{{{user}}}*")]
    # A connected device has a route and a device entry (``dev``), its (empty)
    # group list is cached at connect, its presence is announced (``pr``), and
    # a disconnected one leaves its last-seen time; nothing else of the user
    # may exist.
    assert [k for k in keys
            if not any(t in k for t in (b":rt:", b":dev:", b":ug:", b":seen:", b":pr:"))] == []
    for k in keys:
        if b":ug:" in k:
            assert await redis_client.hgetall(k) == {b"~": b"1"}


BAD_FRAMES = [
    ("{not json", "bad_request"),
    ("[]", "bad_request"),
    ('{"op":"teleport","id":1}', "bad_request"),
    ('{"id":1}', "bad_request"),
    ('{"op":"send","id":1,"cmid":"c","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","cmid":"c"}', "bad_request"),
    ('{"op":"send","id":1,"to":42,"cmid":"c","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","cmid":7,"body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"has space","cmid":"c","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","cmid":"' + "c" * 65 + '","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":{"$ne":null},"cmid":"c","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","cmid":{"$gt":""},"body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"{peer}","cmid":"c","body":"' + "x" * 5000 + '"}', "too_large"),
    ('{"op":"send","id":1,"to":"{me}","cmid":"c","body":1}', "bad_request"),
    ('{"op":"send","id":1,"to":"g:grp","cmid":"c","body":1}', "bad_request"),
    ('{"op":"read","id":1,"conv":"{peer}","mid":"x"}', "bad_request"),
    ('{"op":"read","id":1,"conv":{"$ne":1},"mid":1}', "bad_request"),
    ('{"op":"recv_ack","id":1,"mids":["x"]}', "bad_request"),
]


@pytest.mark.parametrize(("template", "code"), BAD_FRAMES)
async def test_bad_frame_gets_error_and_connection_survives(
        template, code, node, connect, mongo_db, redis_client):
    me, peer = uid("me"), uid("peer")
    c = await connect(node, me)
    await c.send_raw(template.replace("{peer}", peer).replace("{me}", me))
    err = await c.next_push()
    assert err["op"] == "error" and err["code"] == code and err["message"]
    assert "Traceback" not in err["message"]
    assert (await c.request("ping"))["op"] == "pong"  # still open
    await nothing_stored(me, mongo_db, redis_client)
    await nothing_stored(peer, mongo_db, redis_client)


@pytest.mark.parametrize("rid", ["req-7", "x" * 64, 42, 0, -1, 2**63 - 1])
async def test_error_reply_carries_the_request_id(node, connect, rid):
    """``re`` is the frame's ``id`` as sent (a string of at most 64 characters or
    an integer, its type kept): read raw, not through the client's matching."""
    c = await connect(node, uid())
    await c.send_raw(orjson.dumps({"op": "send", "id": rid, "to": "x y", "cmid": "c",
                                   "body": 1}).decode())
    reply = await c.next_push()
    assert reply["op"] == "error" and reply["code"] == "bad_request", reply
    assert reply["re"] == rid and type(reply["re"]) is type(rid), reply


async def test_frame_over_size_limit_closes_1009(make_node, connect, mongo_db, redis_client):
    node = await make_node(max_frame=1024)
    me = uid()
    c = await connect(node, me)
    await c.send_raw(orjson.dumps({"op": "send", "to": "b", "cmid": "c",
                                   "body": "x" * 2000}).decode())
    await c.wait_closed()
    rcvd = c.ws.protocol.close_rcvd  # the close frame the node sent
    assert rcvd is not None and rcvd.code == 1009
    await nothing_stored(me, mongo_db, redis_client)


async def test_flood_of_bad_frames_closes_1008(make_node, connect):
    node = await make_node(bad_frame_limit=5)
    c = await connect(node, uid())
    for _ in range(5):
        await c.send_raw("nope")
    errors = [await c.next_push("error") for _ in range(5)]
    assert all(e["code"] == "bad_request" for e in errors)
    await asyncio.wait_for(c.ws.wait_closed(), 5)
    assert c.ws.close_code == 1008


async def test_sends_over_the_rate_limit_get_rate_limited(make_node, connect, mongo_db):
    node = await make_node(send_rate=0.001, send_burst=2)
    me = uid()
    c = await connect(node, me)
    replies = [await c.request("send", to="peer1", cmid=f"c{i}", body=i) for i in range(3)]
    assert [r["op"] for r in replies] == ["ack", "ack", "error"]
    assert replies[2]["code"] == "rate_limited"
    assert await mongo_db.messages.count_documents({"from": me}) == 2


@pytest.mark.parametrize("tok", [
    None, "", "garbage",
    jwt.encode({"sub": "u1", "exp": int(time.time()) - 5}, SECRET, "HS256"),
    jwt.encode({"sub": "u1", "exp": int(time.time()) + 60}, "another-secret-of-32-bytes-len!!",
               "HS256"),
    jwt.encode({"sub": "u1"}, SECRET, "HS256"),
])
async def test_bad_token_refuses_websocket_with_401(node, tok):
    url = f"ws://127.0.0.1:{node.ws_port}/ws" + ("" if tok is None else f"?token={tok}")
    with pytest.raises(InvalidStatus) as info:
        async with ws_connect(url):
            pass
    assert info.value.response.status_code == 401


async def test_bearer_header_authenticates_websocket(node):
    async with ws_connect(f"ws://127.0.0.1:{node.ws_port}/ws",
                          additional_headers={"Authorization": f"Bearer {token('hdr')}"}) as ws:
        await ws.send('{"op":"ping","id":1}')
        assert orjson.loads(await ws.recv()) == {"op": "pong", "re": 1}


async def test_http_bad_tokens_get_401(node, http):
    import httpx
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as h:
        for headers in ({}, {"Authorization": "Bearer junk"}, {"Authorization": "Basic abc"},
                        {"Authorization": "Bearer " + jwt.encode(
                            {"sub": "u", "exp": int(time.time()) - 1}, SECRET, "HS256")}):
            r = await h.get("/v1/sync", headers=headers)
            assert r.status_code == 401
            assert r.json()["error"]["code"] == "unauthorized"


@pytest.mark.parametrize(("method", "path", "kw"), [
    ("get", "/v1/sync", {"params": {"limit": 0}}),
    ("get", "/v1/sync", {"params": {"limit": 201}}),
    ("get", "/v1/sync", {"params": {"since": -1}}),
    ("get", "/v1/sync", {"params": {"since": "abc"}}),
    ("get", "/v1/sync", {"params": {"since": 2**53}}),
    ("get", "/v1/history/bad%20id", {}),
    ("get", "/v1/history/" + "a" * 65, {}),
    ("get", "/v1/history/peer", {"params": {"before": "x"}}),
    ("post", "/v1/sync/ack", {"json": {"upto": "x"}}),
    ("post", "/v1/sync/ack", {"json": {"upto": {"$gt": 0}}}),
    ("post", "/v1/sync/ack", {"json": {"upto": 1, "extra": 2}}),
    ("post", "/v1/sync/ack", {"content": b"{nope"}),
    ("post", "/v1/conversations/peer/read", {"json": {}}),
    ("post", "/v1/conversations/peer/read", {"json": {"mid": -5}}),
    ("post", "/v1/conversations/peer/read", {"json": {"mid": 1.5}}),
    ("post", "/v1/conversations/a$b/read", {"json": {"mid": 1}}),
])
async def test_http_bad_parameters_are_400(node, http, method, path, kw, mongo_db, redis_client):
    me = uid()
    r = await getattr(http(me), method)(path, **kw)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["error"]["code"] == "bad_request" and body["error"]["message"]
    assert "Traceback" not in r.text
    await nothing_stored(me, mongo_db, redis_client)


async def test_history_only_shows_the_callers_own_conversations(node, connect, http):
    a, b, c = uid("a"), uid("b"), uid("c")
    ca = await connect(node, a)
    await ca.request("send", to=b, cmid="secret", body="for b only")
    # c names a's conversation with b from every angle: sees nothing of it.
    for conv in (a, b):
        r = await http(c).get(f"/v1/history/{conv}")
        assert r.status_code == 200 and r.json()["msgs"] == []
    r = await http(c).get("/v1/history/g:somegroup")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert len((await http(b).get(f"/v1/history/{a}")).json()["msgs"]) == 1


async def test_unknown_path_is_a_clean_404(node, http):
    r = await http(uid()).get("/v1/nope")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
