"""What the checker reads back from the cluster after the traffic: it waits for
the cluster to settle, syncs every user from 0, reads each group member's
history, the room's last position, the group counters in the store, and the
unread counts after the reads of a plan. The rules live in the pure checks
(``checks``, ``room_checks``, ``unread_checks``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

from imgate_client import Connection, HttpError

from testkit.nemesis.checks import fault_at, missing
from testkit.nemesis.config import SECRET, SYNC_LIMIT
from testkit.nemesis.history import History, Send, User
from testkit.nemesis.unread_checks import UnreadPlan
from testkit.poll import bounded, until
from testkit.tokens import issue_token

__all__ = ["final_sync", "group_counters", "group_history_held", "http_retry",
           "members_behind", "read_and_list", "room_final", "settle", "stored_copies",
           "undelivered"]


async def http_retry(u: User, method: str, path: str, **kw: Any) -> Any:
    """An HTTP call as ``u``, retried (503, a node down) for up to 30 s."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await u.client.http(method, path, **kw)
        except (HttpError, OSError, TimeoutError) as exc:
            if isinstance(exc, HttpError) and exc.status not in (502, 503, 429):
                raise
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def undelivered(h: History) -> dict[str, list[Send]]:
    """Per receiver, the acked messages it has got neither from the SDK nor a sync."""
    out: dict[str, list[Send]] = defaultdict(list)
    for u in h.everyone:
        for s in u.sends.values():
            if s.mid is not None:
                for r in missing(h, s, u):
                    out[r.name].append(s)
    return dict(out)


async def settle(h: History, timeout: float) -> dict[str, Any]:
    """Until every client is connected and every acked message reached each of
    its receivers by push or sync (bounded by ``timeout``); what was still
    missing then (``settle_left``: users not connected, messages not delivered).
    Each poll looks again only at what was missing at the one before."""
    pending = [(u, s) for u in h.everyone for s in u.sends.values() if s.mid is not None]

    def done() -> bool:
        pending[:] = [(u, s) for u, s in pending if missing(h, s, u)]
        return not pending and all(u.client.connected for u in h.everyone)

    await until(done, timeout=timeout, every=0.25)
    lacking = {r.name for u, s in pending for r in missing(h, s, u)}
    return {"not_connected": [u.name for u in h.everyone if not u.client.connected],
            "undelivered": sum(len(missing(h, s, u)) for u, s in pending),
            "examples": [_left(h, u, s) for u, s in pending[:10]],
            "clients": {u.name: client_state(u) for u in h.everyone if u.name in lacking}}


def client_state(u: User) -> dict[str, Any]:
    """Where a receiver's client stands (what its connection loop awaits, its
    sync), for a run that ends with messages it never got."""
    c = u.client
    task = getattr(c, "_run_task", None)
    state: dict[str, Any] = {"syncing": c.inbox.syncing, "sync_locked": c._sync_lock.locked(),
                             "cursor": c.inbox.cursor, "connects": c.connects}
    if task is None:
        return state
    if task.done():
        exc = None if task.cancelled() else task.exception()
        state["loop"] = f"ended: {exc!r}"
    else:
        state["loop"] = awaiting(task.get_coro())
    return state


def awaiting(coro: Any) -> list[str]:
    """The chain of awaits a suspended coroutine is in, outermost first."""
    out: list[str] = []
    while coro is not None and len(out) < 30:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            out.append(f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} "
                       f"{frame.f_code.co_name}")
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return out


def _left(h: History, u: User, s: Send) -> dict[str, Any]:
    """A message some receiver still lacks, with what its connections saw:
    which got the push frame, which were open around the send."""
    t1, t2 = s.t_first, s.t_ack or s.t_first
    return {"from": u.name, "cmid": s.cmid, "mid": s.mid, "t_first": h.rel(t1),
            "t_ack": h.rel(t2), "fault": fault_at(h, t1, t2),
            "to": {r.name: {"pushed_on": [g for g, got in r.pushes.items() if s.mid in got],
                            "conns": [(c.gen, c.node, h.rel(c.t_open), h.rel(c.t_close))
                                      for c in r.conns.values()
                                      if c.t_open - 5 <= t2 and (c.t_close or 1e18) + 5 >= t1]}
                   for r in missing(h, s, u)}}


async def _sync_after(u: User, since: int) -> None:
    got = []
    for _ in range(500):
        page = await http_retry(u, "GET", "/v1/sync", params={"since": since, "limit": SYNC_LIMIT})
        got.extend(page["msgs"])
        moved, since = page["next"] > since, page["next"]
        if not page["more"] or not moved:
            break
    u.synced = got
    u.synced_mids = {int(m["mid"]) for m in got}


