"""A user's send and op budgets, and its ops in flight, are the user's on a
node, whatever the number of its connections: more connections never buy more."""

from __future__ import annotations

from tests.conftest import uid


async def test_connections_of_one_user_share_its_send_budget(make_node, connect):
    node = await make_node(send_rate=0.01, send_burst=4)
    a, b = uid("a"), uid("b")
    first, second = await connect(node, a), await connect(node, a)
    answers = [await (first if i % 2 else second).request("send", to=b, cmid=f"c{i}", body=i)
               for i in range(6)]
    assert [r["op"] for r in answers] == ["ack"] * 4 + ["error"] * 2
    assert {r["code"] for r in answers[4:]} == {"rate_limited"}
    # Another user's budget is its own.
    other = await connect(node, uid("c"))
    assert (await other.request("send", to=b, cmid="x", body=0))["op"] == "ack"
    # The budget lives while a connection of the user does: a third one shares it.
    third = await connect(node, a)
    assert (await third.request("send", to=b, cmid="c9", body=9))["code"] == "rate_limited"


async def test_connections_of_one_user_share_its_op_budget(make_node, connect):
    node = await make_node(op_rate=0.01, op_burst=6)
    a = uid("a")
    conns = [await connect(node, a) for _ in range(3)]
    answers = [await conns[i % 3].request("ping") for i in range(9)]
    assert [r["op"] for r in answers].count("pong") == 6
    assert [r.get("code") for r in answers if r["op"] == "error"] == ["rate_limited"] * 3
