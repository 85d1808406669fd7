"""The HTTP edge against real nodes: strict ids on every id-bearing route, the body
limit before reading, auth before the body, header and body deadlines, the
per-user rate, the follow cap, /metrics off the API port, an honest OpenAPI."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import urllib.parse

import httpx
import pytest

from gateway.http.guard import PUBLIC_PATHS
from testkit.nodes import NodeProcess, node_env
from testkit.poll import until
from testkit.probe import rss_kb
from tests.conftest import RUN_NS, SECRET, token, uid

BAD_IDS = ["a*", "{x}", "a b", "a\x00", "a\n", "$where", "x}{y", "été", "x" * 65]
USER_ONLY = ["g:team"]  # a group's name is no user id


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


# Each: (method, path template with {id}, json body template or None); {id} is the bad id.
USER_ROUTES = [
    ("GET", "/v1/users/{id}", None),
    ("GET", "/v1/users/{id}/following", None),
    ("GET", "/v1/users/{id}/followers", None),
    ("GET", "/v1/users/{id}/posts", None),
    ("POST", "/v1/follow/{id}", None),
    ("DELETE", "/v1/follow/{id}", None),
    ("DELETE", "/v1/groups/grp1/members/{id}", None),
    ("GET", "/v1/users/bob/followers?cursor={id}", None),
    ("GET", "/v1/users/bob/following?cursor={id}", None),
    ("POST", "/v1/groups", {"name": "n", "members": ["{id}"]}),
    ("POST", "/v1/groups/grp1/members", {"members": ["ok", "{id}"]}),
]
ID_ROUTES = [
    ("GET", "/v1/history/{id}", None),
    ("POST", "/v1/conversations/{id}/read", {"mid": 1}),
    ("GET", "/v1/rooms/{id}", None),
    ("POST", "/v1/groups/{id}/members", {"members": ["ok"]}),
    ("DELETE", "/v1/groups/{id}/members/bob", None),
]


ROUTES = [(m, p, b, BAD_IDS + USER_ONLY) for m, p, b in USER_ROUTES] + \
    [(m, p, b, BAD_IDS) for m, p, b in ID_ROUTES]


@pytest.mark.parametrize(("method", "path", "body", "bads"), ROUTES,
                         ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
async def test_every_id_bearing_route_refuses_bad_ids(method, path, body, bads, node, http,
                                                      mongo_db):
    me = uid()
    user = http(me)
    wrong = []
    for bad in bads:
        kw = {}
        if body is not None:
            kw["json"] = {k: ([x.replace("{id}", bad) for x in v] if isinstance(v, list)
                              else v) for k, v in body.items()}
        r = await user.request(method, path.replace("{id}", q(bad)), **kw)
        if r.status_code != 400 or r.json()["error"]["code"] != "bad_request":
            wrong.append((bad, r.status_code, r.text[:100]))
    assert wrong == []
    assert await mongo_db.follows.count_documents({"a": me}) == 0
    assert await mongo_db.groups.count_documents({"owner": me}) == 0


async def test_group_conversations_keep_their_prefix(node, http):
    # ``g:GROUP`` is a valid conv id on the history route (not a 400 bad id):
    # a non-member, or a group that does not exist, is 403 forbidden...
    me = http(uid())
    r = await me.get("/v1/history/g:nosuchgroup")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    # ... and a member reads the group's history through it.
    g = (await me.post("/v1/groups", json={"name": "n", "members": [uid()]})).json()["group"]
    r = await me.get(f"/v1/history/g:{g}")
    assert r.status_code == 200 and r.json() == {"msgs": [], "next": None}, r.text
    r = await http(uid()).get(f"/v1/history/g:{g}")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text


# -- body limit, auth first -----------------------------------------------------------
async def raw_request(port: int, head: bytes, body_chunks=(), read_timeout=10.0) -> bytes:
    """Send ``head``, then ``body_chunks`` while reading: the answer's head (and what
    came with it). Writing stops when the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def answer() -> bytes:
        data = b""
        with contextlib.suppress(TimeoutError, ConnectionError):
            async with asyncio.timeout(read_timeout):
                while b"\r\n\r\n" not in data:
                    part = await reader.read(65536)
                    if not part:
                        break
                    data += part
        return data

    try:
        writer.write(head)
        await writer.drain()
        reading = asyncio.create_task(answer())
        for chunk in body_chunks:
            try:
                writer.write(chunk)
                await asyncio.wait_for(writer.drain(), read_timeout)
            except (ConnectionError, TimeoutError):
                break
        return await reading
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def status_of(data: bytes) -> int:
    return int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0


