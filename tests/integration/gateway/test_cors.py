"""Browsers of the origins in IM_CORS_ORIGINS may call the HTTP API; others get
no CORS headers, and a node without the setting answers no preflight."""

from __future__ import annotations

import httpx

from tests.conftest import token, uid

PREFLIGHT = {"Access-Control-Request-Method": "GET",
             "Access-Control-Request-Headers": "authorization"}


async def test_preflight_and_calls_from_allowed_origins_only(make_node):
    node = await make_node(cors_origins="https://app.example, http://localhost:3000")
    base = f"http://127.0.0.1:{node.http_port}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        ok = await c.options(f"{base}/v1/conversations",
                             headers={"Origin": "https://app.example", **PREFLIGHT})
        assert ok.status_code == 200
        assert ok.headers["access-control-allow-origin"] == "https://app.example"
        assert "authorization" in ok.headers["access-control-allow-headers"].lower()
        other = await c.options(f"{base}/v1/conversations",
                                headers={"Origin": "https://evil.example", **PREFLIGHT})
        assert other.status_code == 400
        assert "access-control-allow-origin" not in other.headers
        call = await c.get(f"{base}/v1/conversations",
                           headers={"Origin": "http://localhost:3000",
                                    "Authorization": f"Bearer {token(uid())}"})
        assert call.status_code == 200
        assert call.headers["access-control-allow-origin"] == "http://localhost:3000"
        # The token is still required: CORS opens nothing else.
        bare = await c.get(f"{base}/v1/conversations", headers={"Origin": "https://app.example"})
        assert bare.status_code == 401


async def test_no_cors_without_the_setting(node):
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.options(f"http://127.0.0.1:{node.http_port}/v1/conversations",
                            headers={"Origin": "https://app.example", **PREFLIGHT})
        assert "access-control-allow-origin" not in r.headers
