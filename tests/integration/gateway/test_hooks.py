"""Hooks (gateway/hooks/client.py) on real nodes against a real local hook
server (testkit/hook_server.py): allow, rewrite (the stored, delivered,
synced and history body is the rewritten one), reject (nothing stored, the
client's error carries the message), a timeout and a failure under both
failure modes, a resent cmid not hooked twice, group and server API sends,
``room_send`` and ``join``; and a hook that takes 2 s holds only the calls
waiting for it: another user's sends are acked meanwhile."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from testkit.hook_server import HookServer
from testkit.poll import until
from tests.conftest import uid

SECRET = b"hook-secret-0123456789"
KEY = "k-" + "0123456789abcdef" * 2
EXAMPLE = Path(__file__).resolve().parents[3] / "docs/examples/profanity_hook.py"


def rules(payload: dict[str, Any]) -> Any:
    """A profanity filter, a spam rule, and a slow and a broken case."""
    body = payload.get("body")
    text = body if isinstance(body, str) else ""
    if payload.get("room") == "closed-room":
        return {"action": "reject", "message": "this room is closed"}
    if "spam" in text:
        return {"action": "reject", "message": "no spam here"}
    if "darn" in text:
        return {"action": "allow", "body": text.replace("darn", "****")}
    if text == "slow":
        return asyncio.sleep(2, {"action": "allow"})
    if text == "broken":
        return None  # 500
    return {"action": "allow"}


@pytest.fixture
async def hook():
    server = await HookServer(SECRET, rules).start()
    yield server
    await server.close()


def hooked(hook: HookServer, **kw: Any) -> dict[str, Any]:
    return {"hook_url": hook.url, "hook_secret": SECRET.decode(), **kw}


async def test_allow_rewrite_and_reject_of_a_send(make_node, connect, http, hook):
    node = await make_node(**hooked(hook))
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    ok = await ca.request("send", to=b, cmid="c1", body="hello")
    assert ok["op"] == "ack"
    assert (await cb.next_push("msg"))["body"] == "hello"
    rewritten = await ca.request("send", to=b, cmid="c2", body="darn it")
    assert rewritten["op"] == "ack"
    assert (await cb.next_push("msg"))["body"] == "**** it"
    refused = await ca.request("send", to=b, cmid="c3", body="buy spam")
    assert (refused["op"], refused["code"], refused["message"]) == (
        "error", "forbidden", "no spam here")
    assert [c["cmid"] for c in hook.calls] == ["c1", "c2", "c3"]
    assert hook.calls[0] == {"hook": "send", "user": a, "to": b, "cmid": "c1", "body": "hello"}
    assert hook.bad_signatures == 0
    # What is stored is what the hook said: sync and history; the refused one nowhere.
    sync = (await http(b, node).get("/v1/sync", params={"since": 0})).json()
    assert [m["body"] for m in sync["msgs"]] == ["hello", "**** it"]
    hist = (await http(a, node).get(f"/v1/history/{b}")).json()
    assert sorted(m["body"] for m in hist["msgs"]) == ["**** it", "hello"]
    # A resend of an acked cmid answers its mid and does not call the hook again.
    again = await ca.request("send", to=b, cmid="c2", body="darn it")
    assert again["mid"] == rewritten["mid"] and len(hook.calls) == 3


async def test_group_and_server_api_sends_are_hooked_too(make_node, connect, http, hook):
    node = await make_node(**hooked(hook, api_keys=KEY))
    a, b = uid("a"), uid("b")
    group = (await http(a, node).post("/v1/groups", json={"name": "g", "members": [b]})
             ).json()["group"]
    ca, cb = await connect(node, a), await connect(node, b)
    assert (await ca.request("group_send", group=group, cmid="g1", body="darn"))["op"] == "ack"
    assert (await cb.next_push("group_msg"))["body"] == "****"
    refused = await ca.request("group_send", group=group, cmid="g2", body="spam")
    assert refused["code"] == "forbidden" and refused["message"] == "no spam here"
    assert hook.calls[0]["group"] == group and "to" not in hook.calls[0]
    async with httpx.AsyncClient(trust_env=False, timeout=10) as c:
        r = await c.post(f"http://127.0.0.1:{node.http_port}/v1/server/send",
                         headers={"X-API-Key": KEY},
                         json={"from": a, "to": b, "cmid": "s1", "body": "darn"})
        assert r.status_code == 200, r.text
        r = await c.post(f"http://127.0.0.1:{node.http_port}/v1/server/send",
                         headers={"X-API-Key": KEY},
                         json={"from": a, "to": b, "cmid": "s2", "body": "spam"})
        assert r.status_code == 403 and r.json()["error"]["message"] == "no spam here"
    assert (await cb.next_push("msg"))["body"] == "****"


@pytest.mark.parametrize("failure", ["closed", "open"])
async def test_a_hook_that_times_out_or_fails_under_each_mode(make_node, connect, http, hook,
                                                              failure):
    node = await make_node(**hooked(hook, hook_timeout_ms=300, hook_failure=failure))
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    slow = await ca.request("send", to=b, cmid="t1", body="slow")
    broken = await ca.request("send", to=b, cmid="t2", body="broken")
    stored = [m["body"] for m in
              (await http(b, node).get("/v1/sync", params={"since": 0})).json()["msgs"]]
    if failure == "closed":  # nothing stored, the client may retry
        assert slow["code"] == "unavailable" and broken["code"] == "unavailable"
        assert stored == []
    else:
        assert slow["op"] == "ack" and broken["op"] == "ack"
        assert stored == ["slow", "broken"]
    outcomes = {s.labels["outcome"]: s.value for s in next(
        m for m in node.metrics.registry.collect() if m.name == "im_hook_calls").samples
        if s.name == "im_hook_calls_total"}
    assert outcomes == {"timeout": 1.0, "error": 1.0}


async def test_room_send_and_join_hooks(make_node, connect, hook):
    node = await make_node(**hooked(hook, hooks="room_send,join"))
    a = uid("a")
    ca = await connect(node, a)
    refused = await ca.request("join", room="closed-room")
    assert refused["code"] == "forbidden" and refused["message"] == "this room is closed"
    assert (await ca.request("join", room="open-room"))["op"] == "joined"
    assert (await ca.request("room_send", room="open-room", body="darn"))["op"] == "ok"
    got = await ca.next_push("room_msgs")
    assert [m["body"] for m in got["msgs"]] == ["****"]
    refused = await ca.request("room_send", room="open-room", body="spam")
    assert refused["code"] == "forbidden"
    # 1:1 sends are not hooked here (IM_HOOKS has no send).
    assert (await ca.request("send", to=uid("b"), cmid="x", body="spam"))["op"] == "ack"
    assert [c["hook"] for c in hook.calls] == ["join", "join", "room_send", "room_send"]


async def test_a_two_second_hook_holds_only_the_calls_waiting_for_it(make_node, connect, hook):
    """While one user's hooked room message waits 2 s for its hook, another
    user's (unhooked) 1:1 sends are acked, every one, before that hook answers."""
    node = await make_node(**hooked(hook, hooks="room_send", hook_timeout_ms=5000))
    a, b, c = uid("a"), uid("b"), uid("c")
    ca, cb = await connect(node, a), await connect(node, b)
    assert (await ca.request("join", room="r"))["op"] == "joined"
    waiting = asyncio.ensure_future(ca.request("room_send", room="r", body="slow"))
    assert await until(lambda: len(hook.calls) == 1, timeout=5)
    acks = [await cb.request("send", to=c, cmid=f"m{i}", body=i) for i in range(20)]
    assert all(x["op"] == "ack" for x in acks)
    assert not waiting.done()  # the hook has not answered yet
    assert (await waiting)["op"] == "ok"


