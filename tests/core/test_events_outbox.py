"""The events outbox (gateway/events.py) with fake sources and a fake broker:
order, ids stable across retries, a group's events resumed after a failure
from the first unconfirmed one, counts by the type that failed, the bound,
the backoff cut short when the broker is back."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence

import orjson

from gateway.events import Events, preview
from testkit.poll import until


class Sources:
    def __init__(self) -> None:
        self.groups = {"g1": ["alice", "bob", "carol", "dave"]}
        self.online = {"carol"}
        self.unreads = Counter[str]()
        self.mutes: set[tuple[str, str]] = set()

    async def unread(self, user: str) -> int:
        return self.unreads[user]

    async def members(self, group: str) -> list[str]:
        return self.groups[group]

    async def offline(self, users: Sequence[str]) -> list[str]:
        return [u for u in users if u not in self.online]

    async def platforms(self, users: Sequence[str]) -> dict[str, list[str]]:
        return {u: ["web"] for u in users if u in self.online}

    async def muted(self, pairs: Sequence[tuple[str, str]]) -> set[tuple[str, str]]:
        return {p for p in pairs if p in self.mutes}

    async def muted_by(self, conv: str) -> list[str]:
        return sorted(u for u, c in self.mutes if c == conv)


class Broker:
    """Confirms each publish, except the ``fail`` next ones and the calls
    numbered in ``fail_calls`` (1-based), which raise."""

    def __init__(self) -> None:
        self.got: list[tuple[str, dict, str]] = []
        self.fail = 0
        self.fail_calls: set[int] = set()
        self.calls = 0

    async def publish(self, key: str, body: bytes, event_id: str) -> None:
        self.calls += 1
        if self.fail or self.calls in self.fail_calls:
            self.fail = max(0, self.fail - 1)
            raise ConnectionError("broker down")
        self.got.append((key, orjson.loads(body), event_id))


def make(wanted=("offline", "presence"), pending_max=100, pending_per_user=500):
    broker, sources, counts = Broker(), Sources(), Counter[tuple[str, str]]()
    ev = Events("n1-abc", broker.publish, sources, wanted, pending_max=pending_max,
                pending_per_user=pending_per_user,
                count=lambda kind, outcome: counts.update([(kind, outcome)]))
    return ev, broker, sources, counts


def test_preview_takes_strings_and_text_fields():
    assert preview(b'"hello"') == "hello"
    assert preview(orjson.dumps({"text": "y" * 300})) == "y" * 100
    assert preview(b"[1,2]") is None and preview(b"{bad") is None


async def run_until_empty(ev: Events) -> None:
    ev.start()
    try:
        assert await until(lambda: ev.pending == 0, timeout=10)
    finally:
        await ev.close()


def queue_group_and_presence(ev: Events, sources: Sources) -> None:
    sources.unreads.update({"bob": 3, "dave": 1})
    ev.presence("zed", True, 1000)
    ev.group_msg("g1", 77, 5, "alice", b'"hi"', diffused=True)


async def test_a_group_resumes_from_its_first_unconfirmed_event_with_the_same_ids():
    ev, broker, sources, counts = make()
    queue_group_and_presence(ev, sources)
    broker.fail_calls = {3}  # presence and bob confirmed, dave not: only dave again
    await run_until_empty(ev)
    keys = [(k, e.get("user")) for k, e, _ in broker.got]
    # carol is online, alice sent it: bob and dave, in member order, once each.
    assert keys == [("presence.online", "zed"), ("offline.msg", "bob"), ("offline.msg", "dave")]
    ids = [i for *_, i in broker.got]
    assert ids == ["n1-abc.1", "n1-abc.2.0", "n1-abc.2.1"]
    assert all(e["id"] == i for _, e, i in broker.got)
    bob = broker.got[1][1]
    assert (bob["conv"], bob["group"], bob["seq"], bob["mid"], bob["unread"], bob["preview"]) == (
        "g:g1", "g1", 5, 77, 3, "hi")
    assert counts[("offline.msg", "retried")] == 1 and counts[("offline.msg", "published")] == 2
    assert counts[("presence.online", "retried")] == 0


async def test_a_broker_outage_resends_the_batch_in_order_and_counts_by_type():
    ev, broker, sources, counts = make()
    queue_group_and_presence(ev, sources)
    broker.fail = 3  # the link is down for the first attempt: all three fail
    await run_until_empty(ev)
    assert [i for *_, i in broker.got] == ["n1-abc.1", "n1-abc.2.0", "n1-abc.2.1"]
    assert counts[("presence.online", "retried")] == 1  # the head failed: its type


async def test_big_groups_make_one_event_and_unwanted_types_none():
    ev, broker, _, counts = make(wanted=("offline.group",))
    ev.group_msg("g1", 1, 1, "alice", b'"x"', diffused=False)
    ev.group_msg("g1", 2, 2, "alice", b'"x"', diffused=True)  # offline.msg: not wanted
    ev.offline_msg("bob", 3, "alice", "alice", b'"x"')
    ev.presence("bob", False, 5)
    assert ev.pending == 1
    await run_until_empty(ev)
    assert [(k, e["group"], e["mid"]) for k, e, _ in broker.got] == [("offline.group", "g1", 1)]
    assert "user" not in broker.got[0][1]


async def test_a_full_outbox_drops_the_newest_and_counts_it():
    ev, broker, _, counts = make(pending_max=2)
    for mid in range(4):
        ev.offline_msg("bob", mid, "alice", "alice", b'"x"')
    assert ev.pending == 2 and counts[("offline.msg", "dropped")] == 2
    await run_until_empty(ev)
    assert [e["mid"] for _, e, _ in broker.got] == [0, 1]


async def test_resume_cuts_the_backoff_short():
    ev, broker, _, _ = make()
    broker.fail = 6  # backoff 0.2, 0.4, 0.8, 1.6, 3.2, 5 s: 11 s without resume
    ev.offline_msg("bob", 1, "alice", "alice", b'"x"')
    ev.start()
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        while ev.pending and loop.time() - started < 20:
            ev.resume()
            await asyncio.sleep(0.01)
    finally:
        await ev.close()
    # Six waits cut short by resume(): well below the 11 s of backoff.
    assert ev.pending == 0 and loop.time() - started < 8.0


async def test_one_users_backlog_neither_delays_nor_crowds_out_anothers():
    ev, broker, _, counts = make(pending_max=1000, pending_per_user=300)
    for i in range(400):  # one user writes to 400 ids nobody ever used
        ev.offline_msg(f"never{i}", 1000 + i, "mallory", "mallory", b'"spam"')
    ev.offline_msg("bob", 5000, "alice", "alice", b'"hi bob"')
    assert ev.pending == 301 and counts[("offline.msg", "dropped")] == 100
    await run_until_empty(ev)
    order = [e["from"] for _, e, _ in broker.got]
    assert order.index("alice") == 1  # served in its turn, not after mallory's 300
    assert [e["mid"] for _, e, _ in broker.got if e["from"] == "mallory"] == list(
        range(1000, 1300))  # mallory's own stay in order
