"""Devices and the login policy on two real nodes (core/devices.py,
gateway/presence/devices.py): under ``one_per_platform`` two connections of
one platform opened at once on two nodes leave exactly one (the other is
closed with 4005), ``one_mobile`` puts ios and android in one slot, web
stays beside them; a device reconnecting replaces its own older connection
under every policy; ``GET /v1/devices`` lists the devices of every node; the
server API closes one device with 4003; a malformed device is refused."""

from __future__ import annotations

import asyncio
import time

import httpx
import jwt
import pytest
from websockets.exceptions import InvalidStatus

from gateway.auth import issue_token
from testkit.device import Device
from testkit.poll import until
from tests.conftest import SECRET, settle, token, uid

KEY = "k-" + "0123456789abcdef" * 2
REPLACED = 4005


async def two(make_node, **kw):
    n1, n2 = await make_node(**kw), await make_node(**kw)
    await settle(n1, n2)
    return n1, n2


async def dev(node, user: str, device: str, platform: str) -> Device:
    return await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?device={device}"
                             f"&platform={platform}", token(user))


async def alive(d: Device) -> bool:
    """Still open: a ping is answered."""
    if d.closed:
        return False
    try:
        return (await d.request("ping", timeout=5))["op"] == "pong"
    except Exception:  # noqa: BLE001 - closed meanwhile
        return False


async def listed(node, user: str) -> list[tuple[str, str]]:
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.get(f"http://127.0.0.1:{node.http_port}/v1/devices",
                        headers={"Authorization": f"Bearer {token(user)}"})
    assert r.status_code == 200, r.text
    return [(d["device"], d["platform"]) for d in r.json()["devices"]]


async def test_one_per_platform_two_at_once_on_two_nodes_leave_exactly_one(make_node):
    n1, n2 = await two(make_node, login_policy="one_per_platform")
    for round_ in range(3):  # the race, a few times
        user = uid(f"u{round_}")
        a, b = await asyncio.gather(dev(n1, user, "phone-a", "ios"),
                                    dev(n2, user, "phone-b", "ios"))
        assert await until(lambda a=a, b=b: a.closed or b.closed, timeout=10)
        loser, winner = (a, b) if a.closed else (b, a)
        assert await loser.wait_closed() == REPLACED
        assert await alive(winner)
        survivor = "phone-b" if winner is b else "phone-a"
        assert await listed(n1, user) == [(survivor, "ios")]
        await winner.close()


async def test_one_mobile_shares_a_slot_and_web_stays_beside(make_node):
    n1, n2 = await two(make_node, login_policy="one_mobile")
    user = uid("m")
    ios = await dev(n1, user, "iphone", "ios")
    web = await dev(n1, user, "browser", "web")
    android = await dev(n2, user, "pixel", "android")
    assert await ios.wait_closed() == REPLACED
    assert await alive(web) and await alive(android)
    assert sorted(await listed(n2, user)) == [("browser", "web"), ("pixel", "android")]
    for d in (web, android):
        await d.close()
    # one_per_platform: ios and web are two slots.
    n3, n4 = await two(make_node, login_policy="one_per_platform")
    other = uid("p")
    ios, web = await dev(n3, other, "iphone", "ios"), await dev(n4, other, "browser", "web")
    assert await alive(ios) and await alive(web)
    android = await dev(n4, other, "pixel", "android")  # its own platform: all three stay
    assert await alive(ios) and await alive(android)
    for d in (ios, web, android):
        await d.close()


