"""Room delivery under faults (docs/protocol.md): while one node's link to
RabbitMQ is cut, its members miss what is published on the other node; once
the link is back, they get every missed message from the room's history, late
but in position order, or a ``room_gap`` first where those are no longer kept.
Never a silent jump in ``pos``."""

from __future__ import annotations

from typing import Any

from testkit.poll import until
from tests.conftest import settle, uid
from tests.integration.router.test_failover import amqp_port, amqp_through


def room_stream(frames: list[dict[str, Any]]) -> list[tuple[str, int]]:
    """What a member saw, in order: ("msg", pos) per message, ("gap", after) per
    room_gap."""
    out: list[tuple[str, int]] = []
    for f in frames:
        if f["op"] == "room_msgs":
            out.extend(("msg", m["pos"]) for m in f["msgs"])
        elif f["op"] == "room_gap":
            out.append(("gap", f["after"]))
    return out


async def _joined(dev, room: str) -> dict[str, Any]:
    r = await dev.request("join", room=room)
    assert r["op"] == "joined", r
    return r


async def _publish(dev, room: str, n: int, start: int) -> None:
    for i in range(start, start + n):
        r = await dev.request("room_send", room=room, body=i, timeout=15)
        assert r["op"] == "ok", r


async def _rig(make_node, connect, proxy, **settings: Any) -> tuple[Any, ...]:
    """A member on a node whose broker link runs through ``amqp`` (a proxy to
    cut), a sender on another node, both in a new room: (amqp, the member's
    node, room, the member's pushes, sender, the room's first position after
    the member joined)."""
    amqp = await proxy(amqp_port())
    cut_off = await make_node(amqp_url=amqp_through(amqp), room_rate_cap=0, **settings)
    other = await make_node(room_rate_cap=0, **settings)
    await settle(cut_off, other)
    room = uid("room")
    seen: list[dict[str, Any]] = []
    member = await connect(cut_off, uid("m"), on_push=seen.append)
    sender = await connect(other, uid("s"))
    joined = await _joined(member, room)
    await _joined(sender, room)
    return amqp, cut_off, room, seen, sender, joined["pos"] + 1


async def test_members_behind_a_cut_broker_link_get_every_message_in_order(
        make_node, connect, proxy):
    amqp, cut_off, room, seen, sender, first = await _rig(make_node, connect, proxy)

    await _publish(sender, room, 5, 0)  # before: live
    assert await until(lambda: len(room_stream(seen)) == 5, timeout=10)
    amqp.cut()  # the member's node hears nothing from the broker
    await _publish(sender, room, 10, 5)  # acked: the other node's link is fine
    amqp.restore()
    assert await until(lambda: cut_off.app.router.broker_connected(), timeout=20)
    await _publish(sender, room, 5, 15)  # after: live again

    assert await until(lambda: len(room_stream(seen)) >= 20, timeout=20)
    stream = room_stream(seen)
    # Every message once, in position order: the ten missed came from the history.
    assert stream == [("msg", p) for p in range(first, first + 20)], stream
    assert cut_off.metrics.room_recoveries.labels("recovered")._value.get() >= 1


async def test_a_tail_missed_during_the_outage_comes_without_a_later_message(
        make_node, connect, proxy):
    amqp, cut_off, room, seen, sender, first = await _rig(make_node, connect, proxy)
    await _publish(sender, room, 2, 0)
    assert await until(lambda: len(room_stream(seen)) == 2, timeout=10)
    amqp.cut()
    await _publish(sender, room, 3, 2)  # the last messages of the room for now
    amqp.restore()
    assert await until(lambda: len(room_stream(seen)) == 5, timeout=20)
    assert room_stream(seen) == [("msg", p) for p in range(first, first + 5)]


async def test_missed_messages_no_longer_kept_are_told_as_room_gap(
        make_node, connect, proxy):
    # Three kept per room: most of what the member misses is gone by the time it asks.
    amqp, cut_off, room, seen, sender, first = await _rig(make_node, connect, proxy, room_history=3)
    await _publish(sender, room, 2, 0)
    assert await until(lambda: len(room_stream(seen)) == 2, timeout=10)
    amqp.cut()
    await _publish(sender, room, 10, 2)
    amqp.restore()
    assert await until(lambda: cut_off.app.router.broker_connected(), timeout=20)
    await _publish(sender, room, 1, 12)
    last = first + 12

    def got_the_last() -> bool:
        return ("msg", last) in room_stream(seen)

    assert await until(got_the_last, timeout=20)
    stream = room_stream(seen)
    assert stream[:2] == [("msg", first), ("msg", first + 1)]
    gap = stream.index(("gap", first + 1))  # told before anything after the hole
    after = [p for kind, p in stream[gap + 1:] if kind == "msg"]
    assert after == sorted(after) and after[-1] == last and after[0] > first + 2
    assert cut_off.metrics.room_recoveries.labels("gap")._value.get() >= 1
