"""The Python SDK's edit, reactions, replies and conversation settings against
real nodes, two of them each time: ``edit`` / ``react`` / ``reply_to`` /
``reaction_users`` / ``set_conversation``, the ``edited`` / ``reaction`` /
``conv_settings`` pushes reaching every device (``Push``), an offline user
seeing the edit and the reactions in the messages its sync delivers
(``Message.edited``, ``.reactions``, ``.reply_to``), in 1:1 conversations and
in small (write diffusion) and big (read diffusion) groups; a push about a
message arriving while a sync is under way told after that message; and an
edit and a recall whose pushes the client missed (its link cut) told from the
sync after its reconnect, each once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from imgate_client import (
    Client,
    Connected,
    ConnectionLost,
    ConvSettings,
    EventQueue,
    HttpError,
    Message,
    Push,
    ReactionUsers,
    ServerError,
)

from router.routing import group_key
from testkit.poll import until
from tests.conftest import settle, token, uid
from tests.integration.sdk.test_python_sdk import messages, push
from tests.integration.sdk.test_python_sdk import sdk as sdk_fixture

sdk = sdk_fixture  # the SDK client factory of test_python_sdk.py, a fixture here too


async def two_nodes(make_node: Any, **kw: Any) -> tuple[Any, Any]:
    n1, n2 = await make_node(**kw), await make_node(**kw)
    await settle(n1, n2)
    return n1, n2


async def connected(*clients: Client) -> None:
    for c in clients:
        await c.connect()


def synced(c: Client) -> tuple[int, dict[int, Message]]:
    """What ``c``'s first connect delivered (its queue so far): how many messages
    its ``Connected`` says the sync delivered, and those Message events by mid."""
    events = c.q.drain()  # type: ignore[attr-defined]
    [up] = [e for e in events if isinstance(e, Connected)]
    got = [e for e in events if isinstance(e, Message)]
    assert {m.via for m in got} <= {"sync"}, got
    return up.synced, {m.mid: m for m in got}


async def push_where(c: Client, op: str, **match: Any) -> dict[str, Any]:
    """The next ``op`` push of ``c`` whose fields include ``match`` (others skipped)."""
    while True:
        frame = await push(c, op)
        if all(frame.get(k) == v for k, v in match.items()):
            return frame


async def history(c: Client, conv: str) -> dict[int, dict[str, Any]]:
    return {m["mid"]: m for m in (await c.http("GET", f"/v1/history/{conv}"))["msgs"]}


async def new_group(owner: Client, members: list[str], *nodes: Any) -> str:
    g = str((await owner.http("POST", "/v1/groups",
                              json={"name": "sdk", "members": members}))["group"])
    # Each node binds its queue to the group's key once the membership control
    # reaches it: until then its members would get the group's pushes by sync only.
    for n in nodes:
        assert await until(lambda n=n: group_key(g) in n.app.bindings.bound, timeout=10)
    return g


# -- edit ------------------------------------------------------------------------------------
async def test_an_edit_reaches_every_device_and_an_offline_user_syncs_it(make_node, sdk):
    n1, n2 = await two_nodes(make_node)
    alice, bob, eve = uid("a"), uid("b"), uid("e")
    a1, a2 = sdk(alice, n1), sdk(alice, n2)
    await connected(a1, a2)
    acks = [await a1.send(bob, {"text": f"m{i}"}) for i in range(3)]
    got = await messages(a2, 3)  # the sender's other device has them too
    assert [m.mid for m in got] == [x.mid for x in acks]
    first, typo, other = (x.mid for x in acks)
    # Edited while bob is offline: alice's devices, on both nodes, are told.
    await a1.edit(typo, {"text": "fixed"})
    edits = [await push(d, "edited") for d in (a1, a2)]
    assert edits[0] == edits[1]
    assert {k: edits[0][k] for k in ("mid", "conv", "body")} == {
        "mid": typo, "conv": bob, "body": {"text": "fixed"}}
    at = edits[0]["edited"]
    assert isinstance(at, int) and at > 0
    # ... and reacted to, by alice herself (bob has not seen it yet).
    await a2.react(typo, "👍")
    for d in (a1, a2):
        assert (await push(d, "reaction"))["emoji"] == "👍"
    # bob comes online on the other node: his sync has the edited message.
    b = sdk(bob, n2)
    await b.connect()
    count, seen = synced(b)
    assert count == 3 and list(seen) == [first, typo, other]
    assert (seen[typo].body, seen[typo].edited) == ({"text": "fixed"}, at)
    assert seen[typo].reactions == {"👍": 1}
    assert seen[first].edited is None and seen[first].reactions == {}
    assert seen[first].body == {"text": "m0"}
    # Online now: a second edit reaches bob on n2 from alice's device on n1.
    await a1.edit(typo, "again")
    again = await push(b, "edited")
    assert (again["mid"], again["conv"], again["body"]) == (typo, alice, "again")
    assert again["edited"] > at
    assert (await history(b, alice))[typo]["body"] == "again"
    # Refusals, as ServerError with the node's code.
    with pytest.raises(ServerError) as no:
        await b.edit(typo, "mine now")  # only the sender
    assert no.value.code == "forbidden"
    with pytest.raises(ServerError) as no:
        await a1.edit(other + 12345, "x")
    assert no.value.code == "not_found"
    e = sdk(eve, n1)
    await e.connect()
    with pytest.raises(ServerError) as no:
        await e.edit(typo, "x")
    assert no.value.code == "forbidden"
    await a1.recall(first)
    assert (await push(b, "recalled"))["mid"] == first
    with pytest.raises(ServerError) as no:
        await a1.edit(first, "back")  # never after a recall
    assert no.value.code == "forbidden"
    assert "body" not in (await history(b, alice))[first]


async def test_the_edit_window_closes(make_node, sdk):
    n1, n2 = await two_nodes(make_node, edit_window_s=1.0)
    alice, bob = uid("a"), uid("b")
    a, b = sdk(alice, n1), sdk(bob, n2)
    await connected(a, b)
    ack = await a.send(bob, "typo")
    await asyncio.sleep(1.1)  # past the window (a time limit, not a race)
    with pytest.raises(ServerError) as late:
        await a.edit(ack.mid, "late")
    assert (late.value.code, late.value.message) == ("forbidden", "the edit window has passed")
    [m] = await messages(b, 1)
    assert m.body == "typo" and m.edited is None


# -- reactions -------------------------------------------------------------------------------
async def test_reactions_are_pushed_counted_listed_and_synced(make_node, sdk):
    n1, n2 = await two_nodes(make_node, reaction_emoji_max=3)
    alice, bob, eve = uid("a"), uid("b"), uid("e")
    a1, a2, b = sdk(alice, n1), sdk(alice, n2), sdk(bob, n2)
    await connected(a1, a2, b)
    mid = (await a1.send(bob, "hello")).mid
    await messages(b, 1)
    await b.react(mid, "👍")
    want = {"op": "reaction", "mid": mid, "conv": bob, "from": bob, "emoji": "👍", "on": True}
    for d in (a1, a2):
        assert await push(d, "reaction") == want
    mine = await push(b, "reaction")  # the reacting device is told too
    assert (mine["conv"], mine["from"]) == (alice, bob)
    await a1.react(mid, "👍", on=True)
    for d in (a1, a2, b):
        got = await push(d, "reaction")
        assert (got["from"], got["emoji"], got["on"]) == (alice, "👍", True)
    # The same state again changes and pushes nothing: the next push is 🎉's.
    await b.react(mid, "👍")
    await b.react(mid, "🎉")
    for d in (a1, a2):
        assert (await push(d, "reaction"))["emoji"] == "🎉"
    # Who reacted, paged, asked of either node.
    page = await a2.reaction_users(mid, "👍", limit=1)
    assert isinstance(page, ReactionUsers) and len(page.users) == 1
    assert page.cursor == page.users[0]
    rest = await a1.reaction_users(mid, "👍", cursor=page.cursor, limit=1)
    assert sorted(page.users + rest.users) == sorted([alice, bob]) and rest.cursor is None
    assert await b.reaction_users(mid, "🎉") == ReactionUsers([bob], None)
    assert (await b.reaction_users(mid, "🚀")).users == []
    # Off; the emoji cap (3 here); a stranger; bad input.
    await b.react(mid, "🎉", on=False)
    off = await push(a2, "reaction")
    assert (off["emoji"], off["on"]) == ("🎉", False)
    await b.react(mid, "x")
    await b.react(mid, "y")
    with pytest.raises(ServerError) as full:
        await b.react(mid, "z")
    assert full.value.code == "forbidden" and "3 distinct emoji" in full.value.message
    e = sdk(eve, n1)
    await e.connect()
    with pytest.raises(ServerError) as no:
        await e.react(mid, "👍")
    assert no.value.code == "not_found"
    with pytest.raises(HttpError) as hidden:
        await e.reaction_users(mid, "👍")
    assert hidden.value.status == 404
    with pytest.raises(ServerError) as bad:
        await b.react(mid, "")
    assert bad.value.code == "bad_request"
    assert (await history(b, alice))[mid]["reactions"] == {"👍": 2, "x": 1, "y": 1}
    # A recalled message takes none.
    await a1.recall(mid)
    with pytest.raises(ServerError) as gone:
        await b.react(mid, "👍", on=False)
    assert gone.value.code == "forbidden"


# -- replies ---------------------------------------------------------------------------------
async def test_reply_to_is_sent_pushed_synced_and_kept_within_its_conversation(make_node,
                                                                               sdk):
    n1, n2 = await two_nodes(make_node)
    alice, bob, carol = uid("a"), uid("b"), uid("c")
    a, b = sdk(alice, n1), sdk(bob, n2)
    await connected(a, b)
    question = (await a.send(bob, "question?")).mid
    elsewhere = (await a.send(carol, "other")).mid
    [q] = await messages(b, 1)
    assert q.mid == question and q.reply_to is None
    answer = await b.send(alice, "answer", reply_to=question)
    [got] = await messages(a, 1)
    assert (got.mid, got.reply_to, got.body) == (answer.mid, question, "answer")
    assert answer.frame["op"] == "ack"
    hist = await history(a, bob)
    assert hist[answer.mid]["reply_to"] == question and "reply_to" not in hist[question]
    # Another conversation's mid, or none at all: refused for good, nothing stored.
    for wrong in (elsewhere, question + 999):
        with pytest.raises(ServerError) as refused:
            await b.send(alice, "x", reply_to=wrong)
        assert refused.value.code == "bad_request"
    assert set(await history(b, alice)) == {question, answer.mid}
    # carol, offline, syncs a reply to the message she got.
    reply = await a.send(carol, "and this", reply_to=elsewhere)
    c = sdk(carol, n2)
    await c.connect()
    _, seen = synced(c)
    assert seen[reply.mid].reply_to == elsewhere and seen[elsewhere].reply_to is None


# -- groups ----------------------------------------------------------------------------------
@pytest.mark.parametrize("diffusion", ["write", "read"])
async def test_group_edits_reactions_and_replies(make_node, sdk, diffusion):
    # At most 3 members: write diffusion (each member's offline store); above: read.
    n1, n2 = await two_nodes(make_node, group_write_diffusion_max=3 if diffusion == "write"
                             else 2)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a, b, d = sdk(alice, n1), sdk(bob, n2), sdk(dave, n1)
    await connected(a, b, d)
    g = await new_group(a, [bob, carol], n1, n2)
    conv = f"g:{g}"
    post = await a.group_send(g, {"text": "vote?"})
    [got] = await messages(b, 1)
    assert (got.mid, got.reply_to) == (post.mid, None)
    reply = await b.group_send(g, "yes", reply_to=post.mid)
    [back] = await messages(a, 1)
    assert (back.mid, back.reply_to, back.group) == (reply.mid, post.mid, g)
    # Edited by its sender on n1: the member on n2 is told.
    await a.edit(post.mid, {"text": "vote now"})
    edited = await push(b, "edited")
    assert (edited["mid"], edited["conv"], edited["body"]) == (post.mid, conv,
                                                               {"text": "vote now"})
    assert (await push(a, "edited"))["mid"] == post.mid
    # Reacted to from n2: the sender on n1 is told.
    await b.react(post.mid, "+1")
    assert await push(a, "reaction") == {"op": "reaction", "mid": post.mid, "conv": conv,
                                         "from": bob, "emoji": "+1", "on": True}
    await a.react(post.mid, "+1")
    assert (await push_where(b, "reaction", **{"from": alice}))["mid"] == post.mid
    # Not a member: neither reply, reaction nor edit.
    with pytest.raises(ServerError) as no:
        await d.react(post.mid, "+1")
    assert no.value.code == "not_found"
    with pytest.raises(ServerError) as no:
        await b.group_send(g, "re", reply_to=reply.mid + 999)
    assert no.value.code == "bad_request"
    assert await b.reaction_users(post.mid, "+1") == ReactionUsers(sorted([alice, bob]), None)
    # carol was offline throughout: her sync has the edit, the counts and the reply.
    c = sdk(carol, n2)
    await c.connect()
    count, seen = synced(c)
    assert count == 2 and seen[post.mid].body == {"text": "vote now"}
    assert seen[post.mid].edited == edited["edited"]
    assert seen[post.mid].reactions == {"+1": 2} and seen[post.mid].conv == conv
    assert seen[reply.mid].reply_to == post.mid and seen[reply.mid].reactions == {}


# -- conversation settings -------------------------------------------------------------------
async def test_conversation_settings_reach_every_device_and_pin_first(make_node, sdk):
    n1, n2 = await two_nodes(make_node, pinned_max=2)
    alice, bob, carol, dave = uid("a"), uid("b"), uid("c"), uid("d")
    a1, a2 = sdk(alice, n1), sdk(alice, n2)
    peers = {p: sdk(p, n2) for p in (bob, carol, dave)}
    await connected(a1, a2, *peers.values())
    for p, c in peers.items():  # bob's is the oldest conversation, dave's the newest
        await c.send(alice, f"from {p}")
        await messages(a1, 1)
    got = await a1.set_conversation(bob, pinned=True)
    assert got == ConvSettings(bob, muted=False, pinned=True, archived=False)
    want = {"op": "conv_settings", "conv": bob, "muted": False, "pinned": True,
            "archived": False}
    for d in (a1, a2):
        frame = await push(d, "conv_settings")
        assert frame == want and ConvSettings.of(frame) == got
    listed = await a2.http("GET", "/v1/conversations", params={"limit": 1})
    assert [r["conv"] for r in listed["conversations"]] == [bob, dave]
    assert (listed["conversations"][0]["pinned"], listed["conversations"][1]["pinned"]) \
        == (True, False)
    # Only what is given changes.
    assert await a2.set_conversation(bob, muted=True, archived=True) == ConvSettings(
        bob, muted=True, pinned=True, archived=True)
    assert await a1.set_conversation(bob, pinned=False) == ConvSettings(
        bob, muted=True, pinned=False, archived=True)
    pushed = [ConvSettings.of(await push(a1, "conv_settings")) for _ in range(2)]
    assert pushed[-1] == ConvSettings(bob, muted=True, pinned=False, archived=True)
    # A group (g:GROUP in the path); refusals come as HttpError.
    g = await new_group(peers[carol], [alice], n2)
    assert await a2.set_conversation(f"g:{g}", muted=True) == ConvSettings(
        f"g:{g}", muted=True, pinned=False, archived=False)
    frame = await push(a1, "conv_settings")
    assert (frame["conv"], frame["muted"]) == (f"g:{g}", True)
    rows = {r["conv"]: r for r in (await a1.http("GET", "/v1/conversations"))["conversations"]}
    assert (rows[f"g:{g}"]["muted"], rows[bob]["archived"], rows[carol]["muted"]) \
        == (True, True, False)
    other = await new_group(peers[carol], [bob], n2)
    with pytest.raises(HttpError) as no:
        await a1.set_conversation(f"g:{other}", muted=True)
    assert no.value.status == 403
    with pytest.raises(HttpError) as no:
        await a1.set_conversation(alice, muted=True)
    assert no.value.status == 400
    await a1.set_conversation(carol, pinned=True)
    await a1.set_conversation(dave, pinned=True)
    with pytest.raises(HttpError) as no:
        await a1.set_conversation(f"g:{g}", pinned=True)  # past IM_PINNED_MAX (2)
    assert no.value.status == 403 and "IM_PINNED_MAX" in no.value.message


# -- ordering and missed pushes ---------------------------------------------------------------
async def test_an_edit_pushed_during_a_sync_is_told_after_its_message(make_node, sdk):
    """bob's first sync page is read, and its answer held up, while alice sends a
    message, edits it and reacts to it: the message's push is held with the sync,
    and so are the ``edited`` and ``reaction`` pushes, told after the message,
    never before it."""
    n1, n2 = await two_nodes(make_node)
    alice, bob = uid("a"), uid("b")
    a = sdk(alice, n1)
    await a.connect()
    b = sdk(bob, n2)
    gate, asked = asyncio.Event(), asyncio.Event()
    plain = b.http

    async def slow_sync(method: str, path: str, **kw: Any) -> Any:
        answer = await plain(method, path, **kw)
        if path == "/v1/sync" and not gate.is_set():
            asked.set()
            await gate.wait()  # read before the message was sent: it is not in it
        return answer

    b.http = slow_sync  # type: ignore[method-assign]
    arrived: list[str] = []  # the ops of the pushes that reached bob's client
    on_frame = b._on_frame

    def spy(f: dict[str, Any]) -> None:
        arrived.append(str(f.get("op")))
        on_frame(f)

    b._on_frame = spy  # type: ignore[method-assign]
    connecting = asyncio.create_task(b.connect())
    await asyncio.wait_for(asked.wait(), 10)
    mid = (await a.send(bob, "tpyo")).mid
    await a.edit(mid, "typo")
    await a.react(mid, "ok")
    # The three pushes reached bob's client, and wait there with the sync.
    assert await until(lambda: "reaction" in arrived, timeout=10)
    assert [op for op in arrived if op in ("msg", "edited", "reaction")] == [
        "msg", "edited", "reaction"]
    assert not [e for e in b.q._items if isinstance(e, (Message, Push))]  # type: ignore
    gate.set()
    await connecting
    told = [e for e in b.q.drain() if isinstance(e, (Message, Push))]  # type: ignore
    assert [(type(e).__name__, e.op) for e in told] == [
        ("Message", "msg"), ("Push", "edited"), ("Push", "reaction")]
    m, edited = told[0], told[1]
    assert isinstance(m, Message) and (m.mid, m.via, m.body) == (mid, "push", "tpyo")
    assert isinstance(edited, Push) and edited.frame["body"] == "typo"
    # Told once: the next sync brings the message edited, as already told.
    assert await b.sync() == 0
    await asyncio.sleep(0.2)
    assert not [e for e in b.q.drain() if isinstance(e, (Message, Push))]  # type: ignore


async def test_an_edit_and_a_recall_missed_while_away_are_told_after_the_sync(
        make_node, proxy, sdk):
    """bob's client got three messages by push, then lost its link (a proxy cut)
    while alice edited one and recalled another: the pushes are lost, but its
    sync after the reconnect brings those messages again, changed, and the client
    tells each change as the push would have (each once, no message twice)."""
    n1, n2 = await two_nodes(make_node)
    link = await proxy(n2.ws_port)
    alice, bob = uid("a"), uid("b")
    a = sdk(alice, n1)
    q = EventQueue()
    b = Client([f"ws://127.0.0.1:{link.port}/ws"], http_urls=[f"http://127.0.0.1:{n2.http_port}"],
               token=token(bob), on_event=q)
    try:
        await connected(a, b)
        mids = [(await a.send(bob, f"m{i}")).mid for i in range(3)]
        assert [(await q.next(Message)).mid for _ in mids] == mids
        assert b.cursor < mids[0]  # pushes do not move it: the sync will bring them again
        link.cut()
        await q.next(ConnectionLost)
        await a.edit(mids[0], "m0 fixed")
        at = (await push(a, "edited"))["edited"]
        await a.recall(mids[1])
        await a.react(mids[2], "ok")  # a change of counts: not told (see the README)
        link.restore()
        up = await q.next(Connected, Push, timeout=20)
        changes = []
        while not isinstance(up, Connected):
            changes.append(up.frame)
            up = await q.next(Connected, Push, timeout=20)
        assert up.reconnect and up.synced == 0
        assert changes == [
            {"op": "edited", "mid": mids[0], "conv": alice, "body": "m0 fixed", "edited": at},
            {"op": "recalled", "mid": mids[1], "conv": alice, "by": alice}]
        assert await b.sync() == 0
        await asyncio.sleep(0.2)
        assert not [e for e in q.drain() if isinstance(e, (Message, Push))]
    finally:
        await b.close()