async def test_a_device_reconnecting_replaces_its_own_connection_and_the_list_follows(
        make_node):
    n1, n2 = await two(make_node)  # unlimited
    user = uid("r")
    first = await dev(n1, user, "laptop", "desktop")
    phone = await dev(n2, user, "phone", "android")
    again = await dev(n2, user, "laptop", "desktop")  # the same device, now on node 2
    assert await first.wait_closed() == REPLACED
    assert await alive(phone) and await alive(again)
    assert sorted(await listed(n1, user)) == [("laptop", "desktop"), ("phone", "android")]
    await phone.close()
    async def only_laptop() -> bool:  # (the release follows the close)
        return await listed(n1, user) == [("laptop", "desktop")]

    assert await until(only_laptop, timeout=10)
    unnamed = await Device.open(n1.ws_port, token(user))  # no device: one of its own

    async def two_listed() -> bool:
        return len(await listed(n2, user)) == 2

    assert await until(two_listed, timeout=10)
    for d in (again, unnamed):
        await d.close()


async def test_the_server_api_lists_and_disconnects_one_device(make_node):
    n1, n2 = await two(make_node, api_keys=KEY)
    user = uid("s")
    phone, desk = await dev(n1, user, "phone", "ios"), await dev(n2, user, "desk", "desktop")
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        base = f"http://127.0.0.1:{n1.http_port}/v1/server/users/{user}/devices"

        async def both() -> bool:  # (each is listed once registered, just after its handshake)
            r = await c.get(base, headers={"X-API-Key": KEY})
            return sorted(d["device"] for d in r.json()["devices"]) == ["desk", "phone"]

        assert await until(both, timeout=10)
        r = await c.post(f"{base}/desk/disconnect", headers={"X-API-Key": KEY})
        assert r.status_code == 200 and r.json() == {"ok": True}
    assert await desk.wait_closed() == 4003
    assert await alive(phone)
    assert await listed(n2, user) == [("phone", "ios")]
    await phone.close()


@pytest.mark.parametrize("query", ["device=a%20b", "platform=watch", f"device={'x' * 65}"])
async def test_a_malformed_device_or_platform_is_refused_at_the_handshake(node, query):
    with pytest.raises(InvalidStatus) as refused:
        await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?{query}", token(uid("b")))
    assert refused.value.response.status_code == 400
    assert b"must be" in refused.value.response.body


async def test_device_and_platform_claims_of_the_token_win_over_the_handshake(node):
    """The product's backend may put ``device`` / ``platform`` in the token: they
    win over ``?device=&platform=``; a malformed claim refuses the token."""
    user = uid("t")
    claimed = issue_token(SECRET, user, 600, device="issued-phone", platform="android")
    d = await Device.open(f"ws://127.0.0.1:{node.ws_port}/ws?device=other&platform=web",
                          claimed)

    async def listed_claimed() -> bool:
        return await listed(node, user) == [("issued-phone", "android")]

    assert await until(listed_claimed, timeout=10)
    await d.close()
    bad = jwt.encode({"sub": user, "iat": int(time.time()), "exp": int(time.time()) + 600,
                      "device": "has space"}, SECRET, "HS256")
    with pytest.raises(InvalidStatus) as refused:
        await Device.open(node.ws_port, bad)
    assert refused.value.response.status_code == 401
    assert b"token claim: device must be" in refused.value.response.body


async def test_connections_closed_as_soon_as_opened_leave_no_device_behind(node, redis_client):
    """A storm of connections each closed right after its handshake: every
    release is written after its claim (one queue for both), so the device
    hashes end empty; a release written first would leave the claim's entry
    behind, listed as a device of a live node."""
    from store.keys import Keys
    from tests.conftest import RUN_NS

    users = [uid("blip") for _ in range(40)]

    async def blip(user: str, i: int) -> None:
        for k in range(3):
            d = await dev(node, user, f"d{i}-{k}", "web")
            await d.close()

    await asyncio.gather(*(blip(u, i) for i, u in enumerate(users)))
    keys = Keys(RUN_NS)

    async def left() -> int:
        return sum([await redis_client.hlen(keys.devices(u)) for u in users])

    assert await until(lambda: _zero(left), timeout=15), "device entries left behind"
    assert await listed(node, users[0]) == []


async def _zero(count) -> bool:
    return await count() == 0
