"""Per client address limits at the WebSocket edge, on a real node: handshakes
per second and open connections per address (429 with the reason), and
``X-Forwarded-For`` believed only from a trusted proxy; and handshakes per
second per user."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import InvalidStatus

from testkit.device import Device
from testkit.poll import until
from tests.conftest import token, uid


async def _refused(node, user: str, **kw) -> str:
    with pytest.raises(InvalidStatus) as info:
        await Device.open(node.ws_port, token(user), **kw)
    assert info.value.response.status_code == 429
    return info.value.response.body.decode()


async def _count(node, name: str) -> float:
    async with httpx.AsyncClient() as c:
        text = (await c.get(f"http://127.0.0.1:{node.metrics_port}/metrics")).text
    line = [x for x in text.splitlines()
            if x.startswith(f'im_limit_refusals_total{{limit="{name}"}}')]
    return float(line[0].split()[-1]) if line else 0.0


async def test_open_connections_per_address_are_capped(make_node, connect):
    node = await make_node(max_conns_per_ip=3, ip_handshake_rate=1000, ip_handshake_burst=1000)
    held = [await connect(node, uid("u")) for _ in range(3)]
    assert "open connections" in await _refused(node, uid("u"))
    assert await _count(node, "ip_connections") == 1
    await held[0].close()

    async def admitted() -> bool:  # a closed one frees its place (once the node has seen
        try:                       # the close: the handler ends just after the client's)
            await connect(node, uid("u"))
        except InvalidStatus:
            return False
        return True

    assert await until(admitted, timeout=5)


async def test_handshakes_per_second_per_address_are_capped(make_node, connect):
    node = await make_node(ip_handshake_rate=0.001, ip_handshake_burst=2, max_conns_per_ip=0)
    await connect(node, uid("u"))
    await connect(node, uid("u"))
    assert "handshakes per second" in await _refused(node, uid("u"))
    assert await _count(node, "ip_handshakes") == 1


async def test_forwarded_for_counts_only_from_a_trusted_proxy(make_node, connect):
    # 127.0.0.1 is not trusted: a client's own header changes nothing.
    node = await make_node(max_conns_per_ip=1, ip_handshake_rate=0)
    await connect(node, uid("u"), additional_headers={"X-Forwarded-For": "198.51.100.1"})
    await _refused(node, uid("u"), additional_headers={"X-Forwarded-For": "198.51.100.2"})
    # Trusted: each forwarded address is counted on its own.
    proxied = await make_node(max_conns_per_ip=1, ip_handshake_rate=0,
                              trusted_proxies="127.0.0.1")
    await connect(proxied, uid("u"), additional_headers={"X-Forwarded-For": "198.51.100.1"})
    await connect(proxied, uid("u"), additional_headers={"X-Forwarded-For": "198.51.100.2"})
    await _refused(proxied, uid("u"), additional_headers={"X-Forwarded-For": "198.51.100.1"})


async def test_handshakes_per_second_per_user_are_capped(make_node, connect):
    """A user reconnecting over and over (closed for flooding, say) is refused
    past its burst, with Retry-After; other users connect as before."""
    node = await make_node(user_handshake_rate=0.5, user_handshake_burst=3)
    user = uid("u")
    for _ in range(3):
        await (await connect(node, user)).close()
    with pytest.raises(InvalidStatus) as info:
        await Device.open(node.ws_port, token(user))
    assert info.value.response.status_code == 429
    assert "IM_USER_HANDSHAKE_RATE" in info.value.response.body.decode()
    assert info.value.response.headers["Retry-After"] == "2"
    assert await _count(node, "user_handshakes") == 1
    await connect(node, uid("other"))
