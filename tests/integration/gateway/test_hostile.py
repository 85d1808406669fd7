"""A hostile client must not hurt anyone else, on real node processes.

Each test runs a node as its own process (as in production: the flooding
client and the node do not share an event loop) with its default budgets,
lets one user attack it, and checks what the other users got by counts and
orderings: every ping answered, every message acked and pushed, stored
bodies returned as sent, the node's heartbeat record never in the past.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import httpx
import orjson
import pytest
from websockets.exceptions import InvalidStatus

from store.keys import Keys
from testkit.device import Device
from testkit.nodes import NodeProcess
from testkit.poll import until
from testkit.probe import rss_kb, sample
from tests.conftest import RUN_NS, token, uid

FAST_BEAT = {"heartbeat_s": 0.5, "heartbeat_ttl_s": 1.5}


async def metrics_of(proc: NodeProcess) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{proc.http_url}/metrics")).text  # IM_METRICS_PUBLIC=1


async def sync_all(h: httpx.AsyncClient) -> list[dict[str, Any]]:
    """Every message of the caller, through ``/v1/sync`` pages."""
    msgs: list[dict[str, Any]] = []
    since = 0
    for _ in range(100):
        r = await h.get("/v1/sync", params={"since": since, "limit": 200})
        assert r.status_code == 200, r.text
        page = r.json()
        msgs.extend(page["msgs"])
        since = page["next"]
        if not page["more"]:
            return msgs
    raise AssertionError("sync did not end")


def rss_mb(pid: int) -> float:
    return rss_kb(pid) / 1024


async def flood(proc: NodeProcess, user: str, frames: int) -> tuple[int, int, int | None]:
    """One connection sends ``frames`` pings as fast as it can (its reader counts
    the replies meanwhile). Returns (pongs, rate_limited errors, close code)."""
    d = await Device.open(proc.ws_port, token(user))
    frame = b'{"op":"ping"}'
    try:
        for _ in range(frames):
            await d.ws.send(frame)
    except Exception:  # closed by the node mid-flood: the point of the test
        pass
    code = await d.wait_closed(timeout=20)
    return d.counts["pong"], d.counts["error"], code


async def test_a_flood_is_refused_and_closed_while_others_are_served(node_process, redis_client):
    proc = await node_process(metrics_public=1, **FAST_BEAT)
    a, b, c = uid("a"), uid("b"), uid("c")
    db, dc = await Device.open(proc.ws_port, token(b)), await Device.open(proc.ws_port, token(c))
    nodes_key = Keys(RUN_NS).nodes()
    lapses: list[float] = []
    samples = 0
    stop = asyncio.Event()

    async def watch_heartbeat() -> None:
        """The heartbeat record of this node, read until the flood ends."""
        nonlocal samples
        while not stop.is_set():
            expiry = await redis_client.zscore(nodes_key, proc.name)
            now = time.time()
            samples += 1
            if expiry is None or expiry < now:
                lapses.append(now - (expiry or 0))
            await asyncio.sleep(0.05)

    async def others() -> tuple[int, int]:
        """b pings, c sends to b: both while the flood runs."""
        pongs = 0
        for i in range(40):
            pongs += (await db.request("ping"))["op"] == "pong"
            ack = await dc.request("send", to=b, cmid=f"f{i}", body=i)
            assert ack["op"] == "ack", ack
        return pongs, 40

    watcher = asyncio.create_task(watch_heartbeat())
    floods = [asyncio.create_task(flood(proc, f"{a}{k}", 20_000)) for k in range(4)]
    pongs, sent = await others()
    results = await asyncio.gather(*floods)
    stop.set()
    await watcher
    got = [(await db.next_push("msg"))["body"] for _ in range(sent)]
    assert pongs == 40 and got == list(range(sent))  # served, every push live and in order
    for answered, refused, code in results:
        assert code == 1008 and refused > 0  # told, then closed
        assert answered + refused < 20_000  # the node stopped answering the flood
    text = await metrics_of(proc)
    assert sample(text, 'im_closed_total{reason="flood"}') == 4
    assert samples > 0 and lapses == []  # the heartbeat record was never in the past
    assert sample(text, 'im_heartbeats_total{result="held"}') > 0
    assert sample(text, 'im_heartbeats_total{result="lost"}') == 0


POISON = [  # (raw JSON text of the body, what a store could choke on)
    ('{"n":9223372036854775808}', "an integer of 2**63"),
    ('{"n":18446744073709551615}', "the largest u64"),
    ('{"a\\u0000b":1}', "a NUL in an object key"),
    ('"\\ud800"', "a lone surrogate"),
    ('{"k":"\\udfff x"}', "a lone low surrogate in an object"),
    ('{"$where":"1","a.b":{"$gt":""}}', "operator-looking keys"),
]


def _send_frame(op: str, target: tuple[str, str], cmid: str, body: str) -> bytes:
    return (f'{{"op":"{op}","id":"{cmid}","{target[0]}":"{target[1]}",'
            f'"cmid":"{cmid}","body":{body}}}').encode()


async def _poison_run(proc: NodeProcess, op: str, attacker: Device, victim: Device,
                      target: tuple[str, str], victim_target: tuple[str, str],
                      n_valid: int = 200) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The victim sends ``n_valid`` valid messages while the attacker sends every
    poison body (three times each); returns the victim's replies and the
    attacker's replies by cmid."""
    poison_replies: dict[str, Any] = {}

    async def attack() -> None:
        for rnd in range(3):
            for k, (body, _) in enumerate(POISON):
                cmid = f"p{rnd}-{k}"
                poison_replies[cmid] = await attacker.request_text(
                    cmid, _send_frame(op, target, cmid, body))

    async def valid() -> list[dict[str, Any]]:
        to: dict[str, Any] = {victim_target[0]: victim_target[1]}
        return list(await asyncio.gather(*(
            victim.request(op, **to, cmid=f"v{i}", body={"i": i}) for i in range(n_valid))))

    replies, _ = await asyncio.gather(valid(), attack())
    return replies, poison_replies


