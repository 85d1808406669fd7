"""What the checker reads back from the cluster after the traffic: it waits for
the cluster to settle, syncs every user from 0, reads each group member's
history, the room's last position, the group counters in the store, and the
unread counts after the reads of a plan. The rules live in the pure checks
(``checks``, ``room_checks``, ``unread_checks``)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from imgate_client import Connection, HttpError

from testkit.nemesis.checks import missing
from testkit.nemesis.config import SECRET, SYNC_LIMIT
from testkit.nemesis.history import History, User
from testkit.nemesis.unread_checks import UnreadPlan
from testkit.poll import bounded, until
from testkit.tokens import issue_token

__all__ = ["final_sync", "group_counters", "group_history_held", "http_retry",
           "members_behind", "read_and_list", "room_final", "settle"]


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


async def settle(h: History, timeout: float) -> None:
    """Until every client is connected and every acked message reached each of
    its receivers by push or sync (bounded by ``timeout``)."""
    def done() -> bool:
        if not all(u.client.connected for u in h.everyone):
            return False
        return not any(missing(h, s, u) for u in h.everyone
                       for s in u.sends.values() if s.mid is not None)
    await until(done, timeout=timeout, every=0.25)


async def _sync_from_zero(u: User) -> None:
    since, got = 0, []
    for _ in range(500):
        page = await http_retry(u, "GET", "/v1/sync", params={"since": since, "limit": SYNC_LIMIT})
        got.extend(page["msgs"])
        moved, since = page["next"] > since, page["next"]
        if not page["more"] or not moved:
            break
    u.synced = got
    u.synced_mids = {int(m["mid"]) for m in got}


async def final_sync(h: History) -> None:
    """A full ``/v1/sync`` of every user from 0, into ``synced``/``synced_mids``."""
    await bounded((_sync_from_zero(u) for u in h.everyone), 6)


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


async def group_counters(mongo_url: str, ns: str, groups: list[str]) -> dict[str, int]:
    """Each group's seq counter in the store."""
    from pymongo import AsyncMongoClient
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        mongo_url, serverSelectionTimeoutMS=10_000)
    try:
        out = {}
        for g in groups:
            doc = await client[ns].groups.find_one({"_id": g})
            out[g] = int((doc or {}).get("seq") or 0)
        return out
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
