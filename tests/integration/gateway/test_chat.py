"""1:1 chat end to end on one node: real Redis, real MongoDB-compatible server."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import uid


async def test_two_users_chat_and_offline_user_syncs(node, connect, http, mongo_db):
    a, b, c = uid("a"), uid("b"), uid("c")
    ca, cb = await connect(node, a), await connect(node, b)

    ack = await ca.request("send", to=b, cmid="m1", body={"text": "hi b"})
    assert ack["op"] == "ack" and ack["cmid"] == "m1" and isinstance(ack["mid"], int)
    push = await cb.next_push("msg")
    assert push == {"op": "msg", "mid": ack["mid"], "from": a, "to": b,
                    "body": {"text": "hi b"}, "ts": ack["ts"]}
    back = await cb.request("send", to=a, cmid="m1", body="hi a")
    assert (await ca.next_push("msg"))["mid"] == back["mid"]

    # Five messages to the offline user c, from two senders, interleaved.
    sent = []
    for i in range(5):
        sender = ca if i % 2 == 0 else cb
        r = await sender.request("send", to=c, cmid=f"to-c-{i}", body={"n": i})
        assert r["op"] == "ack"
        sent.append(r["mid"])
    assert sent == sorted(sent)

    hc = http(c)
    page = (await hc.get("/v1/sync", params={"since": 0})).json()
    assert [m["mid"] for m in page["msgs"]] == sent
    assert [m["body"]["n"] for m in page["msgs"]] == [0, 1, 2, 3, 4]
    assert page["more"] is False

    convs = (await hc.get("/v1/conversations")).json()
    assert convs["total_unread"] == 5
    unread = {x["conv"]: x["unread"] for x in convs["conversations"]}
    assert unread == {a: 3, b: 2}
    last = {x["conv"]: x["last"]["mid"] for x in convs["conversations"]}
    assert last == {a: sent[4], b: sent[3]}

    # c connects and reads a's conversation up to a's second message (over WS) ...
    cc = await connect(node, c)
    ok = await cc.request("read", conv=a, mid=sent[2])
    assert ok == {"op": "ok", "re": ok["re"]}
    convs = (await hc.get("/v1/conversations")).json()
    assert convs["total_unread"] == 3
    assert {x["conv"]: x["unread"] for x in convs["conversations"]} == {a: 1, b: 2}
    # ... and all of b's over HTTP.
    r = await hc.post(f"/v1/conversations/{b}/read", json={"mid": sent[3]})
    assert r.json() == {"ok": True}
    convs = (await hc.get("/v1/conversations")).json()
    assert convs["total_unread"] == 1
    assert {x["conv"]: x["unread"] for x in convs["conversations"]} == {a: 1, b: 0}

    # The sender's side knows the conversation too, with nothing unread.
    convs_a = (await http(a).get("/v1/conversations")).json()
    assert convs_a["total_unread"] == 1  # b's "hi a"
    assert {x["conv"]: x["unread"] for x in convs_a["conversations"]} == {b: 1, c: 0}

    stored = await mongo_db.messages.count_documents({"to": c})
    assert stored == 5
    assert await mongo_db.boxes.count_documents({"owner": c}) == 5


async def test_resent_cmid_gets_original_mid_and_stores_nothing(node, connect, http, mongo_db):
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    first = await ca.request("send", to=b, cmid="same", body="once")
    again = await ca.request("send", to=b, cmid="same", body="twice?")
    assert again["op"] == "ack" and again["mid"] == first["mid"] and again["ts"] == first["ts"]
    assert await mongo_db.messages.count_documents({"from": a}) == 1
    assert await mongo_db.boxes.count_documents({"owner": b}) == 1
    page = (await http(b).get("/v1/sync")).json()
    assert [m["body"] for m in page["msgs"]] == ["once"]
    convs = (await http(b).get("/v1/conversations")).json()
    assert convs["total_unread"] == 1


async def test_concurrent_resends_of_one_cmid_count_once(node, connect, http, mongo_db):
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    acks = await asyncio.gather(*(ca.request("send", to=b, cmid="race", body=i)
                                  for i in range(8)))
    assert len({x["mid"] for x in acks}) == 1
    assert await mongo_db.messages.count_documents({"from": a}) == 1
    assert (await http(b).get("/v1/conversations")).json()["total_unread"] == 1


async def test_sender_other_devices_get_the_message(node, connect):
    a, b = uid("a"), uid("b")
    a1, a2, b1 = await connect(node, a), await connect(node, a), await connect(node, b)
    ack = await a1.request("send", to=b, cmid="x", body="multi")
    assert (await a2.next_push("msg"))["mid"] == ack["mid"]
    assert (await b1.next_push("msg"))["mid"] == ack["mid"]
    await a1.request("ping")  # a1 gets no copy of its own message
    assert a1.pushes.empty()


async def test_sync_retry_of_same_cursor_returns_same_page(node, connect, http):
    a, c = uid("a"), uid("c")
    ca = await connect(node, a)
    for i in range(5):
        await ca.request("send", to=c, cmid=f"p{i}", body=i)
    hc = http(c)
    first = (await hc.get("/v1/sync", params={"since": 0, "limit": 2})).json()
    retry = (await hc.get("/v1/sync", params={"since": 0, "limit": 2})).json()
    assert first == retry
    second = (await hc.get("/v1/sync", params={"since": first["next"], "limit": 2})).json()
    assert second == (await hc.get("/v1/sync", params={"since": first["next"],
                                                       "limit": 2})).json()
    assert {m["mid"] for m in first["msgs"]}.isdisjoint(m["mid"] for m in second["msgs"])


async def test_history_is_newest_first_and_pages(node, connect, http):
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    mids = [(await ca.request("send", to=b, cmid=f"h{i}", body=i))["mid"] for i in range(5)]
    ha = http(a)
    page = (await ha.get(f"/v1/history/{b}", params={"limit": 3})).json()
    assert [m["mid"] for m in page["msgs"]] == mids[::-1][:3]
    assert page["next"] == mids[2]
    rest = (await ha.get(f"/v1/history/{b}", params={"before": page["next"]})).json()
    assert [m["mid"] for m in rest["msgs"]] == mids[1::-1] and rest["next"] is None
    # b sees the same conversation from the other side.
    assert len((await http(b).get(f"/v1/history/{a}")).json()["msgs"]) == 5


async def test_healthz_metrics_and_openapi(node, http):
    h = http(uid())
    assert (await h.get("/healthz")).status_code == 200
    assert (await h.get("/metrics")).status_code == 404  # not on the API port by default
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.metrics_port}") as m:
        text = (await m.get("/metrics")).text
    assert "im_connections" in text and "im_sends_total" in text
    spec = (await h.get("/openapi.json")).json()
    assert "/v1/sync" in spec["paths"]


async def test_every_store_command_is_timed_by_command_and_collection(node, connect, http):
    a, b = uid("a"), uid("b")
    ack = await (await connect(node, a)).request("send", to=b, cmid="c1", body="hi")
    assert ack["op"] == "ack", ack
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.metrics_port}") as m:
        text = (await m.get("/metrics")).text
    # The send's body insert, counted once at least, as a success.
    insert = [line for line in text.splitlines() if line.startswith(
        'im_store_command_seconds_count{collection="messages",command="insert",outcome="ok"')]
    assert insert and float(insert[0].split()[-1]) >= 1
    # b's history is read from its box, by owner and conv, newest first: the
    # shape names the fields (not their values).
    assert (await http(b).get(f"/v1/history/{a}")).status_code == 200
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{node.metrics_port}") as m:
        text = (await m.get("/metrics")).text
    assert ('im_store_command_seconds_count{collection="boxes",command="find",'
            'outcome="ok",shape="conv,owner sort mid:-1"}') in text


async def test_the_conversation_list_keeps_a_cut_preview_of_a_large_message(
        node, connect, http):
    a, b = uid("a"), uid("b")
    ca = await connect(node, a)
    text = "x" * 3000
    ack = await ca.request("send", to=b, cmid="big", body={"text": text, "extra": "y" * 100})
    assert ack["op"] == "ack", ack
    [row] = (await http(b).get("/v1/conversations")).json()["conversations"]
    assert row["last"]["mid"] == ack["mid"] and row["last"]["truncated"] is True
    assert row["last"]["body"] == {"text": "x" * 200}
    # Sync and history keep the message as sent.
    page = (await http(b).get("/v1/sync", params={"since": 0})).json()
    assert page["msgs"][0]["body"] == {"text": text, "extra": "y" * 100}
    small = await ca.request("send", to=b, cmid="small", body="hi")
    [row] = (await http(b).get("/v1/conversations")).json()["conversations"]
    assert row["last"]["mid"] == small["mid"] and "truncated" not in row["last"]