def _check_poison(poison_replies: dict[str, Any], stored: dict[str, Any]) -> None:
    """Each poison body is refused with bad_request, or stored and read back as sent."""
    for cmid, reply in poison_replies.items():
        body = POISON[int(cmid.split("-")[1])][0]
        if reply["op"] == "error":
            assert reply["code"] == "bad_request", reply
            assert "Traceback" not in reply["message"]
        else:
            assert reply["op"] == "ack", reply
            assert stored[cmid] == json.loads(body), (cmid, stored[cmid])


# Bursts of 200 sends from one user: past the default send budget, not the point here.
BURSTS = {"send_rate": 1000, "send_burst": 1000}


async def test_poison_bodies_fail_only_themselves_in_1to1(node_process):
    proc = await node_process(metrics_public=1, **BURSTS)
    a, b, c = uid("a"), uid("b"), uid("c")
    da, db = await Device.open(proc.ws_port, token(a)), await Device.open(proc.ws_port, token(b))
    replies, poison = await _poison_run(proc, "send", da, db, ("to", c), ("to", c))
    assert [r["op"] for r in replies] == ["ack"] * 200, [r for r in replies if r["op"] != "ack"]
    async with httpx.AsyncClient(base_url=proc.http_url,
                                 headers={"Authorization": f"Bearer {token(c)}"}) as h:
        msgs = await sync_all(h)
        convs = (await h.get("/v1/conversations")).json()
    from_b = [m["body"]["i"] for m in msgs if m["from"] == b]
    assert sorted(from_b) == list(range(200))  # no valid message lost
    acked = {r["mid"] for r in poison.values() if r["op"] == "ack"}
    by_mid = {m["mid"]: m["body"] for m in msgs if m["from"] == a}
    assert set(by_mid) == acked  # nothing stored that was refused, nothing acked lost
    _check_poison(poison, {cmid: by_mid[r["mid"]] for cmid, r in poison.items()
                           if r["op"] == "ack"})
    unread = {x["conv"]: x["unread"] for x in convs["conversations"]}
    assert unread[b] == 200 and unread.get(a, 0) == len(acked)  # counted once each
    assert b"Traceback" not in b"".join(proc.output)