async def final_sync(h: History) -> dict[str, int]:
    """A ``/v1/sync`` of every user into ``synced``/``synced_mids``: from just
    before the oldest message it still lacks, or from its newest delivered one
    (one page, to see the cursor answer) when it lacks none. Not from 0: a user
    syncs its whole history in pages of ``SYNC_LIMIT``, and on SecantusDB that
    grows with the square of the run's length. Returns the ``since`` per user."""
    lacking = undelivered(h)
    since = {}
    for u in h.everyone:
        if u.name in lacking:
            since[u.name] = min(s.mid or 0 for s in lacking[u.name]) - 1
        else:
            since[u.name] = max(u.delivered, default=0)
    await bounded((_sync_after(u, since[u.name]) for u in h.everyone), 6)
    return since


async def _history_seqs(u: User, g: str) -> Counter[int]:
    """How often each seq comes back in ``u``'s ``/v1/history/g:G``, all pages."""
    have: Counter[int] = Counter()
    before: int | None = None
    for _ in range(200):
        params: dict[str, Any] = {"limit": 200}
        if before is not None:
            params["before"] = before
        page = await http_retry(u, "GET", f"/v1/history/g:{g}", params=params)
        for m in page["msgs"]:
            have[int(m["seq"])] += 1
        before = page.get("next")
        if not before:
            break
    return have


async def group_history_held(h: History) -> dict[tuple[str, str], Counter[int]]:
    """(group, member) -> the seqs the member's group history holds."""
    by = h.by_name()
    return {(g, name): await _history_seqs(by[name], g)
            for g, members in h.group_members.items() for name in members}


async def room_final(ws_url: str, room: str) -> dict[str, Any]:
    """The room's epoch and last position, from a join of a fresh client."""
    conn = await Connection.open(ws_url, issue_token(SECRET, "checker", 600))
    try:
        r = await conn.request("join", 10, room=room)
        await conn.request("leave", 10, room=room)
    finally:
        await conn.close()
    return {"epoch": r.get("epoch"), "pos": r.get("pos") or 0}


async def members_behind(h: History, room: str, final: dict[str, Any]) -> list[dict[str, Any]]:
    """The members whose client is still behind the room's last position after
    up to 10 s (user, epoch, pos)."""
    behind: list[dict[str, Any]] = []

    def caught_up() -> bool:
        behind.clear()
        for u in h.everyone:
            st = u.client.rooms.get(room)
            if final["pos"] and (st is None or st.epoch != final["epoch"]
                                 or st.pos < final["pos"]):
                behind.append({"user": u.name, "epoch": st and st.epoch, "pos": st and st.pos})
        return not behind

    await until(caught_up, timeout=10, every=0.25)
    return behind


async def group_counters(mongo_url: str, ns: str, groups: list[str]
                         ) -> dict[str, tuple[int, int]]:
    """Each group's (newest stored message's seq, seq counter) in the store:
    seqs past the first were taken by sends whose message was never stored."""
    async with _mongo(mongo_url) as client:
        out = {}
        for g in groups:
            doc = await client[ns].groups.find_one({"_id": g})
            newest = await client[ns].group_msgs.find_one(
                {"g": g, "dead": {"$ne": True}}, {"seq": 1}, sort=[("seq", -1)])
            out[g] = (int((newest or {}).get("seq") or 0), int((doc or {}).get("seq") or 0))
        return out


async def stored_copies(mongo_url: str, ns: str) -> dict[str, Any]:
    """Every message the store holds, read once: the mids stored per (sender,
    cmid), 1:1 and group, and per (group, seq) (tombstones left out)."""
    by_cmid: dict[tuple[str, str], set[int]] = defaultdict(set)
    by_seq: dict[tuple[str, int], set[int]] = defaultdict(set)
    async with _mongo(mongo_url) as client:
        db = client[ns]
        async for d in db.messages.find({}, {"from": 1, "cmid": 1}):
            by_cmid[(str(d["from"]), str(d["cmid"]))].add(int(d["_id"]))
        async for d in db.group_msgs.find({"dead": {"$ne": True}},
                                          {"g": 1, "seq": 1, "mid": 1, "from": 1, "cmid": 1}):
            by_cmid[(str(d["from"]), str(d["cmid"]))].add(int(d["mid"]))
            by_seq[(str(d["g"]), int(d["seq"]))].add(int(d["mid"]))
    return {"by_cmid": by_cmid, "by_seq": by_seq}


@contextlib.asynccontextmanager
async def _mongo(url: str) -> AsyncIterator[Any]:
    from pymongo import AsyncMongoClient
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        url, serverSelectionTimeoutMS=10_000)
    try:
        yield client
    finally:
        await client.close()


async def read_and_list(plans: list[UnreadPlan]) -> list[tuple[UnreadPlan, dict[str, Any]]]:
    """Each plan's reads made, then its user's ``/v1/conversations`` page."""
    out = []
    for plan in plans:
        for conv, mid in plan.reads.items():
            await http_retry(plan.user, "POST", f"/v1/conversations/{conv}/read",
                             json={"mid": mid})
        page = await http_retry(plan.user, "GET", "/v1/conversations", params={"limit": 200})
        out.append((plan, page))
    return out
