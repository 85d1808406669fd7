"""The Python SDK (``clients/python``, ``imgate_client.Client``) against real nodes:
1:1 across nodes, sync of an offline user (each message once), a node killed
mid-conversation (the client moves on, in-flight sends resent with the same
cmid, nothing lost or doubled), groups, receipts, typing, presence, rooms
rejoined with ``since``, and the close codes (4001 -> get_token -> reconnect,
4003 -> stopped, drain -> move on)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jwt
import pytest
from imgate_client import (
    Client,
    ClientStopped,
    Connected,
    ConnectionLost,
    EventQueue,
    Message,
    Push,
    RoomMessages,
    RoomRejoined,
    Stopped,
)

from router.routing import group_key
from store.keys import Keys
from testkit.poll import until
from tests.conftest import RUN_NS, SECRET, settle, token, uid

FAST_HEARTBEAT = {"heartbeat_s": 0.5, "heartbeat_ttl_s": 2.0}
UNCAPPED = {"room_rate_cap": 0, "room_send_rate": 1e6, "room_send_burst": 1_000_000}
API_KEY = "sdk-test-key-0123456789abcdef"


def ws(node: Any) -> str:
    return f"ws://127.0.0.1:{node.ws_port}/ws"


def http(node: Any) -> str:
    return f"http://127.0.0.1:{node.http_port}"


def token_until(user: str, exp: float) -> str:
    return jwt.encode({"sub": user, "iat": int(time.time()), "exp": exp}, SECRET, "HS256")


SdkFactory = Callable[..., Client]


@pytest.fixture
async def sdk() -> AsyncIterator[SdkFactory]:
    """SDK clients of a user on nodes (ws and http URLs in order), each with an
    ``EventQueue`` as ``client.q``; closed after the test."""
    clients: list[Client] = []

    def factory(user: str, *nodes: Any, **kw: Any) -> Client:
        q = EventQueue()
        kw.setdefault("token", token(user))
        c = Client([ws(n) for n in nodes], http_urls=[http(n) for n in nodes], on_event=q,
                   **kw)
        c.q = q  # type: ignore[attr-defined]
        clients.append(c)
        return c

    yield factory
    for c in clients:
        await c.close()


async def messages(c: Client, n: int, timeout: float = 10) -> list[Message]:
    """The next ``n`` Message events of ``c`` (other events skipped)."""
    return [await c.q.next(Message, timeout=timeout) for _ in range(n)]  # type: ignore[attr-defined]


async def push(c: Client, op: str, timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            ev = await c.q.next(Push, timeout=timeout)  # type: ignore[attr-defined]
            if ev.op == op:
                return ev.frame


# -- chat ------------------------------------------------------------------------------
async def test_one_to_one_across_two_nodes(make_node, sdk, redis_client):
    n1, n2 = await make_node(), await make_node()
    await settle(n1, n2)
    a, b = uid("a"), uid("b")
    ca, cb = sdk(a, n1), sdk(b, n2)
    await ca.connect()
    await cb.connect()
    assert ca.user == a and ca.connected
    ack = await ca.send(b, {"text": "hi b"})
    assert ack.attempts == 1 and ack.frame["op"] == "ack" and isinstance(ack.mid, int)
    [got] = await messages(cb, 1)
    assert (got.mid, got.sender, got.body, got.via) == (ack.mid, a, {"text": "hi b"}, "push")
    back = await cb.send(a, "hi a", cmid="reply-1")
    assert back.cmid == "reply-1"
    [got] = await messages(ca, 1)
    assert got.mid == back.mid and got.body == "hi a"
    # The receiver acknowledged what it got (recv_ack, batched): its offline store
    # keeps only what it sent.
    key = Keys(RUN_NS).offline(b)

    async def only_its_own() -> bool:
        return await redis_client.zcard(key) == 1

    assert await until(only_its_own, 5)


async def test_a_connection_whose_setup_fails_is_replaced(make_node, sdk):
    """A failure while setting a connection up (a reply the client did not
    foresee, a bug) closes it and the client connects again, never sitting on
    a connection it does not read from."""
    node = await make_node()
    a, b = uid("a"), uid("b")
    cb = sdk(b, node)
    setup, failed = cb._setup, list[str]()

    async def fails_once(conn: Any, url: str) -> None:
        if not failed:
            failed.append(url)
            raise RuntimeError("an unforeseen reply")
        await setup(conn, url)

    cb._setup = fails_once  # type: ignore[method-assign]
    await cb.connect()
    assert failed and cb.connected and cb.connects == 2
    ca = sdk(a, node)
    await ca.connect()
    ack = await ca.send(b, "after the failed setup")
    [got] = await messages(cb, 1)
    assert got.mid == ack.mid


async def test_an_offline_user_syncs_each_message_exactly_once(make_node, sdk):
    node = await make_node()
    a, b = uid("a"), uid("b")
    ca = sdk(a, node)
    await ca.connect()
    acks = [await ca.send(b, {"n": i}) for i in range(5)]
    cb = sdk(b, node)
    await cb.connect()  # returns once synced
    events = cb.q.drain()
    [connected] = [e for e in events if isinstance(e, Connected)]
    assert connected.synced == 5 and connected.reconnect is False
    got = [e for e in events if isinstance(e, Message)]
    assert [m.mid for m in got] == [x.mid for x in acks]
    assert {m.via for m in got} == {"sync"} and [m.body["n"] for m in got] == list(range(5))
    live = await ca.send(b, {"n": 5})
    [m] = await messages(cb, 1)
    assert m.mid == live.mid and m.via == "push"
    assert await cb.sync() == 0  # nothing new: every page is a repeat
    # A later client of b that kept the cursor gets nothing twice either.
    # Past the sync's settle window (and any send still in flight on another
    # node of this run's namespace) the cursor passes it all, with nothing new.
    async def passed() -> bool:
        assert await cb.sync() == 0
        return cb.cursor >= live.mid

    assert await until(passed, 10)
    cursor = cb.cursor
    await cb.close()
    again = sdk(b, node, since=cursor)
    await again.connect()
    assert (await again.q.next(Connected)).synced == 0
    await asyncio.sleep(0.3)
    assert [e for e in again.q.drain() if isinstance(e, Message)] == []


async def test_group_send_and_receipts(make_node, sdk):
    # Presence shown to everyone (the default, contacts only, is test_contacts.py's).
    n1, n2 = (await make_node(presence_grace_s=0.3, privacy_presence="everyone"),
              await make_node(presence_grace_s=0.3, privacy_presence="everyone"))
    await settle(n1, n2)
    a, b, c = uid("a"), uid("b"), uid("c")
    ca, cb, cc = sdk(a, n1), sdk(b, n2), sdk(c, n1)
    for x in (ca, cb, cc):
        await x.connect()
    g = (await ca.http("POST", "/v1/groups", json={"name": "sdk", "members": [b, c]}))["group"]
    # The other node binds its queue to the group's key once the membership control
    # reaches it (a moment after the create answered); until then its members would
    # get the group's messages by sync only, which is not what this test is about.
    assert await until(lambda: group_key(g) in n2.app.bindings.bound, timeout=10)
    acks = [await ca.group_send(g, {"n": i}) for i in range(3)]
    assert [x.seq for x in acks] == [1, 2, 3]
    for member in (cb, cc):
        got = await messages(member, 3)
        assert [(m.op, m.mid, m.frame["seq"], m.group) for m in got] == [
            ("group_msg", x.mid, x.seq, g) for x in acks]
    # Receipts: b reads a's 1:1 message; a's device gets a receipt, b's other device `read`.
    cb2 = sdk(b, n1)
    await cb2.connect()
    ack = await ca.send(b, "read me")
    assert (await messages(cb, 1))[0].mid == ack.mid
    await cb.read(a, ack.mid)
    receipt = await push(ca, "receipt")
    assert (receipt["conv"], receipt["mid"]) == (b, ack.mid)
    read = await push(cb2, "read")
    assert (read["conv"], read["mid"], read["unread"]) == (a, ack.mid, 0)
    # Typing and presence.
    assert await cb.typing(a) is True
    assert (await push(ca, "typing"))["from"] == b
    state = await ca.presence_sub([b, c])
    assert state[b]["online"] is True
    await cb.close()
    await cb2.close()
    gone = await push(ca, "presence")
    assert gone["users"][b]["online"] is False
    with pytest.raises(ClientStopped):
        await cb.send(a, "after close")


# -- failures ----------------------------------------------------------------------------------
async def test_a_node_killed_mid_conversation(node_process, proxy, mongo_db):
    """a's connection goes through a proxy to n0; sends are held in the proxy when n0
    is killed (SIGKILL): a moves to n1 and writes them again, same cmids."""
    n0, n1 = await node_process(**FAST_HEARTBEAT), await node_process(**FAST_HEARTBEAT)
    link = await proxy(n0.ws_port)
    a, b = uid("a"), uid("b")
    qa, qb = EventQueue(), EventQueue()
    ca = Client([f"ws://127.0.0.1:{link.port}/ws", ws(n1)], http_urls=[http(n0), http(n1)],
                token=token(a), on_event=qa)
    cb = Client([ws(n1)], http_urls=[http(n1)], token=token(b), on_event=qb)
    try:
        await ca.connect()
        await cb.connect()
        before = [await ca.send(b, {"k": k}, cmid=f"k{k}") for k in range(10)]
        link.slow(5.0)  # what a sends now sits in the proxy
        in_flight = [asyncio.create_task(ca.send(b, {"k": k}, cmid=f"k{k}"))
                     for k in range(10, 15)]
        await asyncio.sleep(0.3)
        n0.kill()
        link.cut()
        lost = await qa.next(ConnectionLost, timeout=10)
        assert lost.action == "retry"
        resent = await asyncio.gather(*in_flight)
        assert all(x.attempts >= 2 for x in resent)  # written again after the reconnect
        assert ca.url == ws(n1)
        after = [await ca.send(b, {"k": k}, cmid=f"k{k}") for k in range(15, 20)]
        acked = before + resent + after
        assert [x.cmid for x in acked] == [f"k{k}" for k in range(20)]
        # b gets every acked message, each once (pushes and its own sync deduped).
        got: Counter[int] = Counter()
        async with asyncio.timeout(15):
            while not {x.mid for x in acked} <= set(got):
                got[(await qb.next(Message)).mid] += 1
        await asyncio.sleep(0.3)
        for ev in qb.drain():
            if isinstance(ev, Message):
                got[ev.mid] += 1
        assert set(got) == {x.mid for x in acked} and set(got.values()) == {1}
        # Nothing doubled in the store either: one message per cmid.
        assert await mongo_db.messages.count_documents({"from": a}) == 20
    finally:
        await ca.close()
        await cb.close()


async def test_acks_lost_with_the_link_are_answered_again_with_the_same_mid(
        make_node, proxy, sdk, mongo_db):
    n1, n2 = await make_node(), await make_node()
    await settle(n1, n2)
    link = await proxy(n1.ws_port)
    a, b = uid("a"), uid("b")
    ca = Client([f"ws://127.0.0.1:{link.port}/ws", ws(n2)], token=token(a))
    cb = sdk(b, n2)
    try:
        await ca.connect()
        await cb.connect()
        link.slow(1.0)  # frames reach n1 after 1 s; its acks would come back 1 s later
        sends = [asyncio.create_task(ca.send(b, i, cmid=f"lost-ack-{i}")) for i in range(3)]
        await asyncio.sleep(1.5)
        link.cut()  # the acks die in the proxy
        acks = await asyncio.gather(*sends)
        assert all(x.attempts == 2 for x in acks)
        got = await messages(cb, 3)
        assert sorted(m.mid for m in got) == sorted(x.mid for x in acks)
        assert await mongo_db.messages.count_documents({"from": a}) == 3
    finally:
        await ca.close()


async def test_a_draining_node_sends_its_clients_on(make_node, sdk):
    n1 = await make_node(drain_timeout_s=5, presence_grace_s=0.3, privacy_presence="everyone")
    n2 = await make_node(presence_grace_s=0.3, privacy_presence="everyone")
    await settle(n1, n2)
    a, b = uid("a"), uid("b")
    ca, cb = sdk(a, n1, n2), sdk(b, n2)
    await ca.connect()
    await cb.connect()
    assert (await ca.presence_sub([b]))[b]["online"] is True
    await n1.drain()  # `reconnect`, then close 1001
    lost = await ca.q.next(ConnectionLost)
    assert (lost.code, lost.action) == (1001, "move")
    back = await ca.q.next(Connected)
    assert back.reconnect and back.url == ws(n2)
    ack = await ca.send(b, "from the new node")
    assert (await messages(cb, 1))[0].mid == ack.mid
    # The presence subscription came along: b leaving is told on the new connection.
    await cb.close()
    async with asyncio.timeout(10):
        while True:
            p = await push(ca, "presence")
            if "re" not in p and p["users"].get(b, {}).get("online") is False:
                break


# -- rooms ----------------------------------------------------------------------------------------
async def test_a_room_is_rejoined_with_since_and_recovered(make_node, proxy, sdk):
    n1, n2 = await make_node(**UNCAPPED), await make_node(**UNCAPPED)
    await settle(n1, n2)
    link = await proxy(n2.ws_port)
    room, a, b = uid("room"), uid("a"), uid("b")
    speaker = sdk(a, n1)
    q = EventQueue()
    member = Client([f"ws://127.0.0.1:{link.port}/ws"], token=token(b), on_event=q)
    try:
        await speaker.connect()
        await member.connect()
        await speaker.join(room)
        j = await member.join(room, history=10)
        assert j.msgs == [] and j.recovered is None
        for i in range(3):
            await speaker.room_send(room, i)
        live: list[Any] = []
        async with asyncio.timeout(10):
            while len(live) < 3:
                ev = await q.next(RoomMessages)
                live += ev.msgs
        assert [m["body"] for m in live] == [0, 1, 2] and [m["pos"] for m in live] == [1, 2, 3]
        link.cut()  # the member is away ...
        await q.next(ConnectionLost)
        for i in range(3, 8):
            await speaker.room_send(room, i)  # ... while the room goes on
        link.restore()
        rejoined = await q.next(RoomRejoined, timeout=15)
        assert rejoined.room == room and rejoined.recovered is True
        assert rejoined.reply["pos"] == 8
        missed = await q.next(RoomMessages)  # right after RoomRejoined
        assert missed.via == "rejoin" and [m["body"] for m in missed.msgs] == [3, 4, 5, 6, 7]
        await speaker.room_send(room, "live")
        ev = await q.next(RoomMessages)
        assert [(m["pos"], m["body"]) for m in ev.msgs] == [(9, "live")]
    finally:
        await member.close()


# -- tokens and close codes -----------------------------------------------------------------------
async def test_4001_asks_get_token_and_reconnects(make_node, sdk):
    node = await make_node()
    a, b = uid("a"), uid("b")
    calls: list[str] = []

    async def get_token() -> str:
        calls.append("t")
        return token(a)

    ca = sdk(a, node, token=token_until(a, time.time() + 2), get_token=get_token,
             refresh_ahead=None)
    cb = sdk(b, node)
    await ca.connect()
    await cb.connect()
    lost = await ca.q.next(ConnectionLost)
    assert (lost.code, lost.action) == (4001, "refresh")
    back = await ca.q.next(Connected)
    assert back.reconnect and calls == ["t"]
    ack = await cb.send(a, "after refresh")
    assert (await messages(ca, 1))[0].mid == ack.mid


async def test_the_token_is_refreshed_before_it_expires(make_node, sdk):
    node = await make_node()
    a = uid("a")
    calls = 0

    async def get_token() -> str:
        nonlocal calls
        calls += 1
        return token_until(a, time.time() + 3)

    ca = sdk(a, node, token=token_until(a, time.time() + 3), get_token=get_token)
    await ca.connect()
    await asyncio.sleep(4.5)  # past the first token's exp
    # refreshed at half-life, twice, on the same connection (polled: on a loaded
    # machine the second refresh can come after these 4.5 s)
    assert await until(lambda: calls >= 2, timeout=15)
    assert ca.connects == 1
    assert not [e for e in ca.q.drain() if isinstance(e, ConnectionLost)]
    assert (await ca.request("ping"))["op"] == "pong"


async def test_close_ends_a_refresher_whose_get_token_kept_the_cancellation(make_node, sdk):
    """``close`` returns while the token refresher is inside a ``get_token`` that
    catches the cancellation and returns a token all the same (an application's
    code can; so can ``asyncio.wait_for`` on 3.11 when its inner future completes
    as it is cancelled). Before, the refresher went on refreshing on the still
    open connection and ``close`` waited for it for ever."""
    node = await make_node()
    a = uid("a")
    inside = asyncio.Event()

    async def get_token() -> str:
        inside.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(30)
        return token_until(a, time.time() + 3)

    ca = sdk(a, node, token=token_until(a, time.time() + 3), get_token=get_token)
    await ca.connect()
    await asyncio.wait_for(inside.wait(), 10)  # refreshing, at the token's half-life
    await asyncio.wait_for(ca.close(), 20)
    assert ca.stopped is not None


async def test_4003_stops_the_client(make_node, sdk):
    node = await make_node(api_keys=API_KEY)
    a = uid("a")
    ca = sdk(a, node)
    await ca.connect()
    async with httpx.AsyncClient(trust_env=False) as h:
        r = await h.post(f"{http(node)}/v1/server/users/{a}/disconnect",
                         headers={"X-API-Key": API_KEY})
        assert r.status_code == 200
    stopped = await ca.q.next(Stopped)
    assert stopped.code == 4003 and ca.stopped is not None
    with pytest.raises(ClientStopped):
        await ca.send(uid("b"), "no")
    await asyncio.sleep(0.5)
    assert ca.connects == 1  # no reconnect


# -- devices -----------------------------------------------------------------------------------
async def test_a_replaced_client_stops_and_says_so(make_node, sdk):
    """Under ``one_per_platform``, a second phone of the user on another node
    replaces the first: the first client gets close 4005 and stops (``Stopped``,
    no reconnect that would take the slot back); the second stays."""
    n1, n2 = await make_node(login_policy="one_per_platform"), \
        await make_node(login_policy="one_per_platform")
    await settle(n1, n2)
    user = uid("p")
    first = sdk(user, n1, device="phone-1", platform="android")
    await first.connect()
    second = sdk(user, n2, device="phone-2", platform="android")
    await second.connect()
    stopped = await first.q.next(Stopped, timeout=10)  # type: ignore[attr-defined]
    assert stopped.code == 4005 and "replaced" in stopped.reason
    assert second.connected and not first.connected
    assert (await second.send(uid("x"), "still here")).frame["op"] == "ack"


async def test_a_sync_that_failed_after_connect_is_tried_again_while_connected(make_node, sdk):
    """The node's HTTP side cannot be reached when the client connects (a
    dependency down longer than the sync's tries last): ``SyncFailed``; once
    it can, the background sync brings what came while the user was away,
    on the same connection."""
    from imgate_client import SyncFailed

    from testkit.proxy import TcpProxy

    n = await make_node()
    proxy = await TcpProxy(n.http_port).start()
    try:
        proxy.cut()
        a, b = uid("a"), uid("b")
        ca = sdk(a, n)
        await ca.connect()
        for i in range(3):  # b is offline: only a sync brings these
            await ca.send(b, f"m{i}")
        q = EventQueue()
        cb = Client([ws(n)], http_urls=[f"http://127.0.0.1:{proxy.port}"], token=token(b),
                    on_event=q)
        try:
            await cb.connect()
            await q.next(SyncFailed, timeout=30)
            proxy.restore()
            got = [await q.next(Message, timeout=30) for _ in range(3)]
            assert [(m.body, m.via) for m in got] == [(f"m{i}", "sync") for i in range(3)]
            assert cb.connects == 1  # no reconnect was needed
        finally:
            await cb.close()
    finally:
        await proxy.close()


async def test_the_sync_after_connect_starts_once_the_device_is_registered(
        make_node, redis_client, proxy):
    """The SDK syncs after the node answered a frame on the new connection, and
    the node reads frames only once the device is registered: a message acked
    before the route exists is in the sync, one after is pushed. With the
    node's Redis link slowed (the route write takes a while), the route is
    already there when the sync is asked for."""
    from urllib.parse import urlsplit

    from tests.conftest import base_settings

    s = base_settings()
    if s.redis_cluster:
        pytest.skip("a proxy in front of one Redis (a Redis Cluster's nodes redirect)")
    url = urlsplit(s.redis_url)
    slow = await proxy(url.port or 6379)
    slow.slow(0.15)
    n = await make_node(redis_url=f"redis://127.0.0.1:{slow.port}/{url.path[1:] or 0}")
    b = uid("b")
    cb = Client([ws(n)], http_urls=[http(n)], token=token(b))
    routes_at_sync: list[int] = []
    real = cb.http

    async def http_spy(method: str, path: str, **kw: Any) -> Any:
        if path == "/v1/sync" and not routes_at_sync:
            routes_at_sync.append(await redis_client.hlen(Keys(RUN_NS).routes(b)))
        return await real(method, path, **kw)

    cb.http = http_spy  # type: ignore[method-assign]
    try:
        await cb.connect(timeout=30)
        assert routes_at_sync == [1]
    finally:
        await cb.close()


async def test_a_connect_whose_ping_times_out_syncs_and_syncs_again_once_registered(
        make_node, redis_client, proxy):
    """The node is slower to register the device than the SDK waits for its
    ping: the SDK does not stay connected without a sync (it would miss what
    came while it was away), and syncs again once the node answers a ping, so
    a message acked between the first sync and the registration is not missed."""
    from urllib.parse import urlsplit

    from tests.conftest import base_settings

    s = base_settings()
    if s.redis_cluster:
        pytest.skip("a proxy in front of one Redis (a Redis Cluster's nodes redirect)")
    url = urlsplit(s.redis_url)
    slow = await proxy(url.port or 6379)
    n = await make_node(redis_url=f"redis://127.0.0.1:{slow.port}/{url.path[1:] or 0}")
    a, b = uid("a"), uid("b")
    qb = EventQueue()
    ca = Client([ws(n)], http_urls=[http(n)], token=token(a))
    cb = Client([ws(n)], http_urls=[http(n)], token=token(b), request_timeout=0.05, on_event=qb)
    try:
        await ca.connect(timeout=30)
        await ca.send(b, "while away", cmid="away")
        slow.slow(0.15)  # the device's registration now takes longer than 0.05 s
        syncs: list[int] = []
        real = cb.http

        async def http_spy(method: str, path: str, **kw: Any) -> Any:
            if path == "/v1/sync":
                syncs.append(await redis_client.hlen(Keys(RUN_NS).routes(b)))
            return await real(method, path, **kw)

        cb.http = http_spy  # type: ignore[method-assign]
        await cb.connect(timeout=30)
        got = await qb.next(Message, timeout=10)
        assert got.body == "while away"
        assert syncs[0] == 0  # synced before the device was registered: the ping timed out
        assert await until(lambda: any(syncs[1:]), timeout=20)  # and again once it was
    finally:
        slow.slow(0)
        await cb.close()
        await ca.close()
