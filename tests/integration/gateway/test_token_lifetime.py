"""A WebSocket lives as long as its token (docs/protocol.md, Tokens, sessions):
closed with 4001 when the token expires, unless a ``refresh`` moved it."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from websockets.exceptions import InvalidStatus

from testkit.device import Device
from testkit.http import HttpUser
from tests.conftest import SECRET, uid


def token_until(user: str, exp: float, secret: str = SECRET) -> str:
    return jwt.encode({"sub": user, "iat": int(time.time()), "exp": exp}, secret, "HS256")


async def closed_at(d: Device, timeout: float) -> tuple[int | None, float]:
    code = await d.wait_closed(timeout)
    return code, time.time()


async def test_an_expired_token_closes_its_connection_with_4001(node):
    user = uid()
    exp = time.time() + 2
    d = await Device.open(node.ws_port, token_until(user, exp))
    assert (await d.request("ping"))["op"] == "pong"
    code, at = await closed_at(d, timeout=10)
    assert code == 4001 and d.ws.close_reason == "token expired"
    assert exp <= at < exp + 1.0  # within a second of exp, never before
    assert node.metrics.closed.labels("token_expired")._value.get() >= 1


async def test_refresh_moves_the_expiry(node):
    user = uid()
    first = time.time() + 2
    d = await Device.open(node.ws_port, token_until(user, first))
    later = time.time() + 4
    r = await d.request("refresh", token=token_until(user, later))
    assert r["op"] == "ok", r
    await asyncio.sleep(max(0.0, first + 0.5 - time.time()))  # past the first expiry
    assert (await d.request("ping"))["op"] == "pong"  # still open
    code, at = await closed_at(d, timeout=10)
    assert code == 4001 and later <= at < later + 1.0


async def test_a_bad_refresh_is_unauthorized_and_keeps_the_old_expiry(node):
    user, other = uid(), uid()
    exp = time.time() + 2
    d = await Device.open(node.ws_port, token_until(user, exp))
    for bad in (token_until(other, time.time() + 60),  # another user's
                token_until(user, time.time() + 60, secret="x" * 40),  # badly signed
                token_until(user, time.time() - 5)):  # expired
        r = await d.request("refresh", token=bad)
        assert r["op"] == "error" and r["code"] == "unauthorized", r
    r = await d.request("refresh", token=123)
    assert r["op"] == "error" and r["code"] == "bad_request"
    code, at = await closed_at(d, timeout=10)
    assert code == 4001 and exp <= at < exp + 1.0


async def test_es256_tokens_with_issuer_and_audience_on_a_node(make_node, tmp_path):
    key = ec.generate_private_key(ec.SECP256R1())
    pem = tmp_path / "auth.pem"
    pem.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    node = await make_node(auth_public_key_file=str(pem), auth_issuer="https://id.test",
                           auth_audience="imgate")
    user, now = uid(), int(time.time())

    def es256(**extra: object) -> str:
        claims = {"sub": user, "iat": now, "exp": now + 60, "iss": "https://id.test",
                  "aud": "imgate", **extra}
        return jwt.encode(claims, key, "ES256")

    d = await Device.open(node.ws_port, es256())
    try:
        assert (await d.request("ping"))["op"] == "pong"
        r = await d.request("refresh", token=es256(aud="other"))
        assert r["code"] == "unauthorized" and "audience" in r["message"]
    finally:
        await d.close()
    for token, status in ((es256(), 200), (es256(iss="https://evil"), 401)):
        h = HttpUser(node.http_port, token)
        try:
            assert (await h.get("/v1/conversations")).status_code == status
        finally:
            await h.aclose()
    with pytest.raises(InvalidStatus):  # the handshake: 401, another issuer's token
        await Device.open(node.ws_port, es256(iss="https://evil"))
