"""The server API (``/v1/server/*``, ``X-API-Key``) on two nodes: every call takes
effect on both; keys and user tokens never cross over."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest
from websockets.exceptions import InvalidStatus

from testkit.device import Device
from testkit.poll import until
from tests.conftest import SECRET, settle, token, uid

KEY = "k-" + "0123456789abcdef" * 2
OLD_KEY = "o-" + "fedcba9876543210" * 2


@pytest.fixture
async def two(make_node):
    nodes = [await make_node(api_keys=f"{KEY},{OLD_KEY}") for _ in range(2)]
    await settle(*nodes)
    return nodes


@pytest.fixture
async def client():
    async with httpx.AsyncClient(trust_env=False, timeout=15) as c:
        yield c


def server(node, path: str) -> str:
    return f"http://127.0.0.1:{node.http_port}/v1/server/{path}"


async def call(c, node, method: str, path: str, key: str = KEY, **kw) -> httpx.Response:
    return await c.request(method, server(node, path), headers={"X-API-Key": key}, **kw)


async def test_keys_and_tokens_never_cross_over(two, client):
    a, _ = two
    body = {"from": "system", "to": uid(), "cmid": "k1", "body": "hi"}
    for headers in ({}, {"X-API-Key": "wrong" * 6}, {"Authorization": f"Bearer {token('bob')}"}):
        r = await client.post(server(a, "send"), json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    # Nothing was stored by the refused calls: the first real one is new.
    ok = await call(client, a, "POST", "send", json=body)
    assert ok.status_code == 200
    sync = await client.get(f"http://127.0.0.1:{a.http_port}/v1/sync",
                            headers={"Authorization": f"Bearer {token(body['to'])}"})
    assert [m["body"] for m in sync.json()["msgs"]] == ["hi"]
    # Both keys work (rotation); a key is no user token.
    assert (await call(client, a, "POST", "send", key=OLD_KEY,
                       json={**body, "cmid": "k2"})).status_code == 200
    r = await client.get(f"http://127.0.0.1:{a.http_port}/v1/conversations",
                         headers={"X-API-Key": KEY})
    assert r.status_code == 401


async def test_send_and_group_send_as_anyone_reach_devices_on_the_other_node(
        two, client, connect, http):
    a, b = two
    bob, owner = uid("b"), uid("o")
    db = await connect(b, bob)
    r = await call(client, a, "POST", "send",
                   json={"from": "system", "to": bob, "cmid": "c1", "body": {"text": "hello"}})
    mid = r.json()["mid"]
    push = await db.next_push("msg")
    assert push["mid"] == mid and push["from"] == "system" and push["body"] == {"text": "hello"}
    again = await call(client, a, "POST", "send",
                       json={"from": "system", "to": bob, "cmid": "c1", "body": "other"})
    assert again.json()["mid"] == mid  # idempotent like the WebSocket send
    bad = await call(client, a, "POST", "send",
                     json={"from": "system", "to": bob, "cmid": "c2", "body": "x" * 5000})
    assert bad.status_code == 413
    # A group whose owner is bob; the backend posts into it as "announcer".
    g = (await http(owner, a).post("/v1/groups", json={"name": "g", "members": [bob]})).json()
    gid = g["group"]
    r = await call(client, a, "POST", "group_send",
                   json={"from": "announcer", "group": gid, "cmid": "g1", "body": "news"})
    assert r.status_code == 200 and r.json()["seq"] >= 1
    gpush = await db.next_push("group_msg")
    assert gpush["from"] == "announcer" and gpush["body"] == "news"
    missing = await call(client, a, "POST", "group_send",
                         json={"from": "announcer", "group": uid("nog"), "cmid": "g2",
                               "body": "x"})
    assert missing.status_code == 404


async def test_room_publish_and_notify_reach_both_nodes(two, client, connect):
    a, b = two
    room, ua, ub = uid("room"), uid("a"), uid("b")
    da, db = await connect(a, ua), await connect(b, ub)
    for d in (da, db):
        assert (await d.request("join", room=room))["op"] == "joined"
    r = await call(client, a, "POST", f"rooms/{room}/publish", json={"body": "gift", "prio": 1})
    assert r.json() == {"ok": True}
    for d in (da, db):
        frame = await d.next_push("room_msgs")
        assert frame["msgs"][0]["from"] == "system" and frame["msgs"][0]["body"] == "gift"
    r = await call(client, b, "POST", "notify", json={"users": [ua, ub, uid()], "body": "ping"})
    assert r.json() == {"online": 2}
    for d in (da, db):
        n = await d.next_push("notice")
        assert n["body"] == "ping" and isinstance(n["ts"], int)


async def test_disconnect_closes_on_the_other_node_with_4003(two, client, connect):
    a, b = two
    user = uid()
    d = await connect(b, user)
    await d.request("ping")  # served: its route is written (a device is served only then)
    assert (await call(client, a, "POST", f"users/{user}/disconnect")).json() == {"ok": True}
    assert await d.wait_closed(timeout=10) == 4003


async def test_ban_refuses_handshakes_and_calls_everywhere_until_unbanned(two, client, connect):
    a, b = two
    user = uid()
    d = await connect(b, user)
    await d.request("ping")  # served: its route is written
    r = await call(client, a, "POST", f"users/{user}/ban", json={"seconds": 600})
    assert r.json() == {"ok": True}
    assert await d.wait_closed(timeout=10) == 4003
    for node in (a, b):
        with pytest.raises(InvalidStatus) as info:
            await Device.open(node.ws_port, token(user))
        assert info.value.response.status_code == 403
        h = await client.get(f"http://127.0.0.1:{node.http_port}/v1/conversations",
                             headers={"Authorization": f"Bearer {token(user)}"})
        assert h.status_code == 403 and h.json()["error"]["code"] == "forbidden"
    assert (await call(client, b, "DELETE", f"users/{user}/ban")).json() == {"ok": True}
    again = await connect(a, user)
    assert (await again.request("ping"))["op"] == "pong"


async def test_revoke_closes_connections_of_older_tokens_and_refuses_them(two, client):
    a, b = two
    user = uid()
    old = jwt.encode({"sub": user, "iat": int(time.time()) - 100,
                      "exp": int(time.time()) + 600}, SECRET, "HS256")
    d = await Device.open(b.ws_port, old)
    try:
        await d.request("ping")  # served: its route is written
        before = int(time.time()) - 10
        r = await call(client, a, "POST", f"users/{user}/revoke", json={"before": before})
        assert r.json() == {"ok": True}
        assert await d.wait_closed(timeout=10) == 4003
    finally:
        await d.close()
    with pytest.raises(InvalidStatus) as info:
        await Device.open(a.ws_port, old)
    assert info.value.response.status_code == 401
    fresh = await Device.open(a.ws_port, token(user))  # iat now: after `before`
    try:
        assert (await fresh.request("ping"))["op"] == "pong"
        # A refresh with a revoked token is refused; the connection stays.
        r2 = await fresh.request("refresh", token=old)
        assert r2["code"] == "unauthorized"
    finally:
        await fresh.close()


async def test_bad_server_calls_are_400_and_change_nothing(two, client):
    a, _ = two
    for path, body in (("send", {"from": "g:x", "to": "bob", "cmid": "c", "body": 1}),
                       ("send", {"from": "sys", "to": "a b", "cmid": "c", "body": 1}),
                       ("send", {"to": "bob", "cmid": "c", "body": 1}),
                       ("notify", {"users": [], "body": 1}),
                       ("users/bob/ban", {"seconds": 0}),
                       ("users/bob/revoke", {"before": "yesterday"})):
        r = await call(client, a, "POST", path, json=body)
        assert r.status_code == 400, (path, r.text)



async def test_openapi_documents_the_server_api_with_its_own_scheme(two, client):
    a, _ = two
    doc = (await client.get(f"http://127.0.0.1:{a.http_port}/openapi.json")).json()
    schemes = doc["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key",
                                 "description": schemes["ApiKey"]["description"]}
    for path in ("/v1/server/send", "/v1/server/group_send", "/v1/server/notify",
                 "/v1/server/rooms/{room}/publish", "/v1/server/users/{user}/ban",
                 "/v1/server/users/{user}/revoke", "/v1/server/users/{user}/disconnect"):
        ops = doc["paths"][path]
        assert all(op["security"] == [{"ApiKey": []}] for op in ops.values()), path


async def test_room_mute_kick_and_presence_on_the_other_node(two, client, connect):
    a, b = two
    room, user, other = uid("room"), uid("m"), uid("o")
    d = await connect(b, user)
    assert (await d.request("join", room=room))["op"] == "joined"
    assert (await d.request("room_send", room=room, body="before"))["op"] == "ok"
    r = await call(client, a, "POST", f"rooms/{room}/mute/{user}", json={"seconds": 600})
    assert r.json() == {"ok": True}
    muted = await d.request("room_send", room=room, body="during")
    assert muted["code"] == "forbidden" and "muted" in muted["message"]
    # A device that joins later, on the other node, is muted too (read at join).
    d2 = await connect(a, user)
    assert (await d2.request("join", room=room))["op"] == "joined"
    assert (await d2.request("room_send", room=room, body="x"))["code"] == "forbidden"
    assert (await call(client, a, "DELETE", f"rooms/{room}/mute/{user}")).json() == {"ok": True}
    assert (await d.request("room_send", room=room, body="after"))["op"] == "ok"
    # Kick: both devices leave, each told why.
    assert (await call(client, b, "POST", f"rooms/{room}/kick/{user}")).json() == {"ok": True}
    for dev in (d, d2):
        left = await dev.next_push("left")
        assert left == {"op": "left", "room": room, "reason": "kicked"}
        assert (await dev.request("room_send", room=room, body="y"))["code"] == "forbidden"
    # Presence: two devices now; none for the other user, until one connects.
    p = (await call(client, a, "GET", "presence", params={"users": f"{user},{other}"})).json()
    assert p["users"][user]["online"] and p["users"][user]["devices"] == 2
    assert p["users"][other] == {"online": False, "devices": 0, "last_seen": None}
    await d.close()
    await d2.close()

    async def offline() -> bool:
        q = (await call(client, b, "GET", "presence", params={"users": user})).json()
        u = q["users"][user]
        return not u["online"] and isinstance(u["last_seen"], int)

    assert await until(offline, timeout=10)
    bad = await call(client, a, "GET", "presence", params={"users": "a b"})
    assert bad.status_code == 400