async def test_content_length_over_the_limit_is_413_without_reading(node):
    auth = {"Authorization": f"Bearer {token(uid())}", "Content-Type": "application/json"}
    data = await raw_request(node.http_port, head("POST", "/v1/posts", {
        **auth, "Content-Length": str(10**9)}))  # and no body at all: nothing to wait for
    assert status_of(data) == 413 and b'"too_large"' in data


async def test_chunked_body_over_the_limit_is_413_as_it_passes(make_node):
    node = await make_node(http_body_max=1000)
    auth = {"Authorization": f"Bearer {token(uid())}", "Content-Type": "application/json",
            "Transfer-Encoding": "chunked"}
    chunk = b"200\r\n" + b"x" * 0x200 + b"\r\n"  # 512 bytes a chunk, no final chunk sent
    data = await raw_request(node.http_port, head("POST", "/v1/posts", auth), [chunk] * 3)
    assert status_of(data) == 413


async def test_a_body_within_the_limit_passes(make_node, http):
    node = await make_node(http_body_max=300)
    u = http(uid(), node)
    assert (await u.post("/v1/posts", json={"text": "x" * 200})).status_code == 200
    r = await u.post("/v1/posts", json={"text": "x" * 400})
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_large"
    # A client that sends its whole body before reading still gets the answer
    # (the rest is read and dropped, not reset), and its connection lives on.
    r = await u.post("/v1/posts", content=b"x" * 500_000,
                     headers={"Content-Type": "application/json"})
    assert r.status_code == 413
    assert (await u.get("/v1/conversations")).status_code == 200


async def test_unauthenticated_huge_body_is_refused_before_it_is_read(node_process):
    proc = await node_process(http_body_max=100_000_000)  # the limit is not what stops it
    before = rss_kb(proc.pid)
    size = 50 * 2**20
    mib = b"x" * 2**20
    data = await raw_request(proc.http_port, head("POST", "/v1/posts", {
        "Content-Type": "application/json", "Content-Length": str(size)}), [mib] * 50)
    assert status_of(data) == 401
    assert b"www-authenticate: bearer" in data.lower()
    assert rss_kb(proc.pid) - before < 10 * 1024  # far below the 50 MiB body


# -- deadlines -------------------------------------------------------------------------
async def test_slowloris_sockets_are_closed_at_the_header_deadline(make_node):
    node = await make_node(http_header_timeout_s=1)
    conns = []
    for _ in range(200):
        reader, writer = await asyncio.open_connection("127.0.0.1", node.http_port)
        writer.write(b"GET /v1/sync HTTP/1.1\r\nHost: x\r\nX-a: ")  # and never the rest
        conns.append((reader, writer))

    async def sent(writer) -> None:
        # Under load opening 200 takes longer than the deadline: the first may
        # be closed (reset) by the node before this drains them.
        with contextlib.suppress(ConnectionError):
            await writer.drain()

    await asyncio.gather(*(sent(w) for _, w in conns))

    async def closed(reader) -> bool:
        try:
            async with asyncio.timeout(10):  # bounded: 10x the configured deadline
                return await reader.read(1024) == b""
        except ConnectionError:
            return True  # reset by the node: closed too
        except TimeoutError:
            return False

    results = await asyncio.gather(*(closed(r) for r, _ in conns))
    for _, w in conns:
        w.close()
    assert sum(results) == 200
    text = node.metrics.render().decode()
    assert 'im_closed_total{reason="http_header_timeout"} 200.0' in text


