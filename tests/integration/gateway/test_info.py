"""GET /v1/info: where clients open their WebSocket (no token needed)."""

from __future__ import annotations

import httpx


async def test_info_names_this_nodes_websocket_on_the_host_the_caller_used(node):
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as h:
        r = await h.get("/v1/info")  # no token
        assert r.status_code == 200
        assert r.json() == {"ws_url": f"ws://127.0.0.1:{node.ws_port}/ws"}
        r = await h.get("/v1/info", headers={"Host": f"localhost:{node.http_port}"})
        assert r.json() == {"ws_url": f"ws://localhost:{node.ws_port}/ws"}
        # Through a proxy on another port (one port for / and /ws): that origin's /ws.
        r = await h.get("/v1/info", headers={"Host": "chat.example.com",
                                             "X-Forwarded-Proto": "https"})
        assert r.json() == {"ws_url": "wss://chat.example.com/ws"}
        r = await h.get("/v1/info", headers={"Host": "chat.example.com:8443"})
        assert r.json() == {"ws_url": "ws://chat.example.com:8443/ws"}


async def test_info_says_what_the_operator_set(make_node):
    node = await make_node(public_ws_url="wss://im.example.com/ws")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.http_port}") as h:
        assert (await h.get("/v1/info")).json() == {"ws_url": "wss://im.example.com/ws"}