async def test_poison_bodies_leave_no_gap_in_a_group(node_process):
    proc = await node_process(metrics_public=1, **BURSTS)
    a, b, c = uid("a"), uid("b"), uid("c")
    async with httpx.AsyncClient(base_url=proc.http_url,
                                 headers={"Authorization": f"Bearer {token(a)}"}) as h:
        g = (await h.post("/v1/groups", json={"name": "g", "members": [b, c]})).json()["group"]
    da, db = await Device.open(proc.ws_port, token(a)), await Device.open(proc.ws_port, token(b))
    replies, poison = await _poison_run(proc, "group_send", da, db, ("group", g), ("group", g),
                                        n_valid=100)
    assert [r["op"] for r in replies] == ["ack"] * 100
    async with httpx.AsyncClient(base_url=proc.http_url,
                                 headers={"Authorization": f"Bearer {token(c)}"}) as h:
        msgs = [m for m in await sync_all(h) if m.get("group") == g]
        convs = (await h.get("/v1/conversations")).json()
    acked = {r["seq"] for r in [*replies, *poison.values()] if r["op"] == "ack"}
    # Every seq taken belongs to an acked message, and every acked one is read back:
    # no seq burned by another user's bad body, no gap.
    assert sorted(m["seq"] for m in msgs) == list(range(1, len(acked) + 1))
    assert {m["seq"] for m in msgs} == acked
    unread = {x["conv"]: x["unread"] for x in convs["conversations"]}
    assert unread[f"g:{g}"] == len(acked)
    by_seq = {m["seq"]: m.get("body") for m in msgs}
    _check_poison(poison, {cmid: by_seq[r["seq"]] for cmid, r in poison.items()
                           if r["op"] == "ack"})
    assert b"Traceback" not in b"".join(proc.output)


async def test_a_client_that_never_reads_is_closed_and_memory_stays_bounded(node_process):
    # No op budget here: the reply bound itself is under test.
    proc = await node_process(metrics_public=1, op_rate=1e6, op_burst=1_000_000,
                              reply_buffer_max=1 << 20)
    other = await Device.open(proc.ws_port, token(uid("o")))
    before = rss_mb(proc.pid)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", proc.ws_port))
    d = await Device.open(proc.ws_port, token(uid("z")), sock=sock, max_size=None)
    d.stall()
    frame = '{"op":"room_send","room":"not-joined","body":"' + "x" * 200 + '"}'
    sent = 0
    try:
        for _ in range(200_000):  # each refusal's reply is ~100 bytes: ~20 MB unbounded
            await d.ws.send(frame)
            sent += 1
    except Exception:
        pass  # closed by the node: expected
    closed = await until(lambda: _closed_for(proc, "reply_backlog"), timeout=30)
    after = rss_mb(proc.pid)
    # closed by the node before the client was done
    assert closed and sent < 200_000, (sent, [line for line in (await metrics_of(proc))
                                              .splitlines() if "im_closed_total{" in line])
    assert after - before < 40, (before, after)  # the bound is 1 MiB of replies
    assert (await other.request("ping"))["op"] == "pong"


async def _closed_for(proc: NodeProcess, reason: str) -> bool:
    return sample(await metrics_of(proc), f'im_closed_total{{reason="{reason}"}}') == 1


async def test_connections_per_user_are_capped(node_process):
    proc = await node_process(max_conns_per_user=3)
    u = uid("u")
    devices = [await Device.open(proc.ws_port, token(u)) for _ in range(3)]
    with pytest.raises(InvalidStatus) as exc:
        await Device.open(proc.ws_port, token(u))
    assert exc.value.response.status_code == 429
    other = await Device.open(proc.ws_port, token(uid("v")))  # another user is not affected
    assert (await other.request("ping"))["op"] == "pong"
    await devices[0].close()
    again = await Device.open(proc.ws_port, token(u))  # a slot frees when one closes
    assert (await again.request("ping"))["op"] == "pong"
    for d in [*devices[1:], other, again]:
        await d.close()


async def test_recv_ack_flood_is_priced_by_its_mids(node_process):
    proc = await node_process(metrics_public=1)
    d = await Device.open(proc.ws_port, token(uid("r")))
    frame = orjson.dumps({"op": "recv_ack", "id": "ra", "mids": list(range(1, 1001))})
    for _ in range(50):  # 50 x 101 op tokens: far over the 600-token burst
        await d.send_raw(frame.decode())
    refused: list[dict[str, Any]] = []
    async with asyncio.timeout(10):
        while len(refused) < 40:
            refused.append(await d.next_push("error"))
    assert {(e["code"], e["re"]) for e in refused} == {("rate_limited", "ra")}
    text = await metrics_of(proc)
    # 600 tokens and the refill while 50 frames arrive: a handful ran, not 50.
    assert sample(text, 'im_frames_in_total{op="recvack"}') < 10
    assert sample(text, 'im_errors_total{code="rate_limited"}') > 40