async def test_idle_connection_and_slow_body_are_closed(make_node):
    node = await make_node(http_header_timeout_s=1, http_body_timeout_s=1)
    idle = await asyncio.open_connection("127.0.0.1", node.http_port)  # sends nothing
    slow = await asyncio.open_connection("127.0.0.1", node.http_port)
    slow[1].write(head("POST", "/v1/posts", {"Authorization": f"Bearer {token(uid())}",
                                             "Content-Type": "application/json",
                                             "Content-Length": "100"}) + b'{"text":')
    for reader, writer in (idle, slow):
        async with asyncio.timeout(10):
            data = await reader.read()
        assert b"200 OK" not in data
        writer.close()
    assert await until(lambda: 'reason="http_body_timeout"' in node.metrics.render().decode())


async def test_keep_alive_requests_still_work(node):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}",
                                 headers={"Authorization": f"Bearer {token(uid())}"}) as c:
        for _ in range(5):
            assert (await c.get("/v1/conversations")).status_code == 200


# -- rate, follow cap ------------------------------------------------------------------
async def test_a_flooding_user_is_rate_limited_and_another_is_not(make_node, http):
    # A rate this low refills nothing to speak of while the 30 calls run, however
    # slowly a loaded machine answers them (at 2/s a slow run earned back refusals).
    node = await make_node(http_rate=0.1, http_burst=5)
    flood, calm = http(uid("flood"), node), http(uid("calm"), node)
    answers = [await flood.get("/v1/conversations") for _ in range(30)]
    codes = [r.status_code for r in answers]
    assert codes[:5] == [200] * 5 and codes.count(429) >= 20 and set(codes) == {200, 429}
    refused = [r for r in answers if r.status_code == 429]  # each says why and when
    assert {r.json()["error"]["code"] for r in refused} == {"rate_limited"}
    assert min(int(r.headers["retry-after"]) for r in refused) >= 1
    assert [(await calm.get("/v1/conversations")).status_code for _ in range(5)] == [200] * 5


async def test_follow_cap(make_node, http):
    node = await make_node(feed_follow_max=3)
    me = http(uid(), node)
    targets = [uid("t") for _ in range(4)]
    for t in targets[:3]:
        assert (await me.post(f"/v1/follow/{t}")).status_code == 200
    r = await me.post(f"/v1/follow/{targets[3]}")
    assert r.status_code == 403 and "limit is 3" in r.json()["error"]["message"]
    assert (await me.post(f"/v1/follow/{targets[0]}")).status_code == 200  # already followed
    assert (await me.delete(f"/v1/follow/{targets[0]}")).status_code == 200
    assert (await me.post(f"/v1/follow/{targets[3]}")).status_code == 200