async def test_the_documented_example_hook_runs_in_one_command(make_node, connect):
    """docs/examples/profanity_hook.py, started as the docs say, filters and rejects."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    secret = "change-me-0123456789"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), "--port", str(port),
        env={"IM_HOOK_SECRET": secret, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 10)
        assert line.decode().startswith(f"profanity hook on http://127.0.0.1:{port}/hook")
        node = await make_node(hook_url=f"http://127.0.0.1:{port}/hook", hook_secret=secret)
        a, b = uid("a"), uid("b")
        ca, cb = await connect(node, a), await connect(node, b)
        assert (await ca.request("send", to=b, cmid="e1", body="what the heck"))["op"] == "ack"
        assert (await cb.next_push("msg"))["body"] == "what the ****"
        refused = await ca.request("send", to=b, cmid="e2", body="see http://spam.example/x")
        assert refused["code"] == "forbidden"
        assert refused["message"] == "links to that site are not allowed"
    finally:
        proc.kill()
        await proc.wait()


async def test_an_edit_goes_through_the_send_hook(make_node, connect, http, hook):
    node = await make_node(**hooked(hook))
    a, b = uid("a"), uid("b")
    ca, cb = await connect(node, a), await connect(node, b)
    sent = await ca.request("send", to=b, cmid="c1", body="hello")
    await cb.next_push("msg")
    refused = await ca.request("edit", mid=sent["mid"], body="buy spam")
    assert (refused["code"], refused["message"]) == ("forbidden", "no spam here")
    assert (await ca.request("edit", mid=sent["mid"], body="darn"))["op"] == "ok"
    assert (await cb.next_push("edited"))["body"] == "****"
    assert hook.calls[-1] == {"hook": "send", "user": a, "to": b, "cmid": "c1",
                              "edit": sent["mid"], "body": "darn"}
    hist = (await http(b, node).get(f"/v1/history/{a}")).json()["msgs"]
    assert [m["body"] for m in hist] == ["****"]