# -- metrics -------------------------------------------------------------------------
async def test_metrics_are_on_their_own_listener(node, http):
    u = http(uid(), node)
    await u.get("/v1/history/x%20y")
    async with httpx.AsyncClient() as c:
        assert (await c.get(f"http://127.0.0.1:{node.http_port}/metrics")).status_code == 404
        assert node.metrics_port > 0
        r = await c.get(f"http://127.0.0.1:{node.metrics_port}/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        assert 'im_http_requests_total{route="/v1/history/{conv}",status="400"}' in r.text
        assert (await c.get(f"http://127.0.0.1:{node.metrics_port}/v1/sync")).status_code == 404


async def test_metrics_public_and_none(make_node):
    public = await make_node(metrics_public=1, metrics_port=-1)
    assert public.metrics_port == -1
    async with httpx.AsyncClient() as c:
        r = await c.get(f"http://127.0.0.1:{public.http_port}/metrics")
    assert r.status_code == 200 and "im_http_requests_total" in r.text


async def test_ready_line_names_the_metrics_listener(mongo_db):
    # metrics_port=0: any free port, so a node already on the default 9464
    # (scripts/up.sh) is no obstacle; the ready line names the one it got.
    proc = NodeProcess(node_env(namespace=RUN_NS, auth_secret=SECRET, ws_port=0, http_port=0,
                                metrics_port=0))
    try:
        await proc.start()
        line = next(x for x in proc.output if b"gateway: node " in x).decode()
        assert line.startswith(f"gateway: node {proc.name} ws://127.0.0.1:{proc.ws_port}/ws "
                               f"http://127.0.0.1:{proc.http_port} metrics http://127.0.0.1:")
        port = int(line.rsplit(":", 1)[1].split("/")[0])
        async with httpx.AsyncClient() as c:
            assert (await c.get(f"http://127.0.0.1:{port}/metrics")).status_code == 200
    finally:
        await proc.stop(grace_s=5)


# -- what the API says about itself ------------------------------------------------------
async def test_openapi_tells_the_truth(node):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as c:
        spec = (await c.get("/openapi.json")).json()
        assert (await c.get("/docs")).status_code == 404
        assert (await c.get("/redoc")).status_code == 404
    assert spec["components"]["securitySchemes"]["HTTPBearer"] == {
        "type": "http", "scheme": "bearer", "bearerFormat": "JWT",
        "description": "a JWT (HS256) whose `sub` is the user id"}
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            assert "422" not in responses, (method, path)
            ok = responses["200"]["content"]["application/json"]["schema"]
            assert "$ref" in ok, (method, path, ok)  # a model, not "string"
            public = path in PUBLIC_PATHS  # no token, no dependency: never 401 or 503
            for status in ("500",) if public else ("500", "503"):
                assert responses[status]["content"]["application/json"]["schema"] == {
                    "$ref": "#/components/schemas/ErrorBody"}, (method, path)
            if path.startswith("/v1/") and not public:
                assert op["security"] == [{"HTTPBearer": []}]
                assert {"400", "401", "429"} <= set(responses), (method, path)
    assert "HTTPValidationError" not in spec["components"]["schemas"]


async def test_405_carries_every_method_of_the_path(node, http):
    r = await http(uid()).request("PUT", "/v1/follow/bob")
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, POST"
    assert r.json()["error"]["code"] == "bad_request"


async def test_a_body_that_is_not_json_says_what_is_wrong_and_stores_nothing(node, http):
    """A body sent without the JSON content type, or malformed, is told so in
    words (not the validator's); the node's root says where things are."""
    user = http(uid("u"))
    r = await user.post("/v1/groups", content=b'{"name": "n", "members": []}',
                        headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    assert r.json()["error"] == {"code": "bad_request", "message": (
        "the body must be JSON, sent with Content-Type: application/json "
        "(this one came as text/plain)")}
    r = await user.post("/v1/groups", content=b'{"name": "n", "members": []}',
                        headers={"Content-Type": ""})
    assert "without a Content-Type" in r.json()["error"]["message"]
    r = await user.post("/v1/groups", content=b'{"name": "n",, }',
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("the body is not valid JSON: ") and "at character" in message
    assert (await user.get("/v1/groups")).json()["groups"] == []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as c:
        root = (await c.get("/")).json()
    assert root["service"] == "imgate" and root["demo"] == "/demo/"
    assert root["openapi"] == "/openapi.json" and root["health"] == "/healthz"
    assert root["websocket"] == f"ws://127.0.0.1:{node.ws_port}/ws"


async def test_answers_are_not_held_by_nagle(make_node):
    """Every accepted HTTP connection has TCP_NODELAY (the API's and the metrics
    listener's). Without it, on a kept-alive connection the answer's body,
    written apart from its head, waited for the client's delayed ACK: 40 ms
    more per answer."""
    node = await make_node(metrics_port=0)
    for port, server in ((node.http_port, node._http), (node.metrics_port, node._metrics_http)):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await reader.readuntil(b"\r\n\r\n")  # answered: the connection is accepted
            assert server is not None
            conns = list(server.server_state.connections)
            assert conns
            for conn in conns:
                sock = conn.transport.get_extra_info("socket")
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        finally:
            writer.close()
